// SPDX-License-Identifier: BSD-3-Clause
// io_uring fixed buffers through the cache: each write goes out with IORING_OP_WRITE_FIXED from a
// buffer the cache registered. Between the writes the program maps new memory over the buffer;
// the cache learns it from the kernel and registers the new memory, so the file gets the new
// bytes. Exit 77 where io_uring's sparse buffer tables are missing (Linux < 5.19).
#define _GNU_SOURCE  // O_TMPFILE, MAP_ANONYMOUS
#include <fcntl.h>
#include <mrcache/backends.h>
#include <mrcache/mrcache.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { kLength = 256 * 1024 };

// Writes [buf, buf + kLength) to fd at offset through the cache's registration of it.
static int write_through_cache(mrc_cache_t *cache, mrc_iouring_ctx_t *ring, int fd, char *buf,
                               off_t offset) {
  mrc_region_t *region;
  if (mrc_get(cache, buf, kLength, MRC_PROT_READ, &region) != MRC_OK) {
    fprintf(stderr, "mrc_get: %s\n", mrc_last_error());
    return -1;
  }
  size_t done = 0;
  const mrc_status_t status = mrc_iouring_ctx_write_fixed(ring, mrc_region_handle(region), fd, buf,
                                                          kLength, (uint64_t)offset, &done);
  mrc_put(cache, region);
  if (status != MRC_OK || done != kLength) {
    fprintf(stderr, "write_fixed: %s\n", mrc_last_error());
    return -1;
  }
  return 0;
}

int main(void) {
  mrc_iouring_ctx_t *ring;
  const mrc_status_t made = mrc_iouring_ctx_create(NULL, &ring);  // a ring of its own
  if (made == MRC_ERR_UNSUPPORTED) {
    printf("skipped: %s\n", mrc_last_error());
    return 77;
  }
  if (made != MRC_OK) {
    fprintf(stderr, "mrc_iouring_ctx_create: %s\n", mrc_last_error());
    return 1;
  }
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = mrc_backend_iouring();
  params.backend_ctx = ring;
  mrc_cache_t *cache;
  if (mrc_cache_create(&params, &cache) != MRC_OK) {
    fprintf(stderr, "mrc_cache_create: %s\n", mrc_last_error());
    return 1;
  }
  const int fd = open("/tmp", O_TMPFILE | O_RDWR, 0600);
  char *buf = mmap(NULL, kLength, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (fd < 0 || buf == MAP_FAILED) {
    perror("open or mmap");
    return 1;
  }
  int failed = 0;
  static char back[kLength];
  for (int round = 0; round < 2; round++) {
    // New memory at the same address: what a registration cache exists to notice.
    if (round > 0 && mmap(buf, kLength, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != buf) {
      perror("mmap MAP_FIXED");
      return 1;
    }
    memset(buf, 'a' + round, kLength);
    if (write_through_cache(cache, ring, fd, buf, 0) != 0) return 1;
    if (pread(fd, back, kLength, 0) != kLength || memcmp(back, buf, kLength) != 0) {
      fprintf(stderr, "round %d: the file does not hold the buffer's bytes\n", round);
      failed = 1;
    }
  }
  mrc_stats_t stats;
  mrc_cache_stats(cache, &stats);
  printf("2 writes, %llu registrations, %llu invalidated by the kernel's unmap\n",
         (unsigned long long)stats.misses, (unsigned long long)stats.invalidations);
  munmap(buf, kLength);
  close(fd);
  if (mrc_cache_destroy(cache) != MRC_OK) failed = 1;
  mrc_iouring_ctx_destroy(ring);
  return failed;
}
