// SPDX-License-Identifier: BSD-3-Clause
// The smallest use of the cache: register a buffer through it, use the key, put it back.
#include <mrcache/mrcache.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);       // defaults, then the MRC_* environment variables
  params.backend = mrc_backend_null();  // a registration engine: null, iouring, verbs or yours
  mrc_cache_t *cache;
  if (mrc_cache_create(&params, &cache) != MRC_OK) {
    fprintf(stderr, "mrc_cache_create: %s\n", mrc_last_error());
    return 1;
  }
  char *buf = malloc(1 << 20);
  for (int message = 0; message < 3; message++) {
    mrc_region_t *region;
    if (mrc_get(cache, buf, 1 << 20, MRC_PROT_READ | MRC_PROT_WRITE, &region) != MRC_OK) {
      fprintf(stderr, "mrc_get: %s\n", mrc_last_error());
      return 1;
    }
    // Hand mrc_region_key(region) to the NIC or the ring; the second get on is a hit.
    printf("message %d: key %#llx\n", message, (unsigned long long)mrc_region_key(region));
    mrc_put(cache, region);
  }
  free(buf);
  mrc_stats_t stats;
  mrc_cache_stats(cache, &stats);
  const unsigned long long hits = stats.hits_fast + stats.hits_slow;
  printf("hits %llu, misses %llu\n", hits, (unsigned long long)stats.misses);
  return mrc_cache_destroy(cache) == MRC_OK && hits == 2 ? 0 : 1;
}
