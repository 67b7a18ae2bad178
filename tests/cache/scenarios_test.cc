// SPDX-License-Identifier: BSD-3-Clause
// The cache's behaviour through the public C API, scenario by scenario (the ones UCX's rcache
// suite covers, and ours). A counting plugin backend observes every registration.
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/epoch.h"
#include "cache_fixture.h"
#include "mrcache/mrcache.h"
#include "mrcache/mrcache.hpp"
#include "uffd/testing.h"

namespace {

using mrc::test::CountingBackend;
using mrc::test::kPage;
using mrc::test::map_pages;
using mrc::test::monitor_caches;

class CacheTest : public mrc::test::CacheFixture {
 protected:
  void SetUp() override { ASSERT_EQ(create(backend.params()), MRC_OK); }
  uint64_t key_of(void *addr, size_t len, unsigned prot = MRC_PROT_READ | MRC_PROT_WRITE) {
    mrc_region_t *region = nullptr;
    EXPECT_EQ(mrc_get(cache, addr, len, prot, &region), MRC_OK);
    if (region == nullptr) return 0;
    uint64_t key = mrc_region_key(region);
    mrc_put(cache, region);
    return key;
  }
  void require_monitor() {
    if (!monitor_caches())
      GTEST_SKIP() << "userfaultfd is unavailable here: the cache runs uncached";
  }
};

TEST_F(CacheTest, GetCoversTheRequestAndHoldsAReference) {
  char *p = map_pages(4);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p + 100, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  EXPECT_LE(static_cast<char *>(mrc_region_start(region)), p + 100);
  EXPECT_GE(static_cast<char *>(mrc_region_start(region)) + mrc_region_length(region),
            p + 100 + 2 * kPage);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mrc_region_start(region)) % kPage, 0u);
  EXPECT_NE(mrc_region_handle(region), nullptr);
  EXPECT_EQ(mrc_region_key(region), mrc::test::registration_of(region)->serial);
  mrc_put(cache, region);
  EXPECT_EQ(backend.regs, 1u);
  munmap(p, 4 * kPage);
}

// Registering for membarrier (the epoch domain's light barrier) waits for an RCU grace period
// once the process has a second thread: milliseconds, which the first get must not pay. The
// cache's creation decides it, before the monitor's thread exists.
TEST_F(CacheTest, CreatingACacheChoosesTheEpochBarrierBeforeAnyGet) {
#if defined(MRC_TSAN)
  GTEST_SKIP() << "ThreadSanitizer builds always use fences";
#else
  const long commands = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (commands < 0 || (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) {
    GTEST_SKIP() << "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) unavailable on this kernel";
  }
  EXPECT_TRUE(mrc::epoch_domain().uses_membarrier());
#endif
}

TEST_F(CacheTest, SecondGetIsAHitWithTheSameRegistration) {
  require_monitor();
  char *p = map_pages(4);
  uint64_t first = key_of(p, 4 * kPage);
  uint64_t second = key_of(p + kPage, kPage);
  EXPECT_EQ(first, second);
  EXPECT_EQ(backend.regs, 1u);
  mrc_stats_t s = stats();
  EXPECT_EQ(s.gets, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits_fast + s.hits_slow, 1u);
  EXPECT_EQ(s.puts, 2u);
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(s.registered_bytes, 4 * kPage);
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, BadInputIsRejectedAndChangesNothing) {
  char *p = map_pages(1);
  mrc_region_t *region = nullptr;
  EXPECT_EQ(mrc_get(nullptr, p, kPage, MRC_PROT_READ, &region), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_get(cache, nullptr, kPage, MRC_PROT_READ, &region), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_get(cache, p, 0, MRC_PROT_READ, &region), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_get(cache, p, kPage, 0, &region), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_get(cache, p, kPage, 4, &region), MRC_ERR_INVALID);  // unknown prot bit
  EXPECT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, nullptr), MRC_ERR_INVALID);
  EXPECT_EQ(
      mrc_get(cache, reinterpret_cast<void *>(~uintptr_t{0} - 10), 100, MRC_PROT_READ, &region),
      MRC_ERR_INVALID);  // wraps around
  EXPECT_EQ(mrc_get_aligned(cache, p, kPage, 3 * kPage, MRC_PROT_READ, &region), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_invalidate(cache, nullptr, nullptr, nullptr), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_cache_stats(cache, nullptr), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_cache_create(nullptr, &cache), MRC_ERR_INVALID);
  mrc_cache_params_t params = backend.params();
  params.flags = 0x100;
  mrc_cache_t *other = nullptr;
  EXPECT_EQ(mrc_cache_create(&params, &other), MRC_ERR_INVALID);
  params = backend.params();
  params.alignment = 3000;
  EXPECT_EQ(mrc_cache_create(&params, &other), MRC_ERR_INVALID);
  EXPECT_EQ(other, nullptr);
  mrc_put(cache, nullptr);  // harmless
  EXPECT_EQ(backend.regs, 0u);
  mrc_stats_t s = stats();
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(s.misses, 0u);
  munmap(p, kPage);
}

TEST_F(CacheTest, PutToAnotherCacheIsRefusedAndChangesNothing) {
  char *p = map_pages(1);
  CountingBackend other_backend;
  mrc_cache_params_t params = other_backend.params("other");
  mrc_cache_t *other = nullptr;
  ASSERT_EQ(mrc_cache_create(&params, &other), MRC_OK);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), MRC_OK);
  ASSERT_EQ(mrc_invalidate(cache, region, nullptr, nullptr), MRC_OK);  // ours is the last reference
  mrc_set_log_handler([](void *, mrc_log_level_t, const char *) {}, nullptr);
  mrc_put(other, region);
  mrc_set_log_handler(nullptr, nullptr);
  mrc_stats_t s{};
  ASSERT_EQ(mrc_cache_stats(other, &s), MRC_OK);
  EXPECT_EQ(s.puts, 0u);
  EXPECT_EQ(backend.deregs, 0u) << "the reference is still held";
  mrc_put(cache, region);
  EXPECT_EQ(backend.deregs, 1u);
  mrc_cache_destroy(other);
  munmap(p, kPage);
}

TEST_F(CacheTest, MunmapInvalidatesAndTheNextGetRegistersAgain) {
  require_monitor();
  char *p = map_pages(8);
  uint64_t old_key = key_of(p, 8 * kPage);
  ASSERT_EQ(munmap(p, 8 * kPage), 0);
  ASSERT_EQ(map_pages(8, PROT_READ | PROT_WRITE, p), p);
  uint64_t new_key = key_of(p, 8 * kPage);
  EXPECT_NE(old_key, new_key);
  mrc_stats_t s = stats();
  EXPECT_GE(s.unmap_events, 1u);
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(backend.deregs, 1u);  // the old registration went away at once (it was unused)
  munmap(p, 8 * kPage);
}

TEST_F(CacheTest, EveryKindOfUnmapInvalidates) {
  require_monitor();
  struct Case {
    const char *name;
    void (*change)(char *p, size_t len);
  };
  const Case cases[] = {
      {"munmap one page inside",
       [](char *p, size_t) {
         munmap(p + kPage, kPage), (void)map_pages(1, PROT_READ | PROT_WRITE, p + kPage);
       }},
      {"madvise DONTNEED", [](char *p, size_t len) { madvise(p, len, MADV_DONTNEED); }},
      {"madvise FREE", [](char *p, size_t len) { madvise(p, len, MADV_FREE); }},
      {"MAP_FIXED over it",
       [](char *p, size_t len) { (void)map_pages(len / kPage, PROT_READ | PROT_WRITE, p); }},
      {"mremap shrink",
       [](char *p, size_t len) {
         (void)mremap(p, len, len - kPage, 0);
         (void)map_pages(1, PROT_READ | PROT_WRITE, p + len - kPage);
       }},
  };
  for (const Case &c : cases) {
    char *p = map_pages(4);
    uint64_t before = key_of(p, 4 * kPage);
    c.change(p, 4 * kPage);
    uint64_t after = key_of(p, 4 * kPage);
    EXPECT_NE(before, after) << c.name;
    munmap(p, 4 * kPage);
  }
}

TEST_F(CacheTest, MremapMoveInvalidatesTheOldAddress) {
  require_monitor();
  char *p = map_pages(4);
  char *target = map_pages(4);
  uint64_t before = key_of(p, 4 * kPage);
  ASSERT_EQ(mremap(p, 4 * kPage, 4 * kPage, MREMAP_MAYMOVE | MREMAP_FIXED, target), target);
  ASSERT_EQ(map_pages(4, PROT_READ | PROT_WRITE, p), p);
  EXPECT_NE(before, key_of(p, 4 * kPage));
  munmap(p, 4 * kPage);
  munmap(target, 4 * kPage);
}

TEST_F(CacheTest, OverlappingRequestsMergeIntoOneRegistration) {
  require_monitor();
  char *p = map_pages(8);
  mrc_region_t *a = nullptr;
  mrc_region_t *b = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 3 * kPage, MRC_PROT_READ, &a), MRC_OK);
  ASSERT_EQ(mrc_get(cache, p + 2 * kPage, 4 * kPage, MRC_PROT_READ, &b), MRC_OK);
  EXPECT_EQ(mrc_region_start(b), p);
  EXPECT_EQ(mrc_region_length(b), 6 * kPage);
  EXPECT_NE(mrc_region_key(a), mrc_region_key(b));
  // The merged-away region stays valid for its holder until the last put.
  EXPECT_EQ(mrc_region_length(a), 3 * kPage);
  EXPECT_EQ(backend.live_count(), 2u);
  const uint64_t merged_key = mrc_region_key(b);
  mrc_put(cache, a);
  EXPECT_EQ(backend.live_count(), 1u);
  mrc_put(cache, b);
  mrc_stats_t s = stats();
  EXPECT_EQ(s.merges, 1u);
  EXPECT_EQ(s.regions, 1u);
  // A request inside the merged region is a hit on it.
  EXPECT_EQ(key_of(p + kPage, kPage, MRC_PROT_READ), merged_key);
  munmap(p, 8 * kPage);
}

// Adjacent registrations stay apart, as in UCX and libfabric: merging them would register the
// first one's pages again for each neighbour registered after it (a buffer sent in chunks would
// be pinned once per chunk), and an unmap of either would end both. A get spanning both merges.
TEST_F(CacheTest, AdjacentRegionsStayApartUntilAGetSpansThem) {
  require_monitor();
  char *p = map_pages(4);
  const uint64_t first = key_of(p, kPage, MRC_PROT_READ);
  const uint64_t second = key_of(p + kPage, kPage, MRC_PROT_READ);
  EXPECT_NE(first, second);
  EXPECT_EQ(backend.regs.load(), 2u);
  EXPECT_EQ(stats().merges, 0u);
  EXPECT_EQ(stats().regions, 2u);
  EXPECT_EQ(key_of(p, kPage, MRC_PROT_READ), first);
  EXPECT_EQ(key_of(p + kPage, kPage, MRC_PROT_READ), second);
  EXPECT_EQ(backend.regs.load(), 2u);

  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  EXPECT_EQ(mrc_region_start(region), p);
  EXPECT_EQ(mrc_region_length(region), 2 * kPage);
  mrc_put(cache, region);
  EXPECT_EQ(stats().merges, 2u);
  EXPECT_EQ(stats().regions, 1u);
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, AlignedGetsAreAlignedAndMerge) {
  require_monitor();
  const size_t align = 16 * kPage;
  char *raw = map_pages(64);
  char *p = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(raw) + align - 1) & ~(align - 1));
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get_aligned(cache, p + 3 * kPage, kPage, align, MRC_PROT_READ, &region), MRC_OK);
  EXPECT_EQ(mrc_region_start(region), p);
  EXPECT_EQ(mrc_region_length(region), align);
  mrc_put(cache, region);
  ASSERT_EQ(mrc_get_aligned(cache, p + align - kPage, 2 * kPage, align, MRC_PROT_READ, &region),
            MRC_OK);
  EXPECT_EQ(mrc_region_start(region), p);
  EXPECT_EQ(mrc_region_length(region), 2 * align);
  mrc_put(cache, region);
  munmap(raw, 64 * kPage);
}

TEST_F(CacheTest, AnAlignedGetIsNeverServedByAnUnalignedRegion) {
  require_monitor();
  const size_t align = 16 * kPage;
  char *raw = map_pages(160);
  char *p = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(raw) + align - 1) & ~(align - 1));
  char *q = p + 4 * align;
  auto expect_aligned = [&](mrc_region_t *region, char *request, const char *path) {
    const auto start = reinterpret_cast<uintptr_t>(mrc_region_start(region));
    const uintptr_t end = start + mrc_region_length(region);
    EXPECT_EQ(start % align, 0u) << path;
    EXPECT_EQ(end % align, 0u) << path;
    EXPECT_LE(start, reinterpret_cast<uintptr_t>(request)) << path;
    EXPECT_GE(end, reinterpret_cast<uintptr_t>(request) + kPage) << path;
  };
  // Cached with the page alignment: [p, p+20 pages) starts aligned but does not end so.
  key_of(p, 20 * kPage, MRC_PROT_READ);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get_aligned(cache, p + kPage, kPage, align, MRC_PROT_READ, &region), MRC_OK);
  expect_aligned(region, p + kPage, "fast path");
  mrc_put(cache, region);
  // The same on the slow path: an unmap not yet drained keeps every get off the fast path.
  key_of(q, 20 * kPage, MRC_PROT_READ);
  char *scratch = map_pages(1);
  key_of(scratch, kPage, MRC_PROT_READ);
  mrc_stats_t before = stats();  // not after the unmap: reading the statistics drains it
  ASSERT_EQ(munmap(scratch, kPage), 0);
  ASSERT_EQ(mrc_get_aligned(cache, q, kPage, align, MRC_PROT_READ, &region), MRC_OK);
  mrc_stats_t after = stats();
  EXPECT_EQ(after.gets - after.hits_fast, before.gets - before.hits_fast + 1)
      << "the get took the fast path";
  expect_aligned(region, q, "slow path");
  mrc_put(cache, region);
  munmap(raw, 160 * kPage);
}

TEST_F(CacheTest, MergedRegistrationsAreWidenedToTheAlignment) {
  require_monitor();
  const size_t align = 16 * kPage;
  char *raw = map_pages(80);
  char *p = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(raw) + align - 1) & ~(align - 1));
  key_of(p + 15 * kPage, 3 * kPage, MRC_PROT_READ);  // [p+15, p+18 pages): across a boundary
  mrc_region_t *region = nullptr;
  // The request [p, p+16 pages) merges with it; the union must be rounded out to [p, p+32).
  ASSERT_EQ(mrc_get_aligned(cache, p + 2 * kPage, kPage, align, MRC_PROT_READ, &region), MRC_OK);
  EXPECT_EQ(mrc_region_start(region), p);
  EXPECT_EQ(mrc_region_length(region), 2 * align);
  EXPECT_EQ(mrc::test::registration_of(region)->length, 2 * align);
  mrc_put(cache, region);
  EXPECT_EQ(stats().merges, 1u);
  EXPECT_EQ(stats().regions, 1u);
  munmap(raw, 80 * kPage);
}

TEST_F(CacheTest, ProtectionWidensWhenTheMemoryAllowsIt) {
  require_monitor();
  char *p = map_pages(2);
  mrc_region_t *ro = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &ro), MRC_OK);
  EXPECT_EQ(mrc_region_prot(ro), unsigned{MRC_PROT_READ});
  mrc_region_t *rw = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ | MRC_PROT_WRITE, &rw), MRC_OK);
  EXPECT_EQ(mrc_region_prot(rw), unsigned{MRC_PROT_READ | MRC_PROT_WRITE});
  EXPECT_EQ(mrc_region_length(rw), 2 * kPage);  // merged with the read-only registration
  mrc_put(cache, ro);
  mrc_put(cache, rw);
  // A read request is now served by the read-write region.
  EXPECT_EQ(backend.regs, 2u);
  key_of(p, 2 * kPage, MRC_PROT_READ);
  EXPECT_EQ(backend.regs, 2u);
  munmap(p, 2 * kPage);
}

// A region whose memory would not allow the union's protection is not merged: it leaves the table
// (its holder keeps it) and the request is registered alone.
TEST_F(CacheTest, NoMergeWithAReadOnlyRegionWhenWriteIsAsked) {
  require_monitor();
  char *p = map_pages(4);
  ASSERT_EQ(mprotect(p, 2 * kPage, PROT_READ), 0);  // [p, p+2) read-only, [p+2, p+4) writable
  mrc_region_t *ro = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 3 * kPage, MRC_PROT_READ, &ro), MRC_OK);
  mrc_region_t *rw = nullptr;
  ASSERT_EQ(mrc_get(cache, p + 2 * kPage, 2 * kPage, MRC_PROT_READ | MRC_PROT_WRITE, &rw), MRC_OK);
  EXPECT_EQ(mrc_region_start(rw), p + 2 * kPage);
  EXPECT_EQ(mrc_region_length(rw), 2 * kPage);
  EXPECT_EQ(mrc_region_prot(ro), unsigned{MRC_PROT_READ});
  EXPECT_EQ(mrc_region_length(ro), 3 * kPage);
  EXPECT_EQ(backend.live_count(), 2u);
  mrc_put(cache, ro);
  EXPECT_EQ(backend.live_count(), 1u);  // it had left the table: its last put ended it
  mrc_put(cache, rw);
  EXPECT_EQ(stats().merges, 0u);
  EXPECT_EQ(stats().regions, 1u);
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, InvalidateWhileInUseCompletesAfterTheLastPut) {
  require_monitor();
  char *p = map_pages(2);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  int done = 0;
  ASSERT_EQ(mrc_invalidate(
                cache, region, [](void *arg) { ++*static_cast<int *>(arg); }, &done),
            MRC_OK);
  EXPECT_EQ(done, 0);
  EXPECT_EQ(backend.deregs, 0u);
  EXPECT_EQ(stats().regions, 0u);
  // Out of the cache: the next get registers anew.
  uint64_t other = key_of(p, 2 * kPage, MRC_PROT_READ);
  EXPECT_NE(other, mrc_region_key(region));
  mrc_put(cache, region);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(backend.deregs, 1u);
  munmap(p, 2 * kPage);
}

TEST_F(CacheTest, InvalidateUnusedRunsDoneAtOnce) {
  char *p = map_pages(1);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), MRC_OK);
  int done = 0;
  ASSERT_EQ(mrc_invalidate(
                cache, region, [](void *arg) { ++*static_cast<int *>(arg); }, &done),
            MRC_OK);
  mrc_put(cache, region);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(backend.live_count(), 0u);
  munmap(p, kPage);
}

TEST_F(CacheTest, FailedRegistrationIsRememberedUntilTheMemoryChanges) {
  require_monitor();
  char *p = map_pages(2);
  {
    std::lock_guard lock(backend.mutex);
    backend.failing_starts.insert(reinterpret_cast<uintptr_t>(p));
  }
  mrc_region_t *region = nullptr;
  EXPECT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_ERR_BACKEND);
  EXPECT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_ERR_BACKEND);
  EXPECT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), MRC_ERR_BACKEND);
  EXPECT_EQ(backend.failures, 1u) << "a retry storm reached the backend";
  mrc_stats_t s = stats();
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(s.registered_bytes, 0u);
  EXPECT_EQ(s.registrations, 0u);
  // New memory at the same address: the failure is forgotten and the backend asked again.
  ASSERT_EQ(map_pages(2, PROT_READ | PROT_WRITE, p), p);
  EXPECT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_ERR_BACKEND);
  EXPECT_EQ(backend.failures, 2u);
  {
    std::lock_guard lock(backend.mutex);
    backend.failing_starts.clear();
  }
  ASSERT_EQ(map_pages(2, PROT_READ | PROT_WRITE, p), p);
  ASSERT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  mrc_put(cache, region);
  munmap(p, 2 * kPage);
}

TEST_F(CacheTest, TransientRegistrationFailureIsNotRemembered) {
  require_monitor();
  char *p = map_pages(2);
  backend.fail_status = MRC_ERR_NO_MEMORY;  // RLIMIT_MEMLOCK reached, a full buffer table
  {
    std::lock_guard lock(backend.mutex);
    backend.failing_starts.insert(reinterpret_cast<uintptr_t>(p));
  }
  mrc_region_t *region = nullptr;
  EXPECT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_ERR_NO_MEMORY);
  EXPECT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_ERR_NO_MEMORY);
  EXPECT_EQ(backend.failures, 2u) << "the second get did not ask the backend again";
  EXPECT_EQ(stats().registration_failures, 2u);
  // The resource is back: the same memory registers at the next get.
  {
    std::lock_guard lock(backend.mutex);
    backend.failing_starts.clear();
  }
  ASSERT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  EXPECT_EQ(backend.regs, 1u);
  mrc_put(cache, region);
  EXPECT_EQ(stats().regions, 1u);
  munmap(p, 2 * kPage);
}

TEST_F(CacheTest, OnlyFailuresThatLastUntilTheMemoryChangesAreRemembered) {
  require_monitor();
  struct Case {
    mrc_status_t status;
    bool remembered;
  };
  const Case cases[] = {{MRC_ERR_INVALID, true}, {MRC_ERR_UNSUPPORTED, true},
                        {MRC_ERR_BACKEND, true}, {MRC_ERR_NO_MEMORY, false},
                        {MRC_ERR_BUSY, false},   {MRC_ERR_IO, false}};
  for (const Case &c : cases) {
    char *p = map_pages(1);
    backend.fail_status = c.status;
    {
      std::lock_guard lock(backend.mutex);
      backend.failing_starts.insert(reinterpret_cast<uintptr_t>(p));
    }
    const uint64_t before = backend.failures;
    mrc_region_t *region = nullptr;
    EXPECT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), c.status);
    EXPECT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), c.status);
    EXPECT_EQ(backend.failures - before, c.remembered ? 1u : 2u) << mrc_status_string(c.status);
    munmap(p, kPage);
  }
}

TEST_F(CacheTest, FailedMergedRegistrationFallsBackToTheRequestAlone) {
  require_monitor();
  char *p = map_pages(4);
  key_of(p + kPage, 2 * kPage, MRC_PROT_READ);  // cached: [p+1, p+3)
  {
    std::lock_guard lock(backend.mutex);
    backend.failing_starts.insert(reinterpret_cast<uintptr_t>(p + kPage));
  }
  // [p+2, p+4) overlaps it: the merge [p+1, p+4) fails, the request alone succeeds.
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p + 2 * kPage, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  EXPECT_EQ(mrc_region_start(region), p + 2 * kPage);
  EXPECT_EQ(mrc_region_length(region), 2 * kPage);
  EXPECT_EQ(backend.failures, 1u);
  mrc_put(cache, region);
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, LimitByCountEvictsUnusedNeverInUse) {
  require_monitor();
  mrc_cache_params_t params = backend.params();
  params.max_regions = 4;
  ASSERT_EQ(create(params), MRC_OK);
  std::vector<char *> maps;
  std::vector<mrc_region_t *> held;
  for (int i = 0; i < 6; ++i) {  // six in use: none may be evicted
    maps.push_back(map_pages(2));
    mrc_region_t *region = nullptr;
    ASSERT_EQ(mrc_get(cache, maps.back(), kPage, MRC_PROT_READ, &region), MRC_OK);
    held.push_back(region);
  }
  EXPECT_EQ(stats().evictions, 0u);
  EXPECT_EQ(backend.live_count(), 6u);
  for (mrc_region_t *region : held) mrc_put(cache, region);
  for (int i = 0; i < 10; ++i) {
    maps.push_back(map_pages(2));
    key_of(maps.back(), kPage, MRC_PROT_READ);
  }
  mrc_stats_t s = stats();
  EXPECT_LE(s.regions, 4u);
  EXPECT_GE(s.evictions, 12u);
  EXPECT_EQ(backend.live_count(), s.regions);
  for (char *m : maps) munmap(m, 2 * kPage);
}

TEST_F(CacheTest, LimitByBytes) {
  require_monitor();
  mrc_cache_params_t params = backend.params();
  params.max_bytes = 8 * kPage;
  ASSERT_EQ(create(params), MRC_OK);
  std::vector<char *> maps;
  for (int i = 0; i < 10; ++i) {
    maps.push_back(map_pages(4));
    key_of(maps.back(), 3 * kPage, MRC_PROT_READ);
    EXPECT_LE(stats().registered_bytes, 8 * kPage);
  }
  EXPECT_GT(stats().evictions, 0u);
  for (char *m : maps) munmap(m, 4 * kPage);
}

TEST_F(CacheTest, ReleasingEveryRegionTrimsTheCacheBackToItsCountBound) {
  require_monitor();
  mrc_cache_params_t params = backend.params();
  params.max_regions = 4;
  ASSERT_EQ(create(params), MRC_OK);
  std::vector<char *> maps;
  std::vector<mrc_region_t *> held;
  for (int i = 0; i < 6; ++i) {
    maps.push_back(map_pages(2));
    mrc_region_t *region = nullptr;
    ASSERT_EQ(mrc_get(cache, maps.back(), kPage, MRC_PROT_READ, &region), MRC_OK);
    held.push_back(region);
  }
  EXPECT_EQ(stats().regions, 6u) << "every region is in use: past the bound";
  // Hot enough to be promoted: its puts must not park it (a parked reference looks like a use).
  for (int i = 0; i < 32; ++i) key_of(maps[0], kPage, MRC_PROT_READ);
  for (mrc_region_t *region : held) mrc_put(cache, region);
  mrc_stats_t s = stats();
  EXPECT_EQ(s.regions, 4u) << "unused regions left past the bound";
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(backend.live_count(), 4u) << "the trimmed regions were not deregistered";
  for (char *m : maps) munmap(m, 2 * kPage);
}

TEST_F(CacheTest, ReleasingEveryRegionTrimsTheCacheBackToItsByteBound) {
  require_monitor();
  mrc_cache_params_t params = backend.params();
  params.max_bytes = 8 * kPage;
  ASSERT_EQ(create(params), MRC_OK);
  std::vector<char *> maps;
  std::vector<mrc_region_t *> held;
  for (int i = 0; i < 4; ++i) {
    maps.push_back(map_pages(4));
    mrc_region_t *region = nullptr;
    ASSERT_EQ(mrc_get(cache, maps.back(), 3 * kPage, MRC_PROT_READ, &region), MRC_OK);
    held.push_back(region);
  }
  EXPECT_EQ(stats().registered_bytes, 12 * kPage) << "every region is in use: past the bound";
  for (mrc_region_t *region : held) mrc_put(cache, region);
  EXPECT_LE(stats().registered_bytes, 8 * kPage) << "unused regions left past the bound";
  for (char *m : maps) munmap(m, 4 * kPage);
}

TEST_F(CacheTest, RecentlyUsedRegionsSurviveEviction) {
  require_monitor();
  mrc_cache_params_t params = backend.params();
  params.max_regions = 3;
  ASSERT_EQ(create(params), MRC_OK);
  char *hot = map_pages(2);
  uint64_t hot_key = key_of(hot, kPage, MRC_PROT_READ);
  std::vector<char *> maps;
  for (int i = 0; i < 8; ++i) {
    maps.push_back(map_pages(2));
    key_of(maps.back(), kPage, MRC_PROT_READ);
    EXPECT_EQ(key_of(hot, kPage, MRC_PROT_READ), hot_key) << "round " << i;
  }
  for (char *m : maps) munmap(m, 2 * kPage);
  munmap(hot, 2 * kPage);
}

TEST_F(CacheTest, MaxUnreleasedDefersAndBatchesDeregistration) {
  require_monitor();
  mrc_cache_params_t params = backend.params();
  params.max_unreleased = 4 * kPage;
  ASSERT_EQ(create(params), MRC_OK);
  std::vector<char *> maps;
  std::vector<mrc_region_t *> held;
  for (int i = 0; i < 3; ++i) {
    maps.push_back(map_pages(2));
    mrc_region_t *region = nullptr;
    ASSERT_EQ(mrc_get(cache, maps.back(), 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
    ASSERT_EQ(mrc_invalidate(cache, region, nullptr, nullptr), MRC_OK);
    held.push_back(region);
  }
  EXPECT_EQ(stats().unreleased_bytes, 6 * kPage) << "invalidated, all three still in use";
  mrc_put(cache, held[0]);
  mrc_put(cache, held[1]);
  EXPECT_EQ(backend.deregs, 0u) << "4 pages wait: not yet over the bound";
  EXPECT_EQ(stats().unreleased_bytes, 6 * kPage)
      << "4 pages released, 2 in use: none counted twice";
  mrc_put(cache, held[2]);
  EXPECT_EQ(backend.deregs, 3u) << "6 pages wait: over the bound, cleaned up";
  EXPECT_EQ(stats().unreleased_bytes, 0u);
  for (char *m : maps) munmap(m, 2 * kPage);
}

TEST_F(CacheTest, StatisticsAfterUnmap) {
  require_monitor();
  char *p = map_pages(4);
  key_of(p, 4 * kPage);
  munmap(p, 4 * kPage);
  char *q = map_pages(1);
  key_of(q, kPage);
  mrc_stats_t s = stats();
  EXPECT_GE(s.unmap_events, 1u);
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(s.registered_bytes, kPage);
  EXPECT_EQ(s.deregistrations, 1u);
  munmap(q, kPage);
}

TEST_F(CacheTest, StatisticsCountAnUnmapBeforeTheNextGet) {
  require_monitor();
  char *p = map_pages(4);
  key_of(p, 4 * kPage);
  ASSERT_EQ(munmap(p, 4 * kPage), 0);
  const mrc_stats_t s = stats();  // no get since the unmap
  EXPECT_GE(s.unmap_events, 1u);
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(s.registered_bytes, 0u);
  EXPECT_EQ(s.deregistrations, 1u);
  EXPECT_EQ(backend.live_count(), 0u);
}

TEST_F(CacheTest, StatisticsAsJson) {
  char *p = map_pages(4);
  key_of(p, 3 * kPage);
  char small[8];
  int needed = mrc_cache_stats_json(cache, small, sizeof small);
  ASSERT_GT(needed, 8);
  EXPECT_EQ(strlen(small), 7u);
  std::string json(static_cast<size_t>(needed) + 1, '\0');
  ASSERT_EQ(mrc_cache_stats_json(cache, json.data(), json.size()), needed);
  json.resize(static_cast<size_t>(needed));
  EXPECT_THAT(json, ::testing::HasSubstr("\"gets\":1"));
  EXPECT_THAT(json, ::testing::HasSubstr("\"misses\":1"));
  EXPECT_THAT(json,
              ::testing::HasSubstr("\"size_histogram\":{\"" + std::to_string(2 * kPage) + "\":1}"));
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, QueueStaysBoundedUnderManyUnmapCyclesWithoutCacheCalls) {
  require_monitor();
  // UCX's queue grew without bound in malloc/free loops that made no cache call.
  char *p = map_pages(4);
  uint64_t key = key_of(p, 4 * kPage);
  for (int i = 0; i < 40000; ++i) {
    ASSERT_EQ(map_pages(4, PROT_READ | PROT_WRITE, p), p);  // MAP_FIXED: an unmap event each time
  }
  EXPECT_NE(key_of(p, 4 * kPage), key);
  mrc_stats_t s = stats();
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(backend.live_count(), 1u);
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, SeveralCachesShareTheMonitor) {
  require_monitor();
  CountingBackend other_backend;
  mrc_cache_params_t params = other_backend.params("other");
  mrc_cache_t *other = nullptr;
  ASSERT_EQ(mrc_cache_create(&params, &other), MRC_OK);
  char *p = map_pages(2);
  uint64_t a = key_of(p, 2 * kPage);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(other, p, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  uint64_t b = mrc_region_key(region);
  mrc_put(other, region);
  ASSERT_EQ(map_pages(2, PROT_READ | PROT_WRITE, p), p);
  EXPECT_NE(key_of(p, 2 * kPage), a);
  ASSERT_EQ(mrc_get(other, p, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  EXPECT_NE(mrc_region_key(region), b);
  mrc_put(other, region);
  mrc_cache_destroy(other);
  EXPECT_EQ(other_backend.live_count(), 0u);
  munmap(p, 2 * kPage);
}

TEST_F(CacheTest, PurgeDeregistersUnusedAndLeavesInUseValid) {
  char *p = map_pages(4);
  key_of(p, kPage);
  mrc_region_t *held = nullptr;
  ASSERT_EQ(mrc_get(cache, p + 2 * kPage, kPage, MRC_PROT_READ, &held), MRC_OK);
  ASSERT_EQ(mrc_cache_purge(cache), MRC_OK);
  EXPECT_EQ(backend.live_count(), 1u);
  EXPECT_EQ(stats().regions, 0u);
  mrc_put(cache, held);
  EXPECT_EQ(backend.live_count(), 0u);
  munmap(p, 4 * kPage);
}

// Unwatching is batched with retirement; an explicit purge leaves no watch behind.
TEST_F(CacheTest, PurgeUnwatchesWhatItRemoved) {
  require_monitor();
  mrc::uffd::testing::set_idle_vmas(0);  // unregister a mapping as soon as its last watch goes
  ASSERT_EQ(create(backend.params()), MRC_OK);  // the only cache: the monitor restarts
  char *p = map_pages(4);
  key_of(p, kPage);
  mrc_monitor_info_t info;
  ASSERT_EQ(mrc_monitor_info(&info), MRC_OK);
  EXPECT_GT(info.watched_bytes, 0u);
  ASSERT_EQ(mrc_cache_purge(cache), MRC_OK);
  ASSERT_EQ(mrc_monitor_info(&info), MRC_OK);
  EXPECT_EQ(info.watched_bytes, 0u);
  mrc::uffd::testing::set_idle_vmas(-1);
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, DestroyDeregistersEverything) {
  char *p = map_pages(4);
  key_of(p, kPage);
  key_of(p + 2 * kPage, kPage);
  mrc_cache_destroy(cache);
  cache = nullptr;
  EXPECT_EQ(backend.live_count(), 0u);
  EXPECT_EQ(backend.regs, backend.deregs);
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, SharedRegionAcrossThreads) {
  require_monitor();
  char *p = map_pages(4);
  uint64_t key = key_of(p, 4 * kPage);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        mrc_region_t *region = nullptr;
        if (mrc_get(cache, p + (i % 4) * kPage, kPage, MRC_PROT_READ, &region) != MRC_OK ||
            mrc_region_key(region) != key) {
          ++wrong;
        }
        if (region != nullptr) mrc_put(cache, region);
      }
    });
  }
  for (auto &t : threads) t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(backend.regs, 1u);
  mrc_stats_t s = stats();
  EXPECT_EQ(s.gets, 40001u);
  EXPECT_EQ(s.puts, 40001u);
  munmap(p, 4 * kPage);
}

TEST_F(CacheTest, CppLayerReleasesOnScopeExit) {
  mrcache::Cache cxx;
  mrc_cache_params_t params = backend.params("cxx");
  ASSERT_EQ(cxx.open(&params), MRC_OK);
  char *p = map_pages(1);
  {
    mrcache::RegionRef ref;
    ASSERT_EQ(cxx.get(p, kPage, MRC_PROT_READ, &ref), MRC_OK);
    EXPECT_TRUE(ref);
    EXPECT_EQ(ref.start(), p);
    mrcache::RegionRef moved = std::move(ref);
    EXPECT_FALSE(ref);
    EXPECT_EQ(moved.length(), kPage);
    ASSERT_EQ(moved.invalidate(), MRC_OK);
    EXPECT_EQ(backend.live_count(), 1u);
  }
  EXPECT_EQ(backend.live_count(), 0u);
  mrc_stats_t s{};
  ASSERT_EQ(cxx.stats(&s), MRC_OK);
  EXPECT_EQ(s.puts, 1u);
  munmap(p, kPage);
}

TEST(CacheLogging, HandlerReceivesMessages) {
  static std::vector<std::string> messages;
  messages.clear();
  mrc_set_log_handler([](void *, mrc_log_level_t, const char *m) { messages.emplace_back(m); },
                      nullptr);
  mrc_set_log_level(MRC_LOG_DEBUG);
  CountingBackend backend;
  mrc_cache_params_t params = backend.params("logged");
  mrc_cache_t *cache = nullptr;
  ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK);
  mrc_cache_destroy(cache);
  mrc_set_log_level(MRC_LOG_WARN);
  mrc_set_log_handler(nullptr, nullptr);
  ASSERT_FALSE(messages.empty());
  EXPECT_THAT(messages.front(), ::testing::HasSubstr("logged"));
}

TEST(CacheStatus, StringsNameEveryStatus) {
  for (int s = 0; s >= -8; --s) {
    EXPECT_STRNE(mrc_status_string(static_cast<mrc_status_t>(s)), "unknown status");
  }
  EXPECT_STREQ(mrc_status_string(static_cast<mrc_status_t>(-99)), "unknown status");
}

}  // namespace
