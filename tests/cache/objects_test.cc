// SPDX-License-Identifier: BSD-3-Clause
// The objects the cache is made of (docs/DESIGN.md, "The cache's objects"), each against the
// rules at the top of its header, alone: the stacks and the batch that carry regions between
// threads, the pool, the retirement lists, the CLOCK ring, the parking lines' owner side and
// reclaim marks, the churn policy switched off, and how a statistics reading combines its parts.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/epoch.h"
#include "core/cache/churn_hints.h"
#include "core/cache/clock_ring.h"
#include "core/cache/dereg_batch.h"
#include "core/cache/parking_lines.h"
#include "core/cache/region.h"
#include "core/cache/region_pool.h"
#include "core/cache/region_stack.h"
#include "core/cache/retirement.h"
#include "core/cache/statistics.h"

namespace mrc::test {
namespace {

constexpr uintptr_t kPage = 4096;
#ifdef NDEBUG
constexpr bool kDebugStates = false;  // the states after the count ended are recorded in debug only
#else
constexpr bool kDebugStates = true;
#endif

// Regions owned by the test, [i * 2 pages, i * 2 pages + pages) each.
struct Regions {
  explicit Regions(size_t count, size_t pages = 1) {
    for (size_t i = 0; i < count; ++i) {
      auto region = std::make_unique<Region>();
      region->start = (i + 1) * 2 * kPage * 64;
      region->end = region->start + pages * kPage;
      all.push_back(std::move(region));
    }
  }
  Region *operator[](size_t i) const { return all[i].get(); }
  std::vector<std::unique_ptr<Region>> all;
};

std::vector<Region *> chain_of(Region *chain) {
  std::vector<Region *> out;
  for_each_in_chain(chain, [&out](Region *region) { out.push_back(region); });
  return out;
}

// A region whose count ended, in the state a stage of its end leaves it in (debug builds check).
void end_count(Region *region, RegionState state) {
  region->refcount.store(Region::kDead, std::memory_order_relaxed);
  region->enter(state);
}

TEST(RegionStack, TakesEverythingPushedNewestFirst) {
  Regions regions(3);
  RegionStack stack;
  EXPECT_TRUE(stack.empty());
  EXPECT_EQ(stack.take_all(), nullptr);
  stack.push(regions[0]);
  regions[1]->gc_next = regions[2];  // a chain pushed in one CAS
  stack.push_chain(regions[1], regions[2]);
  EXPECT_FALSE(stack.empty());
  EXPECT_EQ(chain_of(stack.take_all()),
            (std::vector<Region *>{regions[1], regions[2], regions[0]}));
  EXPECT_TRUE(stack.empty());
}

// Rule 2: what a pusher wrote before its push is visible to the taker (TSan checks the
// ordering), and no push is lost while another thread keeps taking.
TEST(RegionStack, ConcurrentPushesReachTheTakerWithTheirWrites) {
  constexpr size_t kPerThread = 2000;
  Regions regions(2 * kPerThread);
  RegionStack stack;
  std::atomic<bool> done{false};
  std::set<Region *> taken;
  std::thread taker([&] {
    while (true) {
      const bool last = done.load(std::memory_order_acquire);
      for_each_in_chain(stack.take_all(), [&taken](Region *region) {
        EXPECT_EQ(region->failure, MRC_ERR_BACKEND);  // written before its push
        taken.insert(region);
      });
      if (last) break;
    }
  });
  std::thread pushers[2];
  for (size_t t = 0; t < 2; ++t) {
    pushers[t] = std::thread([&, t] {
      for (size_t i = 0; i < kPerThread; ++i) {
        Region *region = regions[t * kPerThread + i];
        region->failure = MRC_ERR_BACKEND;
        stack.push(region);
      }
    });
  }
  for (std::thread &pusher : pushers) pusher.join();
  done.store(true, std::memory_order_release);
  taker.join();
  EXPECT_EQ(taken.size(), 2 * kPerThread);
}

TEST(DeregBatch, SaysWhenMoreThanTheLimitWaitsAndUncountsWhatIsTaken) {
  Regions regions(4, /*pages=*/1);
  DeregBatch batch;
  batch.set_limit(2 * kPage);
  EXPECT_FALSE(batch.add(regions[0]));  // 1 page waits
  EXPECT_FALSE(batch.add(regions[1]));  // 2: at the limit, not past it
  EXPECT_TRUE(batch.add(regions[2]));   // 3
  EXPECT_EQ(chain_of(batch.take_all()).size(), 3U);
  EXPECT_EQ(batch.take_all(), nullptr);
  // What was taken no longer counts: one page waits again, not four.
  EXPECT_FALSE(batch.add(regions[3]));
  EXPECT_EQ(chain_of(batch.take_all()), std::vector<Region *>{regions[3]});
}

TEST(RegionPool, ReusesStorageAndRefillsFromRecycledOnlyWhenEmpty) {
  RegionPool pool;
  RegionStack recycled;
  auto *given = new Region();
  given->start = kPage;  // stale fields: reset() clears them
  pool.give_back(given);
  auto *retired = new Region();
  recycled.push(retired);

  Region *first = pool.allocate(recycled);
  EXPECT_EQ(first, given);  // the pool's own first
  EXPECT_EQ(first->start, 0U);
  EXPECT_FALSE(recycled.empty());  // not needed yet
  Region *second = pool.allocate(recycled);
  EXPECT_EQ(second, retired);  // refilled from recycled
  EXPECT_TRUE(recycled.empty());
  Region *third = pool.allocate(recycled);  // both empty: fresh storage
  ASSERT_NE(third, nullptr);
  EXPECT_NE(third, first);
  EXPECT_NE(third, second);
  for (Region *region : {first, second, third}) delete region;
  EXPECT_EQ(pool.take_all(), nullptr);
}

TEST(RegionPool, KeepsAtMostItsBoundAndFreesTheRest) {
  RegionPool pool;
  constexpr size_t kGiven = 5000;  // past the pool's bound of 4096
  for (size_t i = 0; i < kGiven; ++i) pool.give_back(new Region());
  size_t kept = 0;
  for_each_in_chain(pool.take_all(), [&kept](Region *region) {
    ++kept;
    delete region;
  });
  EXPECT_EQ(kept, 4096U);  // the other 904 went back to malloc (ASan: no leak)
}

std::vector<Region *> g_recycled;
void collect(void *chain) {
  for_each_in_chain(static_cast<Region *>(chain),
                    [](Region *region) { g_recycled.push_back(region); });
}

TEST(Retirement, TracksDefersAndRetiresFinishedRegionsInBatches) {
  constexpr size_t kRegions = 33;  // a full batch of 32 and one more
  Regions regions(kRegions);
  Retirement retirement;
  for (size_t i = 0; i < kRegions; ++i) retirement.track(regions[i]);
  EXPECT_EQ(retirement.live_head(), regions[kRegions - 1]);

  regions[0]->flags.store(Region::kInvalid, std::memory_order_relaxed);  // Invalidated
  regions[0]->refcount.store(Region::kDead, std::memory_order_relaxed);
  retirement.defer(regions[0]);
  EXPECT_EQ(regions[0]->state(), kDebugStates ? RegionState::Deferred : RegionState::Invalidated);
  EXPECT_EQ(chain_of(retirement.take_deferred()), std::vector<Region *>{regions[0]});
  EXPECT_EQ(retirement.take_deferred(), nullptr);

  RegionStack finished;
  for (size_t i = 0; i < kRegions; ++i) {
    regions[i]->flags.store(0, std::memory_order_relaxed);  // kRegistered cleared: finished
    end_count(regions[i], RegionState::Finished);
    finished.push(regions[i]);
  }
  g_recycled.clear();
  retirement.reap(finished.take_all(), &collect);
  EXPECT_EQ(retirement.live_head(), nullptr);  // every region unlinked
  size_t batched = 0;
  retirement.for_each_retiring([&batched](Region *) { ++batched; });
  EXPECT_EQ(batched, 1U);  // the first 32 went to the epoch domain as one batch
  retirement.retire_batch(&collect);
  epoch_domain().synchronize();
  EXPECT_EQ(g_recycled.size(), kRegions);
  if (kDebugStates) {
    for (size_t i = 0; i < kRegions; ++i) EXPECT_EQ(regions[i]->state(), RegionState::Retired);
  }
}

TEST(ClockRing, InsertsBehindTheHandAndKeepsTheHandOnRemoval) {
  Regions regions(3);
  ClockRing ring;
  EXPECT_EQ(ring.hand(), nullptr);
  for (size_t i = 0; i < 3; ++i) ring.insert(regions[i]);
  // A turn from the hand meets them in insertion order: the newest last.
  EXPECT_EQ(ring.advance(), regions[0]);
  EXPECT_EQ(ring.advance(), regions[1]);
  EXPECT_EQ(ring.hand(), regions[2]);
  ring.remove(regions[2]);  // the hand moves on to the next
  EXPECT_EQ(ring.hand(), regions[0]);
  ring.remove(regions[0]);
  ring.remove(regions[1]);
  EXPECT_EQ(ring.hand(), nullptr);
  EXPECT_EQ(regions[1]->lru_next, nullptr);
}

TEST(ParkingLine, TakesBackOnlyWhatIsParkedAndCountsStreaks) {
  Regions regions(2);
  ParkingLine line;
  EXPECT_FALSE(line.take_back(regions[0]));
  line.parked[2].store(regions[0], std::memory_order_relaxed);
  EXPECT_TRUE(line.take_back(regions[0]));
  EXPECT_EQ(line.parked[2].load(std::memory_order_relaxed), nullptr);
  EXPECT_EQ(line.reused[2], 1);  // the line's CLOCK bit
  EXPECT_FALSE(line.take_back(regions[0]));

  EXPECT_FALSE(line.streak_reached(regions[0], 3));
  EXPECT_FALSE(line.streak_reached(regions[0], 3));
  EXPECT_FALSE(line.streak_reached(regions[1], 3));  // another region starts over
  EXPECT_FALSE(line.streak_reached(regions[1], 3));
  EXPECT_TRUE(line.streak_reached(regions[1], 3));
  EXPECT_FALSE(line.streak_reached(regions[1], 3));  // and counts again after
}

TEST(ReclaimMarks, VisitsEveryMarkedOwnerOnce) {
  ReclaimMarks marks;
  EXPECT_FALSE(marks.any());
  marks.mark(3);
  marks.mark(70);
  marks.mark(3);
  std::vector<unsigned> owners;
  marks.take([&owners](unsigned owner) { owners.push_back(owner); });
  EXPECT_EQ(owners, (std::vector<unsigned>{3, 70}));
  EXPECT_FALSE(marks.any());
  marks.mark_all();
  owners.clear();
  marks.take([&owners](unsigned owner) { owners.push_back(owner); });
  EXPECT_EQ(owners.size(), ParkingLines::kLines);
}

// Rule 2 of parking_lines.h: reclaim() takes out only regions whose kParkable is clear, and
// drops their references.
TEST(ParkingLines, ReclaimTakesOutOnlyRegionsNoLongerParkable) {
  Regions regions(2);
  auto lines = std::make_unique<ParkingLines>();
  for (Region *region : {regions[0], regions[1]}) {
    region->refcount.store(2, std::memory_order_relaxed);  // the table's and the parked one
    region->flags.store(Region::kInTable | Region::kRegistered | Region::kParkable,
                        std::memory_order_relaxed);
  }
  lines->line(5).parked[0].store(regions[0], std::memory_order_relaxed);
  lines->line(5).parked[1].store(regions[1], std::memory_order_relaxed);
  regions[1]->change_flags(0, Region::kParkable);
  ReclaimMarks marks;
  marks.mark(5);
  size_t last = 0;
  lines->reclaim(marks, [&last](Region *) { ++last; });
  EXPECT_EQ(lines->line(5).parked[0].load(std::memory_order_relaxed), regions[0]);
  EXPECT_EQ(lines->line(5).parked[1].load(std::memory_order_relaxed), nullptr);
  EXPECT_EQ(regions[1]->refcount.load(std::memory_order_relaxed), 1U);
  EXPECT_EQ(last, 0U);  // the table's reference is left
  EXPECT_FALSE(marks.any());
  EXPECT_FALSE(lines->all_empty());
}

TEST(ChurnHints, OffLearnsNothingAndHandsOutNoTickets) {
  Regions regions(1);
  auto hints = std::make_unique<ChurnHints>();
  hints->set_enabled(false);
  regions[0]->flags.store(Region::kRegistered, std::memory_order_relaxed);
  // Never reused: caching it never paid (a cost not measured: the gaps alone decide).
  ASSERT_FALSE(ChurnHints::caching_paid(*regions[0]));
  for (int i = 0; i < 10; ++i) hints->on_event_removed(*regions[0]);
  EXPECT_FALSE(hints->take_skip(regions[0]->start));
  // The same history with the policy on makes the range churn.
  auto learning = std::make_unique<ChurnHints>();
  for (int i = 0; i < 10; ++i) learning->on_event_removed(*regions[0]);
  EXPECT_TRUE(learning->take_skip(regions[0]->start));
}

TEST(StatsReading, CombinesTheLockedAndTheShardedFigures) {
  StatsReading reading;
  reading.slow.gets_slow = 3;
  reading.slow.registered_bytes = 10 * kPage;
  reading.slow.unreleased_bytes = kPage;
  reading.hot[static_cast<unsigned>(Counter::HitsFast)] = 7;
  reading.hot[static_cast<unsigned>(Counter::EndedBytes)] = 4 * kPage;
  reading.hot[static_cast<unsigned>(Counter::UnreleasedBytes)] = kPage;
  reading.hot[static_cast<unsigned>(Counter::ReleasedBytes)] = 3 * kPage;  // the out before the in
  reading.hot[static_cast<unsigned>(Counter::PfnMismatches)] = 2;
  const mrc_stats_t stats = reading.totals();
  EXPECT_EQ(stats.gets, 10U);
  EXPECT_EQ(stats.registered_bytes, 6 * kPage);
  EXPECT_EQ(stats.unreleased_bytes, 0U);  // never below zero
  EXPECT_EQ(stats.pfn_mismatches, 2U);
  char json[2048];
  ASSERT_GT(reading.json("c", "null", true, json, sizeof json), 0);
  EXPECT_NE(std::string(json).find("\"gets\":10,"), std::string::npos) << json;
}

}  // namespace
}  // namespace mrc::test
