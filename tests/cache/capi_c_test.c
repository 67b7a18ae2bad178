// SPDX-License-Identifier: BSD-3-Clause
/* The C API from C: a user plugin backend with designated initialisers, the null backend's
 * never-reused serial keys, and the contract's error codes. Returns 0 when every check holds. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mrcache/mrcache.h"

static int failures;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

struct plugin_state {
  unsigned regs, deregs;
};

static mrc_status_t plugin_reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                               uint64_t *key) {
  struct plugin_state *state = ctx;
  (void)len;
  (void)prot;
  *handle = addr;
  *key = 1000u + state->regs++;
  return MRC_OK;
}

static void plugin_dereg(void *ctx, void *handle) {
  struct plugin_state *state = ctx;
  (void)handle;
  state->deregs++;
}

static const mrc_backend_t plugin = {
    .struct_size = sizeof(mrc_backend_t),
    .name = "c-plugin",
    .reg = plugin_reg,
    .dereg = plugin_dereg,
};

int main(void) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char *p = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED);

  struct plugin_state state = {0, 0};
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = &plugin;
  params.backend_ctx = &state;
  mrc_cache_t *cache = NULL;
  CHECK(mrc_cache_create(&params, &cache) == MRC_OK);
  mrc_region_t *region = NULL;
  CHECK(mrc_get(cache, p, page, MRC_PROT_READ, &region) == MRC_OK);
  CHECK(mrc_region_key(region) == 1000u);
  CHECK(mrc_region_handle(region) == p);
  mrc_put(cache, region);
  CHECK(mrc_get(cache, p, 0, MRC_PROT_READ, &region) == MRC_ERR_INVALID);
  CHECK(mrc_get(cache, p, page, 8, &region) == MRC_ERR_INVALID);
  mrc_stats_t stats;
  CHECK(mrc_cache_stats(cache, &stats) == MRC_OK);
  CHECK(stats.gets == 1 && stats.puts == 1 && stats.registrations == 1);
  mrc_cache_destroy(cache);
  CHECK(state.regs == state.deregs);

  /* The null backend: keys are serial numbers, never reused, across caches. */
  mrc_cache_params_init(&params);
  CHECK(params.backend == mrc_backend_null());
  mrc_cache_t *a = NULL, *b = NULL;
  CHECK(mrc_cache_create(&params, &a) == MRC_OK);
  CHECK(mrc_cache_create(&params, &b) == MRC_OK);
  uint64_t last = 0;
  for (int i = 0; i < 4; ++i) {
    mrc_cache_t *c = (i % 2) ? a : b;
    CHECK(mrc_get(c, p + (size_t)i * page, page, MRC_PROT_READ, &region) == MRC_OK);
    CHECK(mrc_region_key(region) > last);
    last = mrc_region_key(region);
    CHECK(mrc_invalidate(c, region, NULL, NULL) == MRC_OK);
    mrc_put(c, region);
  }
  mrc_cache_destroy(a);
  mrc_cache_destroy(b);

  mrc_monitor_info_t info;
  CHECK(mrc_monitor_info(&info) == MRC_OK);
  CHECK(info.mode_name != NULL && strlen(info.mode_name) > 0);
  CHECK(strcmp(mrc_status_string(MRC_ERR_INVALID), mrc_status_string(MRC_OK)) != 0);
  munmap(p, 4 * page);
  if (failures == 0) printf("capi: all checks passed (monitor mode %s)\n", info.mode_name);
  return failures == 0 ? 0 : 1;
}
