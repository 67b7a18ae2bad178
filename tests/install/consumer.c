// SPDX-License-Identifier: BSD-3-Clause
/* A program from outside the project: it sees only the installed <mrcache/mrcache.h> and links
 * the installed libmrcache (shared or static). Built by install_test.sh through pkg-config and
 * through find_package(mrcache). Exit 0 when every check holds. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include <mrcache/mrcache.h>

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static int failures = 0;

#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                              \
    }                                                                          \
  } while (0)

/* get -> put -> get again on the same buffer with the null backend: the region covers the
 * request both times and the statistics count both gets and both puts. */
static void round_trip(void) {
  const size_t len = 64 * 1024;
  void *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT(buf != MAP_FAILED);
  if (buf == MAP_FAILED) return;
  memset(buf, 1, len);

  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.name = "install-consumer";
  params.backend = mrc_backend_null();
  mrc_cache_t *cache = NULL;
  mrc_status_t status = mrc_cache_create(&params, &cache);
  EXPECT(status == MRC_OK);
  if (status != MRC_OK) {
    fprintf(stderr, "mrc_cache_create: %s\n", mrc_status_string(status));
    munmap(buf, len);
    return;
  }

  for (int round = 0; round < 2; round++) {
    mrc_region_t *region = NULL;
    status = mrc_get(cache, buf, len, MRC_PROT_READ | MRC_PROT_WRITE, &region);
    EXPECT(status == MRC_OK);
    if (status != MRC_OK) break;
    char *start = (char *)mrc_region_start(region);
    EXPECT(start <= (char *)buf);
    EXPECT(start + mrc_region_length(region) >= (char *)buf + len);
    mrc_put(cache, region);
  }
  mrc_region_t *none = NULL;
  EXPECT(mrc_get(cache, buf, 0, MRC_PROT_READ, &none) == MRC_ERR_INVALID);

  mrc_stats_t stats;
  EXPECT(mrc_cache_stats(cache, &stats) == MRC_OK);
  EXPECT(stats.puts == 2);
  mrc_cache_destroy(cache);
  munmap(buf, len);
}

/* A plugin of the program's own, as the installed mrcache.h says to write one: a static table
 * that starts with its struct_size, completed by mrc_backend_complete and used by a cache. */
static unsigned plugin_regs;

static mrc_status_t plugin_reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                               uint64_t *key) {
  (void)ctx;
  (void)len;
  (void)prot;
  *handle = addr;
  *key = 0x1000u + ++plugin_regs;
  return MRC_OK;
}

static const mrc_backend_t plugin_ops = {
    .struct_size = sizeof(mrc_backend_t),
    .name = "install-plugin",
    .reg = plugin_reg,
};

static void plugin(void) {
  mrc_backend_t completed;
  EXPECT(mrc_backend_complete(&plugin_ops, &completed) == MRC_OK);
  EXPECT(completed.struct_size == sizeof completed && completed.dereg != NULL);
  const mrc_backend_t unsized = {.name = "no-size", .reg = plugin_reg};
  EXPECT(mrc_backend_complete(&unsized, &completed) == MRC_ERR_INVALID);

  static char buf[8192];
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = &plugin_ops;
  mrc_cache_t *cache = NULL;
  EXPECT(mrc_cache_create(&params, &cache) == MRC_OK);
  if (cache == NULL) return;
  mrc_region_t *region = NULL;
  EXPECT(mrc_get(cache, buf, sizeof buf, MRC_PROT_READ, &region) == MRC_OK);
  if (region != NULL) {
    EXPECT(mrc_region_key(region) == 0x1000u + plugin_regs);
    mrc_put(cache, region);
  }
  mrc_cache_destroy(cache);
  params.backend = &unsized;
  EXPECT(mrc_cache_create(&params, &cache) == MRC_ERR_INVALID);
}

int main(void) {
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", MRC_VERSION_MAJOR, MRC_VERSION_MINOR,
           MRC_VERSION_PATCH);
  EXPECT(strcmp(mrc_version(), expected) == 0);
  EXPECT(mrc_status_string(MRC_OK) != NULL);
  EXPECT(mrc_status_string(MRC_ERR_INVALID) != NULL);
  EXPECT(strcmp(mrc_status_string(MRC_OK), mrc_status_string(MRC_ERR_INVALID)) != 0);
  round_trip();
  plugin();
  const char *what = "version, status strings, get/put round trip, a sized plugin table";
  if (failures) {
    fprintf(stderr, "consumer (C): %d check(s) failed\n", failures);
    return 1;
  }
  printf("consumer (C) against mrcache %s: %s ok\n", mrc_version(), what);
  return 0;
}
