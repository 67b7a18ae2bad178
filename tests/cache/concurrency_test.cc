// SPDX-License-Identifier: BSD-3-Clause
// The invariant under contention: after an unmap returns, no get started afterwards returns the
// old registration. Mutators count each change of a slot's memory twice: `started` before the
// syscall, `completed` after it returned. The backend records `started` at registration. A
// worker reads `completed` (G) before its get; a registration that recorded started < G was
// made before the G-th change began, so it maps replaced memory: returning it is stale use.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "mrcache/mrcache.h"
#include "test_backend.h"

namespace {

using mrc::test::CountingBackend;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr size_t kSlots = 8;
constexpr size_t kSlotPages = 4;  // plus one PROT_NONE guard page so slots never merge

struct Slot {
  char *base = nullptr;
  std::atomic<uint64_t> started{0};
  std::atomic<uint64_t> completed{0};
};
Slot g_slots[kSlots];

uint64_t started_changes(uintptr_t start) {
  for (Slot &slot : g_slots) {
    if (reinterpret_cast<uintptr_t>(slot.base) == start)
      return slot.started.load(std::memory_order_acquire);
  }
  return ~uint64_t{0};  // not a slot start: never judged
}

TEST(CacheConcurrency, NoStaleRegistrationAfterUnmapReturns) {
  mrc_monitor_info_t info;
  ASSERT_EQ(mrc_monitor_info(&info), MRC_OK);
  if (info.mode == MRC_MONITOR_UNCACHED) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
  CountingBackend backend;
  backend.stamp_source = &started_changes;
  mrc_cache_params_t params = backend.params("concurrency");
  params.max_regions = 6;  // eviction runs concurrently too
  mrc_cache_t *cache = nullptr;
  ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK);

  char *area = static_cast<char *>(mmap(nullptr, kSlots * (kSlotPages + 1) * kPage, PROT_NONE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(area, MAP_FAILED);
  Slot *slots = g_slots;
  for (size_t i = 0; i < kSlots; ++i) {
    slots[i].base = area + i * (kSlotPages + 1) * kPage;
    ASSERT_EQ(mmap(slots[i].base, kSlotPages * kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
              slots[i].base);
  }

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> stale{0}, gets{0}, remaps{0};
  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    while (!stop.load(std::memory_order_relaxed)) {
      Slot &slot = slots[rng() % kSlots];
      const uint64_t generation = slot.completed.load(std::memory_order_acquire);
      const size_t offset = (rng() % kSlotPages) * kPage;
      const size_t length = kPage * (1 + rng() % (kSlotPages - offset / kPage));
      mrc_region_t *region = nullptr;
      if (mrc_get(cache, slot.base + offset, length, MRC_PROT_READ | MRC_PROT_WRITE, &region) !=
          MRC_OK) {
        continue;
      }
      const auto *registration = mrc::test::registration_of(region);
      // The stamp is read at the region's start, which is the slot's base (slots never merge).
      if (registration->start == reinterpret_cast<uintptr_t>(slot.base) &&
          registration->stamp < generation) {
        ++stale;
      }
      mrc_put(cache, region);
      ++gets;
    }
  };
  auto mutator = [&](unsigned seed) {
    std::mt19937 rng(seed);
    while (!stop.load(std::memory_order_relaxed)) {
      // Each mutator owns every other slot, so no slot has two mutators.
      const size_t index = (rng() % (kSlots / 2)) * 2 + (seed & 1);
      Slot &mine = slots[index];
      mine.started.fetch_add(1, std::memory_order_seq_cst);
      if (rng() % 2 == 0) {
        ASSERT_EQ(mmap(mine.base, kSlotPages * kPage, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
                  mine.base);
      } else {
        ASSERT_EQ(madvise(mine.base, kSlotPages * kPage, MADV_DONTNEED), 0);
      }
      mine.completed.fetch_add(1, std::memory_order_release);
      ++remaps;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  };
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < 3; ++i) threads.emplace_back(worker, 100 + i);
  for (unsigned i = 0; i < 2; ++i) threads.emplace_back(mutator, i);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  stop = true;
  for (auto &t : threads) t.join();

  EXPECT_EQ(stale, 0u) << "a get returned a registration of replaced memory";
  EXPECT_GT(gets, 1000u);
  EXPECT_GT(remaps, 100u);
  mrc_stats_t s{};
  ASSERT_EQ(mrc_cache_stats(cache, &s), MRC_OK);
  EXPECT_GT(s.invalidations, 0u);
  EXPECT_EQ(s.gets, s.puts);
  mrc_cache_destroy(cache);
  EXPECT_EQ(backend.live_count(), 0u);
  EXPECT_EQ(backend.regs, backend.deregs);
  munmap(area, kSlots * (kSlotPages + 1) * kPage);
  for (Slot &slot : g_slots) slot.base = nullptr;
}

// Four threads get, sometimes invalidate, and put `span` pages of one mapping, `pages` places
// `stride` pages apart (gets that overlap their neighbours merge with them), staying on a page for
// `dwell` gets (long enough to park its reference, see core/cache/cache.h); each invalidates every
// `every`-th region it gets. Every get is checked against the backend's live registrations. Before
// destroy, with no reference held by anyone, every invalidated registration must have ended and its
// done run exactly once: parked references of invalidated regions are taken back at once.
struct InvalidatingRun {
  int pages, stride, span, dwell, every;
};

void run_invalidating_workers(const InvalidatingRun &run) {
  CountingBackend backend;
  mrc_cache_params_t params = backend.params("invalidate");
  mrc_cache_t *cache = nullptr;
  ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK);
  const size_t length = static_cast<size_t>(run.pages * run.stride + run.span) * kPage;
  char *p = static_cast<char *>(
      mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  std::atomic<int> done{0}, invalidated{0}, ended_in_use{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        char *address =
            p + static_cast<size_t>(run.stride * ((i / run.dwell + t) % run.pages)) * kPage;
        mrc_region_t *region = nullptr;
        ASSERT_EQ(
            mrc_get(cache, address, static_cast<size_t>(run.span) * kPage, MRC_PROT_READ, &region),
            MRC_OK);
        {
          std::lock_guard lock(backend.mutex);
          if (backend.live.count(mrc::test::registration_of(region)->serial) == 0) ++ended_in_use;
        }
        if (i % run.every == t) {
          ASSERT_EQ(
              mrc_invalidate(
                  cache, region, [](void *arg) { ++*static_cast<std::atomic<int> *>(arg); }, &done),
              MRC_OK);
          ++invalidated;
        }
        mrc_put(cache, region);
      }
    });
  }
  for (auto &thread : threads) thread.join();
  EXPECT_EQ(ended_in_use.load(), 0) << "a get returned a registration that had ended";
  EXPECT_GT(invalidated.load(), 0);
  EXPECT_EQ(done.load(), invalidated.load()) << "done runs once, as soon as no thread holds it";
  mrc_stats_t s{};
  ASSERT_EQ(mrc_cache_stats(cache, &s), MRC_OK);
  EXPECT_EQ(backend.live_count(), s.regions) << "only cached regions are still registered";
  mrc_cache_destroy(cache);
  EXPECT_EQ(backend.live_count(), 0u);
  munmap(p, length);
}

TEST(CacheConcurrency, ConcurrentInvalidateAndPutOfMergingNeighbours) {
  run_invalidating_workers({/*pages=*/16, /*stride=*/1, /*span=*/2, /*dwell=*/1, /*every=*/7});
}

TEST(CacheConcurrency, InvalidationTakesBackReferencesParkedByOtherThreads) {
  mrc_monitor_info_t info;
  ASSERT_EQ(mrc_monitor_info(&info), MRC_OK);
  if (info.mode == MRC_MONITOR_UNCACHED) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
  run_invalidating_workers({/*pages=*/8, /*stride=*/2, /*span=*/1, /*dwell=*/64, /*every=*/97});
}

// Four threads each hold four regions, twice what max_regions allows, hit them (hot enough to be
// promoted to parking), then put them all at once: the puts that leave regions unused race with
// each other's trims, and when the last one returns the cache is back within its bound.
TEST(CacheConcurrency, ConcurrentReleasesTrimTheCacheBackToItsBound) {
  mrc_monitor_info_t info;
  ASSERT_EQ(mrc_monitor_info(&info), MRC_OK);
  if (info.mode == MRC_MONITOR_UNCACHED) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
  constexpr int kThreads = 4;
  constexpr int kHeld = 4;
  constexpr size_t kBound = 8;
  CountingBackend backend;
  mrc_cache_params_t params = backend.params("trim");
  params.max_regions = kBound;
  mrc_cache_t *cache = nullptr;
  ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK);
  const size_t length = 2 * kThreads * kHeld * kPage;  // a page apart: no merging
  char *p = static_cast<char *>(
      mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  std::atomic<int> over_after_release{0}, failed_gets{0};
  auto check = [&]() noexcept {
    mrc_stats_t s{};
    if (mrc_cache_stats(cache, &s) != MRC_OK || s.regions > kBound) ++over_after_release;
  };
  std::barrier all_held(kThreads);
  std::barrier all_released(kThreads, check);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        mrc_region_t *held[kHeld] = {};
        for (int i = 0; i < kHeld; ++i) {
          char *address = p + static_cast<size_t>(2 * (t * kHeld + i)) * kPage;
          if (mrc_get(cache, address, kPage, MRC_PROT_READ, &held[i]) != MRC_OK) ++failed_gets;
        }
        all_held.arrive_and_wait();
        for (int hit = 0; hit < 16; ++hit) {
          for (int i = 0; i < kHeld; ++i) {
            mrc_region_t *region = nullptr;
            char *address = p + static_cast<size_t>(2 * (t * kHeld + i)) * kPage;
            if (mrc_get(cache, address, kPage, MRC_PROT_READ, &region) != MRC_OK) {
              ++failed_gets;
              continue;
            }
            mrc_put(cache, region);
          }
        }
        for (mrc_region_t *region : held) {
          if (region != nullptr) mrc_put(cache, region);
        }
        all_released.arrive_and_wait();
      }
    });
  }
  for (auto &thread : threads) thread.join();
  EXPECT_EQ(failed_gets.load(), 0);
  EXPECT_EQ(over_after_release.load(), 0) << "unused regions left past the bound";
  mrc_stats_t s{};
  ASSERT_EQ(mrc_cache_stats(cache, &s), MRC_OK);
  EXPECT_EQ(backend.live_count(), s.regions) << "trimmed regions were not deregistered";
  mrc_cache_destroy(cache);
  EXPECT_EQ(backend.live_count(), 0u);
  munmap(p, length);
}

}  // namespace
