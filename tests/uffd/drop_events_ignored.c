// SPDX-License-Identifier: BSD-3-Clause
/* MRC_TEST_DROP_EVENTS=1 in the environment of a program linked against libmrcache alone (not a
 * test program): the library must ignore it. It used to read the variable itself, so a variable
 * left set made the release library hand out stale registrations silently. Run by
 * ctest with the variable set; exit 77 = skipped (no userfaultfd here). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mrcache/mrcache.h"

static int fail(const char *what) {
  fprintf(stderr, "FAIL: %s\n", what);
  return 1;
}

static uint64_t key_of(mrc_cache_t *cache, void *addr, size_t len, int *ok) {
  mrc_region_t *region = NULL;
  if (mrc_get(cache, addr, len, MRC_PROT_READ, &region) != MRC_OK) {
    *ok = 0;
    return 0;
  }
  uint64_t key = mrc_region_key(region);
  mrc_put(cache, region);
  return key;
}

int main(void) {
  const char *value = getenv("MRC_TEST_DROP_EVENTS");
  if (value == NULL || strcmp(value, "1") != 0) return fail("run with MRC_TEST_DROP_EVENTS=1");
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  mrc_cache_t *cache = NULL;
  if (mrc_cache_create(&params, &cache) != MRC_OK) return fail(mrc_last_error());
  mrc_monitor_info_t info;
  if (mrc_monitor_info(&info) != MRC_OK) return fail("mrc_monitor_info");
  if (info.mode == MRC_MONITOR_UNCACHED) {
    printf("SKIP: the monitor runs uncached (%s): nothing is cached, nothing can go stale\n",
           info.reason);
    mrc_cache_destroy(cache);
    return 77;
  }
  const size_t len = 4 * (size_t)sysconf(_SC_PAGESIZE);
  char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail("mmap");
  memset(p, 1, len);
  int ok = 1;
  const uint64_t first = key_of(cache, p, len, &ok);
  if (!ok) return fail(mrc_last_error());
  if (munmap(p, len) != 0) return fail("munmap");
  /* New memory at the same address: a cache that saw the unmap registers it again. */
  char *q = mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                 -1, 0);
  if (q != p) {
    printf("SKIP: the address was taken again before the test could map it\n");
    mrc_cache_destroy(cache);
    return 77;
  }
  memset(q, 2, len);
  const uint64_t second = key_of(cache, q, len, &ok);
  if (!ok) return fail(mrc_last_error());
  if (mrc_monitor_info(&info) != MRC_OK) return fail("mrc_monitor_info");
  mrc_cache_destroy(cache);
  munmap(q, len);
  if (second == first) {
    return fail(
        "stale registration: libmrcache honoured MRC_TEST_DROP_EVENTS and missed the unmap");
  }
  if (strstr(info.reason, "TEST SWITCH") != NULL) return fail(info.reason);
  printf("ok: a new registration after the unmap (key %llu, then %llu)\n",
         (unsigned long long)first, (unsigned long long)second);
  return 0;
}
