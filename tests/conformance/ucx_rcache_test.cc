// SPDX-License-Identifier: BSD-3-Clause
// UCX's rcache suite (test/gtest/ucs/test_rcache.cc), its single-threaded scenarios, in the terms
// of mrcache's C API. UCX's region id is our key (the counting backend's serial); its
// `num_regions` and stats counters are mrc_cache_stats fields. The multithreaded scenarios are
// in ucx_rcache_mt_test.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "conformance.h"

namespace conformance {
namespace {

// UCX's engine refuses memory whose protection does not allow the request; so does ours here.
class UcxRcache : public Conformance {
 protected:
  void SetUp() override {
    backend.check_protection(true);
    Conformance::SetUp();
  }
};

// UCX test_rcache_with_limit: UCX's limits are 2 regions and 1000 bytes, with regions of 32 and
// 600 bytes. Ours are whole pages, so the byte limit scales to 10 pages and the sizes to 1 and 6
// pages: as there, the count limit binds for the small regions and the byte limit for the large.
class UcxRcacheWithLimit : public UcxRcache {
 protected:
  static constexpr size_t kMaxRegions = 2;
  static size_t max_bytes() { return 10 * kPage; }
  void SetUp() override {
    UcxRcache::SetUp();
    if (IsSkipped()) return;
    mrc_cache_params_t params = backend.params("with-limit");
    params.max_regions = kMaxRegions;
    params.max_bytes = max_bytes();
    ASSERT_EQ(create(params), MRC_OK);
  }
};

TEST(UcxRcacheBasic, CreationWithMalformedParametersFailsAndCreatesNothing) {
  // UCX test_rcache_basic.create_fail: UCX asks for a memory event that does not exist; the
  // nearest malformed request here is an alignment that is not a power of two, or params that
  // mrc_cache_params_init marked as coming from a malformed environment.
  CountingBackend backend;
  mrc_cache_params_t params = backend.params();
  params.alignment = 3 * kPage;
  mrc_cache_t *cache = nullptr;
  EXPECT_EQ(mrc_cache_create(&params, &cache), MRC_ERR_INVALID);
  EXPECT_EQ(cache, nullptr);
  params = backend.params();
  params.env_status = MRC_ERR_INVALID;
  EXPECT_NE(mrc_cache_create(&params, &cache), MRC_OK);
  EXPECT_EQ(cache, nullptr);
  EXPECT_EQ(backend.attempts(), 0u);
}

TEST(UcxRcacheBasic, ACacheIsCreatedAndDestroyedWithoutEverRegistering) {
  // UCX test_rcache_basic.create_destroy.
  CountingBackend backend;
  mrc_cache_params_t params = backend.params();
  mrc_cache_t *cache = nullptr;
  ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK);
  ASSERT_NE(cache, nullptr);
  mrc_cache_destroy(cache);
  EXPECT_EQ(backend.attempts(), 0u);
  EXPECT_EQ(backend.deregs(), 0u);
}

TEST_F(UcxRcache, PutsMixedWithInvalidationsRunEveryCompletionOnceAfterTheLastPut) {
  // UCX test_rcache.put_and_invalidate (one thread): N gets of one buffer, then N puts with an
  // invalidation before every other one; after an invalidation a get must not return the
  // invalidated region, and each completion runs once, only after the last put.
  static const size_t size = 1024 * 1024;
  char *ptr = static_cast<char *>(std::malloc(size));
  ASSERT_NE(ptr, nullptr);
  size_t completions = 0;
  auto done = [](void *arg) { ++*static_cast<size_t *>(arg); };
  for (size_t gets = 1; gets < 100; ++gets) {
    completions = 0;
    std::vector<mrc_region_t *> regions;
    for (size_t i = 0; i < gets; ++i) regions.push_back(get(ptr, size));
    for (size_t i = 0; i < gets; ++i) {
      ASSERT_EQ(completions, 0u) << "a completion ran before the last put";
      mrc_region_t *region = regions.back();
      if (i % 2 == 0) {
        ASSERT_EQ(mrc_invalidate(cache, region, done, &completions), MRC_OK);
        mrc_region_t *again = get(ptr, size);
        EXPECT_NE(key(again), key(region)) << "an invalidated region was handed out again";
        put(again);
      }
      put(region);
      regions.pop_back();
    }
    EXPECT_EQ(completions, (gets + 1) / 2) << gets << " gets";
  }
  std::free(ptr);
}

TEST_F(UcxRcache, RequestsThatOnlyTouchKeepARegistrationEach) {
  // UCX test_rcache.merge keeps region1 and region2 apart across its pad; UCX and libfabric merge
  // only overlapping regions, and so does mrcache: a merge registers the union again.
  char *mem = alloc_pages(4 * kPage);
  const uint64_t left = get_put(mem, 2 * kPage);
  mrc_region_t *right = get(mem + 2 * kPage, 2 * kPage);
  EXPECT_NE(key(right), left);
  EXPECT_EQ(mrc_region_start(right), mem + 2 * kPage);
  EXPECT_EQ(mrc_region_length(right), 2 * kPage);
  put(right);
  const mrc_stats_t s = stats();
  EXPECT_EQ(s.merges, 0u);
  EXPECT_EQ(s.regions, 2u);
  EXPECT_EQ(backend.live(), 2u);
  EXPECT_EQ(get_put(mem, kPage), left) << "the left range is served by its own registration";
  free_pages(mem, 4 * kPage);
}

TEST_F(UcxRcache, AnUnmapOfOneOfTwoTouchingMappingsLeavesTheOthersRegistration) {
  // Two mappings that touch (a private and a shared one, so the kernel keeps two VMAs), each
  // registered: replacing the right one ends its registration only.
  char *area = alloc_pages(4 * kPage);
  ASSERT_EQ(mmap(area + 2 * kPage, 2 * kPage, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
            area + 2 * kPage);
  const uint64_t left = get_put(area, 2 * kPage);
  const uint64_t right = get_put(area + 2 * kPage, 2 * kPage);
  ASSERT_EQ(mmap(area + 2 * kPage, 2 * kPage, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
            area + 2 * kPage);
  EXPECT_NE(get_put(area + 2 * kPage, kPage), right) << "replacing the right mapping kept it";
  EXPECT_EQ(get_put(area, kPage), left) << "replacing the right mapping ended the left one's";
  free_pages(area, 4 * kPage);
}

TEST_F(UcxRcache, AnAlignedGetMergesItsNeighboursIntoOneAlignedRegistration) {
  // UCX test_rcache.merge_aligned. KNOWN BUG (fails today): the aligned get of region3's range
  // is a fast hit on the unaligned region3 instead of an aligned registration. Regions 2 and 3
  // touch and stay apart, as in UCX.
  //   pages 0-4 region1, 5-9 region2, 9-13 region3; aligned to 8 pages: one region 0-16.
  const size_t size = 4 * kPage;
  const size_t align = 8 * kPage;
  const size_t total = 16 * kPage;
  void *raw = nullptr;
  ASSERT_EQ(posix_memalign(&raw, align, total), 0);
  char *mem = static_cast<char *>(raw);
  std::memset(mem, 0, total);
  mrc_region_t *region1 = get(mem, size);
  mrc_region_t *region2 = get(mem + 5 * kPage, size);
  mrc_region_t *region3 = get(mem + 9 * kPage, size);
  mrc_region_t *region3_2 = get(mem + 9 * kPage, size, kRW, align);
  ASSERT_NE(region3_2, nullptr);
  EXPECT_NE(key(region3_2), key(region3)) << "the aligned get returned the unaligned region";
  EXPECT_EQ(addr(mrc_region_start(region3_2)), addr(mem));
  EXPECT_EQ(region_end(region3_2), addr(mem) + total);
  mrc_region_t *region1_2 = get(mem, size);
  mrc_region_t *region2_2 = get(mem + 5 * kPage, size);
  EXPECT_EQ(key(region2_2), key(region3_2)) << "region2's range is in the merged region";
  EXPECT_EQ(key(region1_2), key(region3_2)) << "region1's range is in the merged region";
  for (mrc_region_t *r : {region1_2, region2_2, region3_2, region1, region2, region3}) put(r);
  std::free(mem);
}

TEST_F(UcxRcacheWithLimit, TheCountLimitEvictsTheRegionNotUsedSinceTheOthers) {
  // UCX test_rcache_with_limit.by_count, on three separate pages (regions of 32 bytes in
  // neighbouring malloc chunks would share one page here).
  char *mem = alloc_pages(5 * kPage);
  char *ptr1 = mem;
  char *ptr2 = mem + 2 * kPage;
  char *ptr3 = mem + 4 * kPage;
  const uint64_t region1_id = get_put(ptr1, 32);
  EXPECT_EQ(stats().regions, 1u);
  const uint64_t region2_id = get_put(ptr2, 32);
  EXPECT_EQ(stats().regions, 2u);
  const uint64_t region3_id = get_put(ptr3, 32);
  EXPECT_EQ(stats().regions, 2u) << "the third region must push one out";
  EXPECT_EQ(get_put(ptr2, 32), region2_id) << "the second region is kept";
  EXPECT_EQ(stats().regions, 2u);
  EXPECT_EQ(get_put(ptr3, 32), region3_id) << "the third region is kept";
  EXPECT_EQ(stats().regions, 2u);
  EXPECT_NE(get_put(ptr1, 32), region1_id) << "the first region was the one evicted";
  EXPECT_EQ(stats().regions, 2u);
  free_pages(mem, 5 * kPage);
}

TEST_F(UcxRcacheWithLimit, TheByteLimitEvictsTheOlderRegion) {
  // UCX test_rcache_with_limit.by_size.
  const size_t size = 6 * kPage;
  char *ptr1 = alloc_pages(size);
  char *ptr2 = alloc_pages(size);
  get_put(ptr1, size);
  EXPECT_EQ(stats().regions, 1u);
  get_put(ptr2, size);
  EXPECT_EQ(stats().regions, 1u) << "two regions exceed the byte limit";
  EXPECT_LE(stats().registered_bytes, max_bytes());
  free_pages(ptr2, size);
  free_pages(ptr1, size);
}

TEST_F(UcxRcacheWithLimit, TheByteLimitNeverEvictsARegionInUse) {
  // UCX test_rcache_with_limit.by_size_inuse.
  const size_t size = 6 * kPage;
  char *ptr1 = alloc_pages(size);
  char *ptr2 = alloc_pages(size);
  mrc_region_t *region1 = get(ptr1, size);
  EXPECT_EQ(stats().regions, 1u);
  // DIFFERENCE: UCX keeps ptr2's region past the limit until a later registration; mrcache
  // trims back to the bound at the put that leaves the excess unused, so ptr2's region goes at
  // once and the region in use stays.
  const uint64_t key2 = get_put(ptr2, size);
  EXPECT_EQ(stats().regions, 1u) << "the unused region past the limit was trimmed at its put";
  EXPECT_FALSE(backend.is_live(key2));
  EXPECT_TRUE(backend.is_live(key(region1))) << "the region in use stays";
  put(region1);
  free_pages(ptr2, size);
  free_pages(ptr1, size);
}

TEST_F(UcxRcacheWithLimit, TheByteLimitHoldsAgainOnceTheRegionsInUseAreReleased) {
  // UCX test_rcache_with_limit.by_size_inuse, carried on past its end. KNOWN BUG (fails today):
  // after the last region is released the cache stays over max_bytes until a later miss.
  const size_t size = 6 * kPage;
  char *ptr1 = alloc_pages(size);
  char *ptr2 = alloc_pages(size);
  mrc_region_t *region1 = get(ptr1, size);
  get_put(ptr2, size);
  put(region1);
  const mrc_stats_t s = stats();
  EXPECT_LE(s.registered_bytes, max_bytes()) << "nothing in use, still over the byte limit";
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(backend.live(), 1u);
  free_pages(ptr2, size);
  free_pages(ptr1, size);
}

TEST_F(UcxRcache, StatisticsCountGetsHitsMissesAndPuts) {
  // UCX test_rcache_stats.basic.
  static const size_t size = 4096;
  void *ptr = std::malloc(size);
  ASSERT_NE(ptr, nullptr);
  mrc_region_t *r1 = get(ptr, size);
  mrc_stats_t s = stats();
  EXPECT_EQ(s.gets, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.registrations, 1u);
  mrc_region_t *r2 = get(ptr, size);
  s = stats();
  EXPECT_EQ(s.gets, 2u);
  EXPECT_EQ(s.hits_fast, 1u);
  EXPECT_EQ(s.misses, 1u);
  put(r1);
  s = stats();
  EXPECT_EQ(s.gets, 2u);
  EXPECT_EQ(s.puts, 1u);
  put(r2);
  s = stats();
  EXPECT_EQ(s.gets, 2u);
  EXPECT_EQ(s.puts, 2u);
  std::free(ptr);  // a free that unmaps nothing: no event, no deregistration
  s = stats();
  EXPECT_EQ(s.gets, 2u);
  EXPECT_EQ(s.puts, 2u);
  EXPECT_EQ(s.deregistrations, 0u);
  EXPECT_EQ(s.unmap_events, 0u);
}

TEST_F(UcxRcache, StatisticsCountAnUnmapAsSoonAsTheUnmapReturns) {
  // UCX test_rcache_stats.unmap_dereg. KNOWN BUG (fails today): unmap_events and invalidations
  // read 0 until the next slow path applies the event.
  static const size_t size = 1024 * 1024;
  char *mem = alloc_pages(size);
  get_put(mem, size);
  free_pages(mem, size);
  mrc_stats_t s = stats();
  EXPECT_GE(s.unmap_events, 1u) << "the unmap returned, its event was read";
  EXPECT_EQ(s.invalidations, 1u) << "the unmap returned, its region is invalid";
  // The next get deregisters it at the latest.
  mem = alloc_pages(size);
  get_put(mem, size);
  s = stats();
  EXPECT_GE(s.unmap_events, 1u);
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.deregistrations, 1u);
  free_pages(mem, size);
}

TEST_F(UcxRcache, StatisticsCountAMergeOfOverlappingRequests) {
  // UCX test_rcache_stats.merge.
  static const size_t size = 1024 * 1024;
  char *mem = alloc_pages(size);
  mrc_region_t *r1 = get(mem, 8192);
  mrc_region_t *r2 = get(mem + 4096, 8192);
  const mrc_stats_t s = stats();
  EXPECT_EQ(s.merges, 1u);
  EXPECT_EQ(s.gets, 2u);
  EXPECT_EQ(s.misses, 2u);
  put(r1);
  put(r2);
  free_pages(mem, size);
}

TEST_F(UcxRcache, AGetWhileAnUnmapEventIsPendingIsASlowHit) {
  // UCX test_rcache_stats.hits_slow. UCX holds its page-table lock around the munmap to keep the
  // event queued; mrcache always queues events for the next slow path, so no lock is needed.
  // The statistics are read only after the get (reading them must not change the path).
  static const size_t size = 1024 * 1024;
  char *mem1 = alloc_pages(size);
  get_put(mem1, size);
  char *mem2 = alloc_pages(size);
  mrc_region_t *r1 = get(mem2, size);
  free_pages(mem1, size);
  mrc_region_t *r2 = get(mem2, size);
  EXPECT_EQ(key(r2), key(r1));
  const mrc_stats_t s = stats();
  EXPECT_EQ(s.hits_slow, 1u) << "a pending event sends the get down the slow path";
  EXPECT_EQ(s.gets, 3u);
  EXPECT_EQ(s.puts, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.unmap_events, 1u);
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.deregistrations, 1u);
  put(r1);
  put(r2);
  free_pages(mem2, size);
}

long rss_kib() {
  FILE *status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, status) != nullptr) {
    if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  }
  std::fclose(status);
  return kib;
}

TEST_F(UcxRcache, ManyUnmapCyclesWithoutCacheCallsKeepMemoryBounded) {
  // UCX test_rcache_inv_q_growth.inv_q_bounded_with_interval_tree: 40,000 munmap + mmap cycles
  // of a registered page with no cache call between them; the process must not grow (UCX's
  // invalidation queue once did) and one get afterwards sees the memory as new. The queue
  // itself is not visible through the C API; tests/cache has the same scenario with MAP_FIXED.
  const size_t size = kPage;
  void *ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ptr, MAP_FAILED);
  const uint64_t first = get_put(ptr, size);
  const long rss_before = rss_kib();
  ASSERT_NE(rss_before, -1);
  for (int i = 0; i < 40000; ++i) {
    munmap(ptr, size);
    ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(ptr, MAP_FAILED);
  }
  const long rss_after = rss_kib();
  EXPECT_LE(rss_after - rss_before, 512) << "KiB grown over the cycles";
  EXPECT_NE(get_put(ptr, size), first);
  const mrc_stats_t s = stats();
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(backend.live(), 1u);
  munmap(ptr, size);
}

}  // namespace
}  // namespace conformance
