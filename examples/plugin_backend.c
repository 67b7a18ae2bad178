// SPDX-License-Identifier: BSD-3-Clause
// A registration engine of your own under the cache: this one pins pages with mlock, as a NIC
// driver pins them for DMA. The cache calls reg once per range it caches, and dereg when the
// registration ends: at destroy, or once the memory under it was unmapped and the last
// reference is put. Register the same buffer, replace the memory under it, register again.
#define _GNU_SOURCE  // MAP_ANONYMOUS
#include <errno.h>
#include <mrcache/backends.h>
#include <mrcache/mrcache.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
  void *addr;
  size_t len;
  uint64_t key;
} pinning_t;

typedef struct {
  unsigned regs, deregs;
  uint64_t next_key;
} engine_t;

static mrc_status_t pin_reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                            uint64_t *key) {
  (void)prot;  // mlock pins for both; a NIC would pass prot to its access flags
  engine_t *engine = ctx;
  pinning_t *pinning = malloc(sizeof *pinning);
  if (pinning == NULL) return MRC_ERR_NO_MEMORY;
  if (mlock(addr, len) != 0) {
    const int error = errno;
    free(pinning);
    // Say why (mrc_last_error), and whether it may pass: a resource that may come back is
    // retried at the next get, a refusal of this memory is remembered until the memory changes.
    mrc_backend_set_error("pin", "mlock: %s", strerror(error));
    return error == ENOMEM || error == EAGAIN ? MRC_ERR_NO_MEMORY : MRC_ERR_BACKEND;
  }
  *pinning = (pinning_t){addr, len, ++engine->next_key};
  *handle = pinning;
  *key = pinning->key;
  engine->regs++;
  return MRC_OK;
}

static void pin_dereg(void *ctx, void *handle) {
  engine_t *engine = ctx;
  pinning_t *pinning = handle;
  (void)munlock(pinning->addr, pinning->len);  // ENOMEM once the memory is gone: nothing pinned
  free(pinning);
  engine->deregs++;
}

static int pin_describe(void *ctx, void *handle, char *buf, size_t len) {
  (void)ctx;
  const pinning_t *pinning = handle;
  return snprintf(buf, len, "pinned %zu bytes at %p, key %llu", pinning->len, pinning->addr,
                  (unsigned long long)pinning->key);
}

static const mrc_backend_t pin_backend = {.struct_size = sizeof(mrc_backend_t),
                                          .name = "pin",
                                          .reg = pin_reg,
                                          .dereg = pin_dereg,
                                          .describe = pin_describe};

static int send_once(mrc_cache_t *cache, char *buf, size_t len) {
  mrc_region_t *region;
  if (mrc_get(cache, buf, len, MRC_PROT_READ, &region) != MRC_OK) {
    fprintf(stderr, "mrc_get: %s\n", mrc_last_error());
    return -1;
  }
  char text[96];
  pin_describe(NULL, mrc_region_handle(region), text, sizeof text);
  printf("send from %p: %s\n", (void *)buf, text);
  mrc_put(cache, region);
  return 0;
}

int main(void) {
  engine_t engine = {0, 0, 0};
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = &pin_backend;
  params.backend_ctx = &engine;
  mrc_cache_t *cache;
  if (mrc_cache_create(&params, &cache) != MRC_OK) {
    fprintf(stderr, "mrc_cache_create: %s\n", mrc_last_error());
    return 1;
  }
  const size_t len = 64 * 1024;
  char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) return 1;
  if (send_once(cache, buf, len) != 0 || send_once(cache, buf, len) != 0) return 1;  // one reg
  // New memory at the same address: the old pinning is stale and the next get pins again.
  if (mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
      buf) {
    return 1;
  }
  if (send_once(cache, buf, len) != 0) return 1;
  mrc_monitor_info_t monitor;
  mrc_monitor_info(&monitor);
  const unsigned expected = monitor.mode == MRC_MONITOR_UNCACHED ? 3 : 2;
  const int destroyed = mrc_cache_destroy(cache) == MRC_OK;
  munmap(buf, len);
  printf("%u registrations (%s monitor), %u deregistrations\n", engine.regs, monitor.mode_name,
         engine.deregs);
  return destroyed && engine.regs == expected && engine.deregs == engine.regs ? 0 : 1;
}
