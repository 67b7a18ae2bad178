// SPDX-License-Identifier: BSD-3-Clause
// Readers hammer lookups and range walks under guards while one writer inserts and removes.
// Checked: a reader never returns a region whose removal completed before its lookup began;
// nothing a reader holds is reclaimed under it (regions are poisoned on reclaim, nodes are freed
// for real so ASan and TSan see any use after free); regions present throughout are always found,
// and range walks visit them once, in order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/epoch.h"
#include "pgtable/pgtable.h"

namespace mrc {
namespace {

constexpr uintptr_t kPage = 4096;
constexpr uint64_t kAlive = 0x0A11FE, kPoison = 0xDEADBEEF;

struct TestRegion : PgtRegion {
  TestRegion(uintptr_t s, uintptr_t e) : PgtRegion{s, e} {}
  std::atomic<uint64_t> alive{kAlive};
  std::atomic<uint64_t> removed_at{0};  // the removal's sequence number, once remove() returned
};

// Permanent one-page regions every kStride pages; transient ones come and go in the gaps
// between them (splitting and collapsing the nodes the permanent ones live in), and huge
// transient regions with unaligned ends come and go beside a permanent region far away.
constexpr uintptr_t kNear = 0x7f0000000000;
constexpr uintptr_t kStride = 8;
constexpr uintptr_t kPermanent = 512;
constexpr uintptr_t kFar = 0x100000000000;
constexpr uintptr_t kTiB = uintptr_t{1} << 40;

#if defined(MRC_TSAN)
constexpr int kWriterOps = 60'000;
#else
constexpr int kWriterOps = 300'000;
#endif

class PgtableConcurrencyTest : public ::testing::TestWithParam<EpochBarrier> {
 protected:
  PgtableConcurrencyTest() : domain_(GetParam()), table_(domain_) {
    for (uintptr_t i = 0; i < kPermanent; ++i) {
      const uintptr_t start = kNear + i * kStride * kPage;
      permanent_.push_back(std::make_unique<TestRegion>(start, start + kPage));
      EXPECT_EQ(table_.insert(permanent_.back().get()), MRC_OK);
    }
    permanent_.push_back(std::make_unique<TestRegion>(kFar - kPage, kFar));
    EXPECT_EQ(table_.insert(permanent_.back().get()), MRC_OK);
  }

  ~PgtableConcurrencyTest() override {
    table_.purge([](PgtRegion *) {});
    domain_.synchronize();
    std::lock_guard lock(graveyard_mutex_);
    for (TestRegion *region : graveyard_) delete region;
  }

  TestRegion *permanent_at(uintptr_t address) const {
    if (address >= kNear && address < kNear + kPermanent * kStride * kPage) {
      const uintptr_t page = (address - kNear) / kPage;
      return page % kStride == 0 ? permanent_[page / kStride].get() : nullptr;
    }
    if (address >= kFar - kPage && address < kFar) return permanent_.back().get();
    return nullptr;
  }

  void writer() {
    std::mt19937_64 rng(42);
    std::vector<TestRegion *> live;
    uint64_t sequence = 0;
    // At least kWriterOps, and until the readers have really run alongside (on a loaded machine
    // they may start late); a deadline keeps a starved run bounded.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int op = 0; op < kWriterOps || (lookups_seen_.load(std::memory_order_relaxed) < 100'000 &&
                                         std::chrono::steady_clock::now() < deadline);
         ++op) {
      const bool add = live.size() < 64 || (live.size() < 4096 && rng() % 2 == 0);
      if (add) {
        TestRegion *region;
        if (rng() % 8 != 0) {
          const uintptr_t gap = rng() % kPermanent, offset = 1 + rng() % (kStride - 1);
          const uintptr_t length = 1 + rng() % (kStride - offset);
          const uintptr_t start = kNear + (gap * kStride + offset) * kPage;
          region = new TestRegion(start, start + length * kPage);
        } else {
          const uintptr_t start = kFar + (rng() % 4096) * kPage;
          region = new TestRegion(start, start + kTiB + (rng() % 4096) * kPage);
        }
        mrc_status_t status = table_.insert(region);
        if (status == MRC_OK) {
          live.push_back(region);
        } else {
          ASSERT_EQ(status, MRC_ERR_EXISTS);
          delete region;  // never visible to anyone
        }
      } else {
        const size_t index = rng() % live.size();
        TestRegion *region = live[index];
        live[index] = live.back();
        live.pop_back();
        ASSERT_EQ(table_.remove(region), MRC_OK);
        region->removed_at.store(++sequence, std::memory_order_relaxed);
        completed_.store(sequence, std::memory_order_release);  // readers acquire it
        retire_poisoned(region);
      }
      if (op % 1024 == 0) {
        ASSERT_TRUE(table_.check_invariants());
      }
    }
    for (TestRegion *region : live) {
      ASSERT_EQ(table_.remove(region), MRC_OK);
      delete_after_grace(region);
    }
    removed_ = sequence;
  }

  // A lookup's result, inside its guard: alive, containing the address, and not removed by a
  // removal that completed (the `completed` count the reader read) before the lookup began.
  void check_hit(PgtRegion *found, uintptr_t address, uint64_t completed) {
    auto *region = static_cast<TestRegion *>(found);
    if (region->alive.load(std::memory_order_relaxed) != kAlive) reclaimed_seen_.fetch_add(1);
    if (address < region->start || address >= region->end) failures_.fetch_add(1);
    const uint64_t removed_at = region->removed_at.load(std::memory_order_relaxed);
    if (removed_at != 0 && removed_at <= completed) stale_seen_.fetch_add(1);
  }

  // Poisoned once no reader can hold it, and kept (poisoned) until the end, so that a late reader
  // reads poison, not reused memory.
  void retire_poisoned(TestRegion *region) {
    domain_.retire(region, [](void *object) {
      auto *r = static_cast<TestRegion *>(object);
      r->alive.store(kPoison, std::memory_order_relaxed);
      std::lock_guard lock(graveyard_mutex_);
      graveyard_.push_back(r);
    });
  }

  // The shape tests below: two readers look up addresses pick(rng) gives while the test changes
  // the table's shape. Counted: a lookup that does not return expected(address) where that is a
  // region, a region not containing the address, one reclaimed, one removed before the lookup.
  template <class Pick, class Expected>
  void start_shape_readers(Pick pick, Expected expected) {
    {
      std::lock_guard lock(graveyard_mutex_);
      graveyard_.clear();  // the previous test's fixture deleted them
    }
    shape_deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (uint64_t seed = 11; seed <= 12; ++seed) {
      shape_readers_.emplace_back([this, pick, expected, seed] {
        std::mt19937_64 rng(seed);
        uint64_t count = 0;
        while (!stop_.load(std::memory_order_relaxed)) {
          EpochGuard guard(domain_);
          const uint64_t done = completed_.load(std::memory_order_acquire);
          const uintptr_t address = pick(rng);
          PgtRegion *found = table_.lookup(address);
          if (++count % 1024 == 0) lookups_seen_.fetch_add(1024, std::memory_order_relaxed);
          if (const PgtRegion *must = expected(address); must != nullptr && found != must) {
            failures_.fetch_add(1);
          }
          if (found != nullptr) check_hit(found, address, done);
        }
        lookups_.fetch_add(count);
      });
    }
  }

  // The shape tests' writer: at least `cycles` cycles, and until the readers have really run
  // alongside (on a loaded machine they may start late); a deadline keeps a starved run bounded.
  bool shape_cycle_more(int cycle, int cycles, uint64_t lookups_wanted) const {
    return cycle < cycles || (lookups_seen_.load(std::memory_order_relaxed) < lookups_wanted &&
                              std::chrono::steady_clock::now() < shape_deadline_);
  }

  // Removes region for a shape test's writer: stamped with its removal's number, published to the
  // readers, retired poisoned.
  void remove_stamped(TestRegion *region) {
    ASSERT_EQ(table_.remove(region), MRC_OK);
    region->removed_at.store(++shape_sequence_, std::memory_order_relaxed);
    completed_.store(shape_sequence_, std::memory_order_release);
    retire_poisoned(region);
  }

  void stop_shape_readers() {
    stop_.store(true);
    for (auto &t : shape_readers_) t.join();
    EXPECT_EQ(failures_.load(), 0u) << "an expected region went missing, or a wrong region";
    EXPECT_EQ(stale_seen_.load(), 0u) << "a lookup returned a region removed before it began";
    EXPECT_EQ(reclaimed_seen_.load(), 0u) << "a region was reclaimed under a reader";
    EXPECT_GT(lookups_.load(), 1000u);
  }

  void delete_after_grace(TestRegion *region) {
    domain_.retire(region, [](void *object) { delete static_cast<TestRegion *>(object); });
  }

  void reader(uint64_t seed) {
    std::mt19937_64 rng(seed);
    uint64_t lookups = 0, hits = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      EpochGuard guard(domain_);
      const uint64_t completed = completed_.load(std::memory_order_acquire);
      uintptr_t address;
      switch (rng() % 4) {
        case 0: address = kNear + (rng() % kPermanent) * kStride * kPage + rng() % kPage; break;
        case 1: address = kFar - kPage + rng() % (kTiB + 8192 * kPage); break;
        default: address = kNear + rng() % (kPermanent * kStride * kPage); break;
      }
      PgtRegion *found = table_.lookup(address);
      ++lookups;
      if (lookups % 1024 == 0) lookups_seen_.fetch_add(1024, std::memory_order_relaxed);
      if (TestRegion *expected = permanent_at(address)) {
        if (found != expected) failures_.fetch_add(1);  // a present region went missing
      }
      if (found != nullptr) {
        ++hits;
        check_hit(found, address, completed);
      }
      if (rng() % 64 == 0) walk(rng);
    }
    lookups_.fetch_add(lookups);
    hits_.fetch_add(hits);
  }

  // A range walk concurrent with the writer: each permanent region in the window exactly once,
  // in address order. Regions inserted or removed during the walk may appear or not and may
  // overlap others (pgtable.h: a concurrent walk is not a snapshot), so order is checked among
  // permanent regions only.
  void walk(std::mt19937_64 &rng) {
    const uintptr_t from = kNear + (rng() % kPermanent) * kStride * kPage;
    const uintptr_t to = from + (1 + rng() % 64) * kStride * kPage;
    uintptr_t last_end = 0;
    size_t permanent_seen = 0;
    table_.for_each_overlapping(from, to, [&](PgtRegion *found) {
      auto *region = static_cast<TestRegion *>(found);
      if (region->alive.load(std::memory_order_relaxed) != kAlive) reclaimed_seen_.fetch_add(1);
      if (permanent_at(region->start) != region) return;
      if (region->start < last_end) failures_.fetch_add(1);
      last_end = region->end;
      ++permanent_seen;
    });
    const uintptr_t end = std::min(to, kNear + kPermanent * kStride * kPage);
    if (permanent_seen != (end - from + kStride * kPage - 1) / (kStride * kPage)) {
      failures_.fetch_add(1);
    }
    walks_.fetch_add(1, std::memory_order_relaxed);
  }

  EpochDomain domain_;
  PageTable table_;
  std::vector<std::unique_ptr<TestRegion>> permanent_;
  std::atomic<uint64_t> completed_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> failures_{0}, stale_seen_{0}, reclaimed_seen_{0};
  std::atomic<uint64_t> lookups_{0}, hits_{0}, walks_{0};
  std::atomic<uint64_t> lookups_seen_{0};  // while running, in steps of 1024
  uint64_t removed_ = 0;
  std::vector<std::thread> shape_readers_;
  uint64_t shape_sequence_ = 0;
  std::chrono::steady_clock::time_point shape_deadline_;
  static inline std::mutex graveyard_mutex_;
  static inline std::vector<TestRegion *> graveyard_;
};

std::string barrier_name(const ::testing::TestParamInfo<EpochBarrier> &param_info) {
  return param_info.param == EpochBarrier::Auto ? "Auto" : "Fences";
}

INSTANTIATE_TEST_SUITE_P(Barriers, PgtableConcurrencyTest,
                         ::testing::Values(EpochBarrier::Auto, EpochBarrier::Fences),
                         &barrier_name);

TEST_P(PgtableConcurrencyTest, ReadersNeverSeeRemovedOrReclaimedRegions) {
  {
    std::lock_guard lock(graveyard_mutex_);
    graveyard_.clear();
  }
  std::vector<std::thread> readers;
  for (uint64_t seed = 1; seed <= 2; ++seed) readers.emplace_back([this, seed] { reader(seed); });
  writer();
  stop_.store(true);
  for (auto &t : readers) t.join();
  ASSERT_FALSE(HasFatalFailure());

  EXPECT_EQ(stale_seen_.load(), 0u) << "a lookup returned a region removed before it began";
  EXPECT_EQ(reclaimed_seen_.load(), 0u) << "a region was reclaimed under a reader";
  EXPECT_EQ(failures_.load(), 0u) << "wrong region, missing permanent region, or bad walk";
  RecordProperty("lookups", std::to_string(lookups_.load()));
  RecordProperty("walks", std::to_string(walks_.load()));
  RecordProperty("removed", std::to_string(removed_));
  EXPECT_GT(lookups_.load(), 1000u);
  EXPECT_GT(hits_.load(), 100u);
  EXPECT_GT(walks_.load(), 10u);
  EXPECT_TRUE(table_.check_invariants());
  EXPECT_EQ(table_.size(), permanent_.size());
  // Every removed region was reclaimed once the readers were gone.
  domain_.synchronize();
  std::lock_guard lock(graveyard_mutex_);
  EXPECT_EQ(graveyard_.size(), removed_);
  for (TestRegion *region : graveyard_) EXPECT_EQ(region->alive.load(), kPoison);
}

// Flat nodes made and unmade under readers: one permanent region at the start of every group of
// two level-1 blocks; the writer adds a second region to every group of a block (its level-1 node
// becomes flat) and takes them away again (back to a tree), in random order, over and over.
TEST_P(PgtableConcurrencyTest, FlatNodesComeAndGoUnderReaders) {
  if (!PageTable::kFlats) GTEST_SKIP() << "PageTable's shape has no flat nodes";
  constexpr uintptr_t kBlocks = 0x600000000000;
  constexpr uintptr_t kGroup = PageTable::kLeafFanout * kPage;
  constexpr unsigned kGroups = 2 * PageTable::kInnerFanout;
  std::vector<std::unique_ptr<TestRegion>> anchors;
  for (unsigned g = 0; g < kGroups; ++g) {
    anchors.push_back(
        std::make_unique<TestRegion>(kBlocks + g * kGroup, kBlocks + g * kGroup + kPage));
    ASSERT_EQ(table_.insert(anchors.back().get()), MRC_OK);
  }
  start_shape_readers([](std::mt19937_64 &rng) { return kBlocks + rng() % (kGroups * kGroup); },
                      [&anchors](uintptr_t address) -> PgtRegion * {
                        const uintptr_t g = (address - kBlocks) / kGroup;
                        return address < kBlocks + g * kGroup + kPage ? anchors[g].get() : nullptr;
                      });

  std::mt19937_64 rng(7);
  size_t flattened = 0, unflattened = 0, flats = table_.flat_count();
  auto count_flats = [&] {
    const size_t now = table_.flat_count();
    flattened += now > flats ? now - flats : 0;
    unflattened += now < flats ? flats - now : 0;
    flats = now;
  };
#if defined(MRC_TSAN)
  constexpr int kCycles = 6;
#else
  constexpr int kCycles = 40;
#endif
  for (int cycle = 0; shape_cycle_more(cycle, kCycles, 20'000); ++cycle) {
    const unsigned block = cycle % 2;
    std::vector<TestRegion *> added;
    for (unsigned g = block * PageTable::kInnerFanout; g < (block + 1) * PageTable::kInnerFanout;
         ++g) {
      const uintptr_t at =
          kBlocks + g * kGroup + (2 + rng() % (PageTable::kLeafFanout - 2)) * kPage;
      added.push_back(new TestRegion(at, at + kPage));
    }
    std::shuffle(added.begin(), added.end(), rng);
    for (TestRegion *region : added) {
      ASSERT_EQ(table_.insert(region), MRC_OK);
      count_flats();
    }
    std::shuffle(added.begin(), added.end(), rng);
    for (TestRegion *region : added) {
      remove_stamped(region);
      count_flats();
    }
    ASSERT_TRUE(table_.check_invariants());
  }
  stop_shape_readers();
  EXPECT_GT(flattened, 0u);
  EXPECT_GT(unflattened, 0u);
  for (auto &anchor : anchors) ASSERT_EQ(table_.remove(anchor.get()), MRC_OK);
  domain_.synchronize();
}

// The root window made, grown, mirrored, dropped and rebuilt under readers. With the far permanent
// region out, the root is a level-2 node over the near permanent regions' two level-1 nodes, so it
// has a window; each cycle the writer adds regions between the permanent ones (changes of level-1
// slots), pairs of regions in further level-1 blocks (new nodes: the window grows), a lone region
// at the root's far end (too sparse: no window), a region in another root block (the root moves
// up: no window), a cluster of level-1 nodes far away (the root moves up over two level-2 nodes:
// a window each, and lookups choose between them), and takes them away again in random order.
TEST_P(PgtableConcurrencyTest, RootWindowComesAndGoesUnderReaders) {
  ASSERT_EQ(table_.remove(permanent_.back().get()), MRC_OK);  // the far one
  table_.settle();
  ASSERT_GT(table_.window_slots(), 0u);
  constexpr uintptr_t kBlock = PageTable::block_size(2);
  constexpr uintptr_t kNearEnd = kNear + kPermanent * kStride * kPage;
  static_assert(kNearEnd % kBlock == 0 && kNear % PageTable::block_size(3) == 0);
  constexpr uintptr_t kCluster = 0x555540000000;  // a level-2 node's block, far from kNear's
  static_assert(kCluster % PageTable::block_size(3) == 0);
  // The permanent regions' blocks, the blocks the writer fills up to the root's far end, the far
  // cluster's.
  start_shape_readers(
      [](std::mt19937_64 &rng) {
        switch (rng() % 3) {
          case 0: return kNear + rng() % (kNearEnd - kNear);
          case 1: return kNearEnd + rng() % (PageTable::kInnerFanout * kBlock);
          default: return kCluster + rng() % (2 * kBlock);
        }
      },
      [this](uintptr_t address) -> PgtRegion * { return permanent_at(address); });

  std::mt19937_64 rng(5);
  size_t windows = 0, drops = 0, last = table_.window_slots();
  auto count_windows = [&] {
    const size_t now = table_.window_slots();
    windows += now != last && now != 0;
    drops += now != last && now == 0;
    last = now;
  };
#if defined(MRC_TSAN)
  constexpr int kCycles = 200;
#else
  constexpr int kCycles = 2000;
#endif
  for (int cycle = 0; shape_cycle_more(cycle, kCycles, 100'000); ++cycle) {
    std::vector<TestRegion *> added;
    const uintptr_t blocks = 1 + rng() % 4;
    for (uintptr_t b = 0; b < blocks; ++b) {
      const uintptr_t at = kNearEnd + b * kBlock + (rng() % 64) * kPage;
      added.push_back(new TestRegion(at, at + kPage));
      added.push_back(new TestRegion(at + kBlock / 2, at + kBlock / 2 + 2 * kPage));
    }
    if (rng() % 2 == 0) {
      const uintptr_t at = kNear + (PageTable::kInnerFanout - 1) * kBlock;
      added.push_back(new TestRegion(at, at + kPage));
    }
    if (rng() % 4 == 0) added.push_back(new TestRegion(kFar, kFar + kPage));
    if (rng() % 4 == 0) {
      for (uintptr_t b = 0; b < 2; ++b) {
        const uintptr_t at = kCluster + b * kBlock + (rng() % 64) * kPage;
        added.push_back(new TestRegion(at, at + kPage));
        added.push_back(new TestRegion(at + kBlock / 2, at + kBlock / 2 + kPage));
      }
    }
    for (uintptr_t gap = rng() % 16; gap < kPermanent; gap += 16) {
      const uintptr_t at = kNear + (gap * kStride + 1 + rng() % (kStride - 1)) * kPage;
      added.push_back(new TestRegion(at, at + kPage));
    }
    std::shuffle(added.begin(), added.end(), rng);
    for (TestRegion *region : added) {
      ASSERT_EQ(table_.insert(region), MRC_OK);
      count_windows();
    }
    ASSERT_TRUE(table_.check_invariants());
    std::shuffle(added.begin(), added.end(), rng);
    for (TestRegion *region : added) {
      remove_stamped(region);
      count_windows();
    }
    ASSERT_TRUE(table_.check_invariants());
  }
  stop_shape_readers();
  EXPECT_GT(windows, 0u) << "no window was built or rebuilt";
  EXPECT_GT(drops, 0u) << "no window was dropped";
  RecordProperty("windows", std::to_string(windows));
  domain_.synchronize();
}

}  // namespace
}  // namespace mrc
