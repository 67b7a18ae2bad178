// SPDX-License-Identifier: BSD-3-Clause
// fork: the child forgets inherited regions without deregistering them (the parent owns them);
// MRC_FLAG_PURGE_ON_FORK deregisters unused regions before the fork.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <thread>

#include "mrcache/mrcache.h"
#include "test_backend.h"

namespace {

using mrc::test::CountingBackend;
const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

bool cached_mode() {
  mrc_monitor_info_t info;
  return mrc_monitor_info(&info) == MRC_OK && info.mode != MRC_MONITOR_UNCACHED;
}

// Runs body in a child and returns its exit status (0 = every check passed).
template <class Body>
int in_child(Body body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A cache over a counting backend and four pages of private memory.
class CacheFork : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cached_mode()) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
    p = static_cast<char *>(
        mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(p, MAP_FAILED);
  }
  void TearDown() override {
    if (p != nullptr && p != MAP_FAILED) munmap(p, 4 * kPage);
  }
  void create(unsigned flags) {
    mrc_cache_params_t params = backend.params("fork");
    params.flags |= flags;
    ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK);
  }

  CountingBackend backend;
  mrc_cache_t *cache = nullptr;
  char *p = nullptr;
};

TEST_F(CacheFork, ChildForgetsInheritedRegionsWithoutDeregistering) {
  create(0);
  mrc_region_t *held = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &held), MRC_OK);
  const uint64_t parent_key = mrc_region_key(held);

  int child = in_child([&] {
    mrc_region_t *region = nullptr;
    if (mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &region) != MRC_OK) return 1;
    if (mrc_region_key(region) == parent_key) return 2;  // inherited registration reused
    if (backend.deregs != 0) return 3;                   // deregistered the parent's
    mrc_put(cache, region);
    mrc_put(cache, held);  // the inherited reference: freed, not deregistered
    if (backend.deregs != 0) return 4;
    // The child's own monitor works: an unmap in the child invalidates its new region.
    uint64_t child_key = 0;
    if (mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &region) != MRC_OK) return 5;
    child_key = mrc_region_key(region);
    mrc_put(cache, region);
    if (mmap(p, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
             0) != p)
      return 6;
    if (mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &region) != MRC_OK) return 7;
    if (mrc_region_key(region) == child_key) return 8;
    mrc_put(cache, region);
    mrc_cache_destroy(cache);
    return 0;
  });
  EXPECT_EQ(child, 0);
  // The parent is unaffected: same region, still cached.
  mrc_region_t *again = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &again), MRC_OK);
  EXPECT_EQ(mrc_region_key(again), parent_key);
  EXPECT_EQ(backend.deregs, 0u);
  mrc_put(cache, again);
  mrc_put(cache, held);
  mrc_cache_destroy(cache);
  EXPECT_EQ(backend.live_count(), 0u);
}

// The child's very first call puts an inherited region that was invalidated in the parent: no
// get has drained the child's queue yet, so only the fork handler can have marked it.
TEST_F(CacheFork, ChildsFirstPutOfAnInheritedRegionDoesNotDeregister) {
  create(0);
  mrc_region_t *held = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &held), MRC_OK);
  ASSERT_EQ(mrc_invalidate(cache, held, nullptr, nullptr), MRC_OK);  // ours is the last reference

  int child = in_child([&] {
    mrc_put(cache, held);
    return backend.deregs == 0 ? 0 : 1;
  });
  EXPECT_EQ(child, 0) << "the child deregistered a registration the parent owns";
  EXPECT_EQ(backend.deregs, 0u);
  mrc_put(cache, held);
  EXPECT_EQ(backend.deregs, 1u);
  mrc_cache_destroy(cache);
}

TEST_F(CacheFork, PurgeOnForkDeregistersUnusedRegionsFirst) {
  create(MRC_FLAG_PURGE_ON_FORK);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), MRC_OK);
  mrc_put(cache, region);
  mrc_region_t *held = nullptr;
  ASSERT_EQ(mrc_get(cache, p + 2 * kPage, kPage, MRC_PROT_READ, &held), MRC_OK);
  EXPECT_EQ(in_child([] { return 0; }), 0);
  EXPECT_EQ(backend.deregs, 1u) << "the unused region is deregistered before fork";
  EXPECT_EQ(backend.live_count(), 1u) << "the region in use stays registered";
  mrc_put(cache, held);
  mrc_cache_destroy(cache);
  EXPECT_EQ(backend.live_count(), 0u);
}

// Hot regions park references (core/cache/cache.h). Unused is unused, parked or not: purge-on-fork
// deregisters them, and a child forgets them (the parent's threads that parked them do not exist
// there) without deregistering.
TEST_F(CacheFork, ParkedReferencesAreUnusedForPurgeAndForgottenInTheChild) {
  create(MRC_FLAG_PURGE_ON_FORK);
  auto heat = [&](char *address) {
    for (int i = 0; i < 32; ++i) {
      mrc_region_t *region = nullptr;
      if (mrc_get(cache, address, kPage, MRC_PROT_READ, &region) != MRC_OK) return false;
      mrc_put(cache, region);
    }
    return true;
  };
  ASSERT_TRUE(heat(p));
  std::thread other([&] { EXPECT_TRUE(heat(p)); });
  other.join();
  EXPECT_EQ(in_child([&] {
              if (backend.deregs != 1) return 1;  // the parent's purge, before the fork
              if (!heat(p + 2 * kPage)) return 2;
              mrc_cache_destroy(cache);
              return backend.deregs == 2 && backend.live_count() == 0 ? 0 : 3;
            }),
            0);
  EXPECT_EQ(backend.deregs, 1u) << "the hot region was deregistered before the fork";
  EXPECT_EQ(backend.live_count(), 0u);
  // Hot again in the parent, then a child without purge-on-fork forgets it.
  mrc_cache_destroy(cache);
  create(0);
  ASSERT_TRUE(heat(p));
  const uint64_t regs = backend.regs;
  EXPECT_EQ(in_child([&] {
              const uint64_t deregs = backend.deregs;
              if (!heat(p)) return 1;  // registers anew: the inherited region is forgotten
              mrc_cache_destroy(cache);
              return backend.deregs == deregs + 1 ? 0 : 2;
            }),
            0);
  EXPECT_EQ(backend.regs, regs);
  mrc_region_t *again = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &again), MRC_OK);
  mrc_put(cache, again);
  EXPECT_EQ(backend.regs, regs) << "still cached in the parent";
  mrc_cache_destroy(cache);
  EXPECT_EQ(backend.live_count(), 0u);
}

}  // namespace
