// SPDX-License-Identifier: BSD-3-Clause
// Where mrcache deliberately differs from UCX's rcache and libfabric's MR cache: each test pins
// mrcache's behaviour and names the peers' (the smaller differences are pinned beside the
// scenario they change, in ucx_rcache_*.cc and libfabric_test.cc).
#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

#include "conformance.h"

namespace conformance {
namespace {

using Differences = Conformance;

TEST_F(Differences, EvictionGivesEveryUsedRegionASecondChanceInsteadOfExactLruOrder) {
  // UCX test_rcache_with_limit.by_count (its lru list) and libfabric ofi_mr_cache_flush (its
  // lru_list) evict the region released longest ago. DIFFERENCE: mrcache's eviction is CLOCK
  // (second chance): a hit only sets a bit, and the hand evicts the first unused region whose
  // bit it already cleared. With A and B both hit since they were cached, the hand clears both
  // and comes back to A: A goes, although B was released before A (exact LRU would evict B).
  mrc_cache_params_t params = backend.params("clock");
  params.max_regions = 2;
  ASSERT_EQ(create(params), MRC_OK);
  char *mem = alloc_pages(5 * kPage);
  char *a = mem;
  char *b = mem + 2 * kPage;
  char *c = mem + 4 * kPage;
  const uint64_t key_a = get_put(a, kPage);
  const uint64_t key_b = get_put(b, kPage);
  EXPECT_EQ(get_put(b, kPage), key_b);
  EXPECT_EQ(get_put(a, kPage), key_a);  // A is now the most recently used
  get_put(c, kPage);
  EXPECT_EQ(stats().evictions, 1u);
  EXPECT_FALSE(backend.is_live(key_a)) << "CLOCK evicts A, the most recently used";
  EXPECT_TRUE(backend.is_live(key_b)) << "exact LRU would have evicted B";
  EXPECT_EQ(get_put(b, kPage), key_b);
  free_pages(mem, 5 * kPage);
}

uint64_t physical_page(const void *p) {
  const int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) return 0;
  uint64_t entry = 0;
  const bool ok = pread(fd, &entry, sizeof entry,
                        static_cast<off_t>(addr(p) / kPage * sizeof entry)) == sizeof entry;
  close(fd);
  if (!ok || (entry & (uint64_t{1} << 63)) == 0) return 0;
  return entry & ((uint64_t{1} << 55) - 1);  // 0 without CAP_SYS_ADMIN
}

// Cached anonymous memory, then a System V segment attached over it with SHM_REMAP.
class ShmRemap : public Conformance {
 protected:
  static constexpr size_t kSize = 4 * 4096;
  void TearDown() override {
    if (remapped_) shmdt(mem_);
    free_pages(mem_, kSize);
    Conformance::TearDown();
  }
  // Private anonymous pages holding 'a', cached by a get.
  uint64_t map_and_cache() {
    mem_ = alloc_pages(kSize);
    std::memset(mem_, 'a', kSize);
    return get_put(mem_, kSize);
  }
  // Attaches a fresh segment over the pages (SHM_REMAP) and writes 'b' in it; false when System
  // V shared memory is unavailable.
  bool remap_segment() {
    const int id = shmget(IPC_PRIVATE, kSize, IPC_CREAT | 0600);
    if (id < 0) return false;
    void *p = shmat(id, mem_, SHM_REMAP);
    shmctl(id, IPC_RMID, nullptr);  // removed at its last detach
    if (p != mem_) return false;
    remapped_ = true;
    std::memset(mem_, 'b', kSize);
    return true;
  }
  char *mem_ = nullptr;
  bool remapped_ = false;
};

TEST_F(ShmRemap, ShmatRemapOverCachedMemorySendsNoEventSoTheOldRegistrationIsServed) {
  // No peer scenario (UCX's and libfabric's memory hooks see the shmat call and invalidate its
  // range). DIFFERENCE, pinned as it is today: the kernel's do_shmat replaces the mapping
  // without an unmap list, so userfaultfd sends no UNMAP event, and a get after
  // shmat(SHM_REMAP) over cached memory returns the old registration, of pages that are no
  // longer mapped there. (A get of System V memory itself is never cached: shmdt sends no event
  // either, so the monitor refuses to watch it.)
  const uint64_t old_key = map_and_cache();
  if (!remap_segment()) GTEST_SKIP() << "System V shared memory is unavailable";
  ASSERT_EQ(mem_[0], 'b') << "the pages are the segment's";
  const uint64_t new_key = get_put(mem_, kSize);
  EXPECT_EQ(new_key, old_key) << "today the registration of the replaced pages is served";
  EXPECT_EQ(stats().invalidations, 0u) << "no event arrived";
  EXPECT_EQ(backend.regs(), 1u);
}

TEST_F(ShmRemap, WithPageFrameVerificationTheRemappedMemoryIsRegisteredAgain) {
  // libfabric util_mr_cache.c, ofi_mr_cache_search: a hit must also pass the monitor's valid()
  // check (its device monitors compare buffer ids). mrcache's counterpart is
  // MRC_FLAG_VERIFY_PFN, which compares the registered page frames on each hit; it catches the
  // shmat(SHM_REMAP) replacement that sends no event.
  mrc_cache_params_t params = backend.params("verify-pfn");
  params.flags |= MRC_FLAG_VERIFY_PFN;
  params.verify_pfn_pages = kSize / kPage;
  ASSERT_EQ(create(params), MRC_OK);
  const uint64_t old_key = map_and_cache();
  if (physical_page(mem_) == 0) {
    GTEST_SKIP() << "page frames are not readable here (/proc/self/pagemap needs "
                    "CAP_SYS_ADMIN)";
  }
  if (!remap_segment()) GTEST_SKIP() << "System V shared memory is unavailable";
  EXPECT_NE(get_put(mem_, kSize), old_key) << "the page frames changed";
  EXPECT_GE(stats().pfn_mismatches, 1u);
}

}  // namespace
}  // namespace conformance
