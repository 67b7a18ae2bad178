// SPDX-License-Identifier: BSD-3-Clause
/* A small program for valgrind: the first cache, a get, a munmap under a cached region, a get of
 * new memory, destroy. Under valgrind the monitor thread and valgrind's global lock used to
 * deadlock at the first cache; the library now detects valgrind and picks a mode that
 * works, saying why in one log line and in mrc_monitor_info's reason. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mrcache/mrcache.h"

static int fail(const char *what) {
  fprintf(stderr, "FAIL: %s: %s\n", what, mrc_last_error());
  return 1;
}

int main(void) {
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  mrc_cache_t *cache = NULL;
  if (mrc_cache_create(&params, &cache) != MRC_OK) return fail("mrc_cache_create");
  const size_t len = 4 * (size_t)sysconf(_SC_PAGESIZE);
  for (int round = 0; round < 4; ++round) {
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return fail("mmap");
    memset(p, round, len);
    for (int i = 0; i < 3; ++i) {
      mrc_region_t *region = NULL;
      if (mrc_get(cache, p, len, MRC_PROT_READ, &region) != MRC_OK) return fail("mrc_get");
      mrc_put(cache, region);
    }
    if (munmap(p, len) != 0) return fail("munmap");
  }
  mrc_stats_t stats;
  if (mrc_cache_stats(cache, &stats) != MRC_OK) return fail("mrc_cache_stats");
  mrc_monitor_info_t info;
  if (mrc_monitor_info(&info) != MRC_OK) return fail("mrc_monitor_info");
  printf("monitor %s (%s); %llu gets, %llu registrations\n", info.mode_name, info.reason,
         (unsigned long long)stats.gets, (unsigned long long)stats.registrations);
  mrc_cache_destroy(cache);
  printf("done\n");
  return 0;
}
