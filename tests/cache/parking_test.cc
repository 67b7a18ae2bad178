// SPDX-License-Identifier: BSD-3-Clause
// Parked references: a hot region's put keeps the reference in the thread's parking line (no
// locked instruction), and everything that needs the region unused — invalidation, an unmap,
// eviction, destroy — takes the parked references back first. White-box where the count itself
// is the behaviour (core/cache/cache.h), through the C API otherwise.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/epoch.h"
#include "cache_fixture.h"
#include "core/cache/cache.h"
#include "core/cache/testing.h"
#include "mrcache/mrcache.h"

namespace {

using mrc::test::kPage;
using mrc::test::map_pages;

// Enough hits to earn kParkable (Cache::kPromoteAfter is 8) with room to spare.
constexpr int kHotHits = 32;

mrc::Region *as_region(mrc_region_t *region) { return static_cast<mrc::Region *>(region); }

uint64_t references(mrc_region_t *region) {
  return as_region(region)->refcount.load(std::memory_order_acquire);
}

bool parkable(mrc_region_t *region) { return as_region(region)->has(mrc::Region::kParkable); }

// A thread that makes a region hot (and so leaves a parked reference behind), then either exits
// or stays alive until released.
class HotThread {
 public:
  HotThread(mrc_cache_t *cache, char *address, bool stay) {
    thread_ = std::thread([this, cache, address, stay] {
      for (int i = 0; i < kHotHits; ++i) {
        mrc_region_t *region = nullptr;
        if (mrc_get(cache, address, kPage, MRC_PROT_READ, &region) != MRC_OK) {
          failed_ = true;
          break;
        }
        mrc_put(cache, region);
      }
      std::unique_lock lock(mutex_);
      ready_ = true;
      cv_.notify_all();
      if (stay) cv_.wait(lock, [this] { return release_; });
    });
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return ready_; });
  }
  ~HotThread() { join(); }
  void join() {
    {
      std::lock_guard lock(mutex_);
      release_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool failed() const { return failed_; }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool ready_ = false, release_ = false;
  std::atomic<bool> failed_{false};
  std::thread thread_;
};

class CacheParking : public mrc::test::CacheFixture {
 protected:
  void SetUp() override {
    if (!mrc::test::monitor_caches()) {
      GTEST_SKIP() << "userfaultfd is unavailable here: nothing is cached, nothing parks";
    }
    ASSERT_EQ(create(backend.params("parking")), MRC_OK);
  }
  // mrc_invalidate with a done callback that counts its runs in *done.
  mrc_status_t invalidate_counting(mrc_region_t *region, std::atomic<int> *done) {
    return mrc_invalidate(
        cache, region, [](void *arg) { ++*static_cast<std::atomic<int> *>(arg); }, done);
  }
  // Gets and puts address kHotHits times; returns the region (not held).
  mrc_region_t *heat(char *address) {
    mrc_region_t *region = nullptr;
    for (int i = 0; i < kHotHits; ++i) {
      EXPECT_EQ(mrc_get(cache, address, kPage, MRC_PROT_READ, &region), MRC_OK);
      mrc_put(cache, region);
    }
    return region;
  }
};

TEST_F(CacheParking, AHotRegionsPutParksItsReference) {
  char *p = map_pages(1);
  mrc_region_t *region = heat(p);
  EXPECT_TRUE(parkable(region));
  EXPECT_EQ(references(region), 2u) << "the table's and the parked one";
  mrc_region_t *again = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &again), MRC_OK);
  EXPECT_EQ(again, region);
  EXPECT_EQ(references(region), 2u) << "the get took the parked reference back";
  mrc_put(cache, again);
  EXPECT_EQ(backend.regs, 1u);
  munmap(p, kPage);
}

TEST_F(CacheParking, ARegionUsedOnceIsNeverParked) {
  char *p = map_pages(1);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), MRC_OK);
  mrc_put(cache, region);
  EXPECT_FALSE(parkable(region));
  EXPECT_EQ(references(region), 1u);
  munmap(p, kPage);
}

TEST_F(CacheParking, InvalidatingARegionParkedByAnExitedThreadRunsDoneAtOnce) {
  char *p = map_pages(1);
  HotThread hot(cache, p, /*stay=*/false);
  hot.join();
  ASSERT_FALSE(hot.failed());
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), MRC_OK);
  ASSERT_TRUE(parkable(region));
  std::atomic<int> done{0};
  ASSERT_EQ(invalidate_counting(region, &done), MRC_OK);
  EXPECT_EQ(done.load(), 0) << "still held by this thread";
  mrc_put(cache, region);
  EXPECT_EQ(done.load(), 1) << "the exited thread's parked reference was taken back";
  EXPECT_EQ(backend.live_count(), 0u);
  munmap(p, kPage);
}

TEST_F(CacheParking, AnUnmapDeregistersARegionParkedByALiveThread) {
  char *p = map_pages(1);
  char *other = map_pages(1);
  HotThread hot(cache, p, /*stay=*/true);
  ASSERT_FALSE(hot.failed());
  ASSERT_EQ(backend.live_count(), 1u);
  ASSERT_EQ(munmap(p, kPage), 0);
  // Any slow path drains the unmap and must end the parked region's registration.
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, other, kPage, MRC_PROT_READ, &region), MRC_OK);
  mrc_put(cache, region);
  EXPECT_EQ(backend.live_count(), 1u) << "only the new registration is left";
  hot.join();
  munmap(other, kPage);
}

TEST_F(CacheParking, EvictionTakesParkedReferencesBackFromRegionsNoOneUses) {
  mrc_cache_params_t params = backend.params("parking-limit");
  params.max_regions = 2;
  ASSERT_EQ(create(params), MRC_OK);
  std::vector<char *> maps;
  for (int i = 0; i < 2; ++i) {
    maps.push_back(map_pages(2));
    ASSERT_TRUE(parkable(heat(maps.back())));
  }
  for (int i = 0; i < 3; ++i) {
    maps.push_back(map_pages(2));
    heat(maps.back());
  }
  const mrc_stats_t s = stats();
  EXPECT_LE(s.regions, 2u);
  EXPECT_GE(s.evictions, 3u);
  EXPECT_EQ(backend.live_count(), s.regions) << "evicted regions were deregistered";
  for (char *m : maps) munmap(m, 2 * kPage);
}

TEST_F(CacheParking, AFullLineReleasesTheReferenceItReplaces) {
  constexpr size_t kRegions = mrc::ParkingLine::kSlots + 2;
  std::vector<char *> maps;
  std::vector<mrc_region_t *> regions;
  for (size_t i = 0; i < kRegions; ++i) {
    maps.push_back(map_pages(2));  // a page apart from the next: no merging
    regions.push_back(heat(maps.back()));
  }
  size_t parked = 0;
  for (mrc_region_t *region : regions) {
    const uint64_t count = references(region);
    EXPECT_TRUE(count == 1 || count == 2) << count;
    parked += count - 1;
  }
  EXPECT_EQ(parked, mrc::ParkingLine::kSlots);
  for (char *m : maps) munmap(m, 2 * kPage);
}

// Holds a guard of the process's epoch domain (the one the cache's readers use) until released:
// whatever waits for readers waits for it.
class ReaderInside {
 public:
  ReaderInside() {
    thread_ = std::thread([this] {
      mrc::EpochGuard guard;
      inside_ = true;
      while (!release_) std::this_thread::sleep_for(std::chrono::microseconds(100));
    });
    while (!inside_) std::this_thread::yield();
  }
  ~ReaderInside() { release(); }
  void release() {
    release_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> inside_{false}, release_{false};
  std::thread thread_;
};

// Runs fn on a thread; true when it returned within `wait`.
template <class Fn>
bool finishes_within(std::chrono::milliseconds wait, std::thread &runner, Fn fn) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  runner = std::thread([fn, done] {
    fn();
    *done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!*done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return *done;
}

// One owner at first; a second thread that earns the region too makes every thread an owner,
// and an invalidation then takes back what both lines hold.
TEST_F(CacheParking, ASecondHotThreadSharesTheRegion) {
  char *p = map_pages(1);
  mrc_region_t *region = heat(p);  // this thread owns it
  ASSERT_EQ(references(region), 2u);
  std::thread lukewarm([&] {
    for (int i = 0; i < 4; ++i) {  // fewer hits than a promotion needs
      mrc_region_t *got = nullptr;
      ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &got), MRC_OK);
      mrc_put(cache, got);
    }
  });
  lukewarm.join();
  EXPECT_EQ(references(region), 2u) << "a thread that is not an owner parked";
  std::thread hot([&] { heat(p); });
  hot.join();
  EXPECT_EQ(references(region), 3u) << "the second hot thread parks too";
  std::atomic<int> done{0};
  ASSERT_EQ(invalidate_counting(region, &done), MRC_OK);
  EXPECT_EQ(done.load(), 1) << "both lines' references were taken back";
  munmap(p, kPage);
}

// The owner takes its own parked references back: no wait for readers (a reader stuck inside a
// guard elsewhere does not hold it up).
TEST_F(CacheParking, TheOwnersInvalidationDoesNotWaitForReaders) {
  char *p = map_pages(1);
  ReaderInside reader;
  std::atomic<int> done{0};
  std::thread runner;
  const bool finished = finishes_within(std::chrono::seconds(10), runner, [&] {
    mrc_region_t *region = heat(p);  // parked in the runner's line: the runner owns it
    EXPECT_EQ(invalidate_counting(region, &done), MRC_OK);
  });
  EXPECT_TRUE(finished) << "the owner waited for a reader";
  reader.release();  // lets a regressed runner finish
  runner.join();
  EXPECT_EQ(done.load(), 1);
  munmap(p, kPage);
}

// Any other thread must wait until no reader can still be taking the reference back.
TEST_F(CacheParking, AnotherThreadsInvalidationWaitsForReaders) {
  char *p = map_pages(1);
  HotThread owner(cache, p, /*stay=*/true);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), MRC_OK);
  mrc_put(cache, region);  // not ours to park: back to the count
  std::atomic<int> done{0};
  ReaderInside reader;
  std::thread runner;
  EXPECT_FALSE(finishes_within(std::chrono::milliseconds(100), runner, [&] {
    EXPECT_EQ(invalidate_counting(region, &done), MRC_OK);
  })) << "reclaimed a parked reference while a reader could still take it back";
  reader.release();
  runner.join();
  EXPECT_EQ(done.load(), 1);
  owner.join();
  munmap(p, kPage);
}

// Parked references are the cache's, not the application's: destroy takes them back instead of
// reporting the regions as still in use.
TEST_F(CacheParking, DestroyTakesEveryParkedReferenceBack) {
  static std::atomic<int> warnings{0};
  warnings = 0;
  std::vector<char *> maps;
  for (int i = 0; i < 3; ++i) {
    maps.push_back(map_pages(2));
    heat(maps.back());
  }
  HotThread hot(cache, maps[0], /*stay=*/true);
  mrc_set_log_handler(
      [](void *, mrc_log_level_t level, const char *) {
        if (level <= MRC_LOG_WARN) ++warnings;
      },
      nullptr);
  mrc_cache_destroy(cache);
  mrc_set_log_handler(nullptr, nullptr);
  cache = nullptr;
  EXPECT_EQ(warnings.load(), 0) << "destroy found regions in use";
  EXPECT_EQ(backend.live_count(), 0u);
  hot.join();
  for (char *m : maps) munmap(m, 2 * kPage);
}

// Hot regions held by several threads, parked, while their memory is taken away: each event
// unparks a region and marks every line for reclaim, and the next slow path's reclaim takes
// parked references out of lines whose owners are parking at that moment. Six regions for a
// line of four keep every put replacing a slot; the test control widens the moment between a
// put's reading of its full line and its choice of what to replace, where a reclaimer's emptying
// of a slot was read as a region to release. Each mode in turn, for a bounded time.
TEST_F(CacheParking, FullLinesParkWhileInvalidationsReclaimThem) {
  constexpr size_t kRegions = mrc::ParkingLine::kSlots + 2;
  struct WideWindow {
    WideWindow() { mrc::cache::testing::set_park_window_spins(20000); }
    ~WideWindow() { mrc::cache::testing::set_park_window_spins(0); }
  } wide_window;
  constexpr int kRunsOfHits = 10;  // more than a promotion needs in one run
  for (const unsigned flags : {0U, static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS)}) {
    SCOPED_TRACE(flags == 0 ? "exact" : "fast");
    mrc_cache_params_t params = backend.params("parking-reclaim");
    params.flags |= flags | MRC_FLAG_CACHE_CHURN;  // every region cached: every one parks
    ASSERT_EQ(create(params), MRC_OK);
    char *pages = map_pages(2 * kRegions);  // a page apart: no merging
    ASSERT_NE(pages, nullptr);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> gets{0}, failures{0};
    auto user = [&](size_t first) {
      for (size_t round = first; !stop.load(std::memory_order_relaxed); ++round) {
        char *page = pages + 2 * (round % kRegions) * kPage;
        for (int i = 0; i < kRunsOfHits; ++i) {
          mrc_region_t *region = nullptr;
          if (mrc_get(cache, page, kPage, MRC_PROT_READ, &region) != MRC_OK) {
            failures.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
          gets.fetch_add(1, std::memory_order_relaxed);
          mrc_put(cache, region);
        }
      }
    };
    std::thread first(user, 0), second(user, kRegions / 2);
    std::thread dropper([&] {
      for (size_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        madvise(pages + 2 * (i % kRegions) * kPage, kPage, MADV_DONTNEED);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    stop = true;
    first.join();
    second.join();
    dropper.join();
    EXPECT_EQ(failures.load(), 0u);
    EXPECT_GT(gets.load(), 0u);
    const mrc_stats_t s = stats();
    EXPECT_GT(s.invalidations, 0u) << "no event reached the cache: the path was not driven";
    ASSERT_EQ(mrc_cache_destroy(cache), MRC_OK);
    cache = nullptr;
    EXPECT_EQ(backend.live_count(), 0u);
    munmap(pages, 2 * kRegions * kPage);
  }
}

}  // namespace
