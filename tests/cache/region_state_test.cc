// SPDX-License-Identifier: BSD-3-Clause
// The life of a region (docs/DESIGN.md, "The life of a region"): each state of the table
// reached through the C API and the cache's testing hooks, with Region::state() asserted at each
// step. In a debug build every move on the way also checks the state it leaves (Region::expect),
// so these runs fail on a move the table does not have; the death tests show such a check fire.
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>

#include <gtest/gtest.h>

#include <atomic>
#include <ostream>
#include <utility>
#include <vector>

#include "base/epoch.h"
#include "cache_fixture.h"
#include "core/cache/region.h"
#include "core/cache/testing.h"

namespace mrc {

// gtest prints a RegionState by name in a failed assertion.
void PrintTo(RegionState state, std::ostream *os) {
  static constexpr const char *kNames[] = {"Free",     "Failed",      "Cached",   "Parkable",
                                           "Uncached", "Invalidated", "Deferred", "Batched",
                                           "Finished", "Retiring",    "Retired"};
  *os << kNames[static_cast<size_t>(state)];
}

namespace test {
namespace {

#ifdef NDEBUG
constexpr bool kDebug = false;
#else
constexpr bool kDebug = true;
#endif

const Region *region_of(const mrc_region_t *region) { return static_cast<const Region *>(region); }

bool ended(const Region *region) {
  return (region->refcount.load(std::memory_order_relaxed) & Region::kDead) != 0;
}

// Once the count ended (Deferred to Retired, and storage back in the pool) only a debug build
// tells the states apart (Region::state()); a release build can only check the count ended.
void expect_ended_in(const Region *region, RegionState state) {
  EXPECT_TRUE(ended(region)) << "the count of a region that should be past its last reference";
  if (kDebug) {
    EXPECT_EQ(region->state(), state);
  }
}

constexpr size_t kPages = 4;

class RegionStateTest : public CacheFixture {
 protected:
  void SetUp() override {
    if (!monitor_caches()) GTEST_SKIP() << "userfaultfd is unavailable here: nothing is cached";
  }
  void TearDown() override {
    CacheFixture::TearDown();
    for (char *p : mappings_) munmap(p, kPages * kPage);
  }
  // A cache that caches every miss (no churn learning in the way), within max_regions.
  void create_cache(size_t max_regions, size_t max_unreleased) {
    mrc_cache_params_t params = backend.params("state");
    params.flags |= MRC_FLAG_CACHE_CHURN;
    params.max_regions = max_regions;
    params.max_unreleased = max_unreleased;
    ASSERT_EQ(create(params), MRC_OK);
  }
  char *map() {
    char *p = map_pages(kPages);
    if (p != nullptr) mappings_.push_back(p);
    return p;
  }
  mrc_region_t *get(char *p) {
    mrc_region_t *region = nullptr;
    EXPECT_EQ(mrc_get(cache, p, kPages * kPage, MRC_PROT_READ, &region), MRC_OK);
    return region;
  }
  // A slow-path get of fresh memory, put at once.
  void miss() {
    char *p = map();
    ASSERT_NE(p, nullptr);
    mrc_region_t *region = get(p);
    ASSERT_NE(region, nullptr);
    mrc_put(cache, region);
  }

  std::vector<char *> mappings_;
};

TEST_F(RegionStateTest, ACachedRegionGoesThroughEveryStateOfItsLife) {
  create_cache(/*max_regions=*/1, /*max_unreleased=*/size_t{1} << 30);
  char *a_memory = map();
  ASSERT_NE(a_memory, nullptr);
  mrc_region_t *a = get(a_memory);
  ASSERT_NE(a, nullptr);
  const Region *region = region_of(a);
  EXPECT_EQ(region->state(), RegionState::Cached);  // Free -> Cached: register_locked
  mrc_put(cache, a);
  EXPECT_EQ(region->state(), RegionState::Cached);

  // Cached -> Parkable: promote, after kPromoteAfter (8) fast-path hits in a row.
  for (int i = 0; i < 12; ++i) {
    ASSERT_EQ(get(a_memory), a);
    mrc_put(cache, a);
  }
  ASSERT_EQ(region->state(), RegionState::Parkable) << "this thread's hits did not promote it";

  // Parkable -> Cached: unpark_all_locked, when eviction finds a parkable region in its way (a
  // second region past max_regions = 1; both are in use, so both stay).
  ASSERT_EQ(get(a_memory), a);
  char *b_memory = map();
  ASSERT_NE(b_memory, nullptr);
  mrc_region_t *b = get(b_memory);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(region->state(), RegionState::Cached);
  EXPECT_EQ(region_of(b)->state(), RegionState::Cached);

  // Cached -> Invalidated: remove_locked (mrc_invalidate), while this get still holds it.
  ASSERT_EQ(mrc_invalidate(cache, a, nullptr, nullptr), MRC_OK);
  EXPECT_EQ(region->state(), RegionState::Invalidated);
  EXPECT_FALSE(ended(region));

  // Invalidated -> Batched: its last put, with max_unreleased set (release_last).
  mrc_put(cache, a);
  expect_ended_in(region, RegionState::Batched);
  mrc_put(cache, b);

  // Batched -> Finished: a slow-path get that drained (get_slow, finish_dereg_batch).
  miss();
  expect_ended_in(region, RegionState::Finished);
  EXPECT_EQ(stats().unreleased_bytes, 0u);

  // Finished -> Retiring: every kReapEvery-th (8th) slow-path get (reap_finished_locked).
  for (int i = 0; i < 8 && !(kDebug && region->state() == RegionState::Retiring); ++i) miss();
  expect_ended_in(region, RegionState::Retiring);

  // Retiring -> Retired: a purge retires the batch (Retirement::retire_batch).
  ASSERT_EQ(mrc_cache_purge(cache), MRC_OK);
  expect_ended_in(region, RegionState::Retired);

  // Retired -> Free: the epoch domain's reclaim (recycle_regions).
  epoch_domain().synchronize();
  expect_ended_in(region, RegionState::Free);

  // Free -> Cached again: the storage serves a new registration (RegionPool::allocate).
  miss();
  char *c_memory = map();
  ASSERT_NE(c_memory, nullptr);
  mrc_region_t *c = get(c_memory);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(region_of(c)->state(), RegionState::Cached);
  mrc_put(cache, c);
}

TEST_F(RegionStateTest, ARememberedFailureIsFailedUntilItsMemoryChanges) {
  create_cache(/*max_regions=*/0, /*max_unreleased=*/0);
  char *p = map();
  ASSERT_NE(p, nullptr);
  backend.fail_status = MRC_ERR_BACKEND;  // lasts until the memory changes: remembered
  backend.fail_all = true;
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPages * kPage, MRC_PROT_READ, &region), MRC_ERR_BACKEND);
  backend.fail_all = false;
  // Free -> Failed: register_locked.
  const Region *failed = cache::testing::table_entry(cache, reinterpret_cast<uintptr_t>(p));
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->state(), RegionState::Failed);
  EXPECT_EQ(failed->refcount.load(), 1u);  // the table's
  // Still Failed: the memory has not changed.
  EXPECT_EQ(mrc_get(cache, p, kPages * kPage, MRC_PROT_READ, &region), MRC_ERR_BACKEND);
  EXPECT_EQ(failed->state(), RegionState::Failed);

  // Failed -> Invalidated -> Deferred -> Finished: the unmap's event, drained by the next slow
  // path (remove_locked drops the only reference; finished after the unlock).
  ASSERT_EQ(munmap(p, kPages * kPage), 0);
  mappings_.erase(mappings_.begin());
  miss();
  expect_ended_in(failed, RegionState::Finished);
}

TEST_F(RegionStateTest, ARangeTheMonitorCannotWatchIsUncached) {
  create_cache(/*max_regions=*/0, /*max_unreleased=*/0);
  // SysV shared memory is never watched (uffd::watch: NotMonitorable): registered uncached.
  const int id = shmget(IPC_PRIVATE, kPages * kPage, IPC_CREAT | 0600);
  if (id < 0) GTEST_SKIP() << "no SysV shared memory here";
  void *shm = shmat(id, nullptr, 0);
  shmctl(id, IPC_RMID, nullptr);
  ASSERT_NE(shm, reinterpret_cast<void *>(-1));
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, shm, kPages * kPage, MRC_PROT_READ, &region), MRC_OK);
  const Region *uncached = region_of(region);
  EXPECT_EQ(uncached->state(), RegionState::Uncached);  // Free -> Uncached: register_locked
  // Uncached -> Finished: its put (release_last, finish), no batch without max_unreleased.
  mrc_put(cache, region);
  expect_ended_in(uncached, RegionState::Finished);
  shmdt(shm);
}

// A backend whose reg puts a region: a put from inside reg runs under the cache's lock, where
// the region's end is deferred (release_last), and seen from the reg.
struct PuttingBackend {
  PuttingBackend() {
    ops.struct_size = sizeof ops;
    ops.name = "putting";
    ops.reg = &reg;
    ops.dereg = &dereg;
  }
  static mrc_status_t reg(void *ctx, void *, size_t, unsigned, void **handle, uint64_t *key) {
    auto *self = static_cast<PuttingBackend *>(ctx);
    if (mrc_region_t *region = std::exchange(self->to_put, nullptr); region != nullptr) {
      mrc_put(self->cache, region);
      self->ended_in_reg = ended(region_of(region));
      self->seen_in_reg = region_of(region)->state();
    }
    self->live.fetch_add(1);
    *handle = self;
    *key = 1;
    return MRC_OK;
  }
  static void dereg(void *ctx, void *) { static_cast<PuttingBackend *>(ctx)->live.fetch_sub(1); }

  mrc_backend_t ops{};
  mrc_cache_t *cache = nullptr;
  mrc_region_t *to_put = nullptr;
  bool ended_in_reg = false;
  RegionState seen_in_reg = RegionState::Free;
  std::atomic<int> live{0};
};

TEST(RegionStateDeferred, ALastPutFromInsideRegIsDeferredThenFinished) {
  if (!monitor_caches()) GTEST_SKIP() << "userfaultfd is unavailable here: nothing is cached";
  PuttingBackend backend;
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.name = "deferred";
  params.backend = &backend.ops;
  params.backend_ctx = &backend;
  params.flags |= MRC_FLAG_CACHE_CHURN;
  ASSERT_EQ(mrc_cache_create(&params, &backend.cache), MRC_OK);
  char *a_memory = map_pages(kPages);
  char *b_memory = map_pages(kPages);
  ASSERT_NE(a_memory, nullptr);
  ASSERT_NE(b_memory, nullptr);
  mrc_region_t *a = nullptr;
  ASSERT_EQ(mrc_get(backend.cache, a_memory, kPages * kPage, MRC_PROT_READ, &a), MRC_OK);
  const Region *region = region_of(a);
  ASSERT_EQ(mrc_invalidate(backend.cache, a, nullptr, nullptr), MRC_OK);
  EXPECT_EQ(region->state(), RegionState::Invalidated);
  // Invalidated -> Deferred: the put inside b's reg; Deferred -> Finished after the unlock.
  backend.to_put = a;
  mrc_region_t *b = nullptr;
  ASSERT_EQ(mrc_get(backend.cache, b_memory, kPages * kPage, MRC_PROT_READ, &b), MRC_OK);
  EXPECT_TRUE(backend.ended_in_reg);
  if (kDebug) {
    EXPECT_EQ(backend.seen_in_reg, RegionState::Deferred);
  }
  expect_ended_in(region, RegionState::Finished);
  mrc_put(backend.cache, b);
  ASSERT_EQ(mrc_cache_destroy(backend.cache), MRC_OK);
  EXPECT_EQ(backend.live.load(), 0);
  munmap(a_memory, kPages * kPage);
  munmap(b_memory, kPages * kPage);
}

// Region alone: what state() reads from each row's marks.
TEST(RegionStateAlone, StateIsReadFromTheMarksOfEachRow) {
  Region region{};
  EXPECT_EQ(region.state(), RegionState::Free);
  region.flags.store(Region::kFailed | Region::kInTable | Region::kWatched);
  region.refcount.store(1);
  EXPECT_EQ(region.state(), RegionState::Failed);
  region.flags.store(Region::kFailed | Region::kInvalid | Region::kWatched);
  EXPECT_EQ(region.state(), RegionState::Invalidated);
  region.flags.store(Region::kRegistered | Region::kInTable | Region::kWatched);
  region.refcount.store(2);
  EXPECT_EQ(region.state(), RegionState::Cached);
  region.change_flags(Region::kParkable | (3U << Region::kOwnerShift));
  EXPECT_EQ(region.state(), RegionState::Parkable);
  region.change_flags(Region::kInvalid | Region::kUnreleased,
                      Region::kInTable | Region::kParkable | Region::kOwnerMask);
  EXPECT_EQ(region.state(), RegionState::Invalidated);
  region.flags.store(Region::kRegistered | Region::kUncached | Region::kInvalid);
  region.refcount.store(1);
  EXPECT_EQ(region.state(), RegionState::Uncached);
  // The count ended: a debug build follows the moves the flags do not show.
  region.refcount.store(Region::kDead);
  for (const RegionState state : {RegionState::Deferred, RegionState::Finished,
                                  RegionState::Retiring, RegionState::Retired, RegionState::Free}) {
    region.enter(state);
    EXPECT_EQ(region.state(), kDebug ? state : RegionState::Uncached);
  }
  region.reset();
  EXPECT_EQ(region.state(), RegionState::Free);
}

TEST(RegionStateDeathTest, AMoveTheTableDoesNotHaveAborts) {
  if (!kDebug) GTEST_SKIP() << "the transition checks compile to nothing under NDEBUG";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Region region{};
  region.flags.store(Region::kRegistered | Region::kInTable | Region::kWatched);
  region.refcount.store(2);
  // A cached region cannot be finished: its count has not ended.
  EXPECT_DEATH(region.expect({RegionState::Deferred, RegionState::Batched}),
               "internal check failed: region in state Cached");
  EXPECT_DEATH(region.enter(RegionState::Deferred), "internal check failed");
  region.expect({RegionState::Cached, RegionState::Parkable});  // the move promote makes: fine
}

}  // namespace
}  // namespace test
}  // namespace mrc
