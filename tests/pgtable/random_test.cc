// SPDX-License-Identifier: BSD-3-Clause
// Randomized differential test: the page table against a std::map model, over several seeds,
// fanouts and address layouts; more than 10^6 operations in all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/epoch.h"
#include "pgtable/pgtable.h"

namespace mrc {
namespace {

constexpr uintptr_t kPage = 4096;

// Where the random regions live.
struct Layout {
  const char *name;
  unsigned clusters;  // far apart: path compression between them
  uintptr_t bases[3];
  uintptr_t span_pages;  // pages per cluster
  // Mostly one- and two-page regions, in phases that fill the span and drain it again: level-1
  // nodes fill up with leaves (flat nodes) and thin out (back to trees).
  bool packed = false;
};

constexpr Layout kLayouts[] = {
    {"dense", 1, {0x7f0000000000, 0, 0}, 1u << 12},
    {"clusters", 3, {0x555555554000, 0x7ffff0000000, 0x10000}, 1u << 14},
    {"edges", 3, {(uintptr_t{1} << 57) - (uintptr_t{1} << 28), 0, 0x100000000000}, 1u << 16},
    {"packed", 1, {0x7f0000000000, 0, 0}, 1u << 12, true},
    // Heap-like: 128 MiB, many level-1 blocks under one level-2 root (PageTable: a root window).
    {"heap", 1, {0x7f0000000000, 0, 0}, 1u << 15},
    // A process registering heap and mmap memory: two such clusters far apart (PageTable: the two
    // level-2 nodes below the root get a window each).
    {"split", 2, {0x555555000000, 0x7f0000000000, 0}, 1u << 15},
};

template <class Table>
class Differential {
 public:
  Differential(uint64_t seed, const Layout &layout) : rng_(seed), layout_(layout) {}

  ~Differential() {
    table_.purge([](PgtRegion *) {});
    domain_.synchronize();
  }

  void run(size_t operations) {
    for (size_t op = 0; op < operations; ++op) {
      const unsigned dice = pick(100);
      // Packed: alternately filling (45% inserts, 15% removals) and draining (10%, 50%).
      const bool draining = layout_.packed && (op / 6000) % 2 == 1;
      const unsigned inserts = !layout_.packed ? 30 : draining ? 10 : 45;
      const unsigned removals = !layout_.packed ? 50 : 60;
      if (dice < inserts) {
        insert();
      } else if (dice < removals) {
        remove();
      } else if (dice < 90) {
        lookup();
      } else {
        range();
      }
      if (op % 4096 == 0) {
        ASSERT_TRUE(table_.check_invariants()) << "after op " << op;
      }
      if (op % 8192 == 4096) {
        // Without the kept nodes, the canonical form: at most regions - 1 nodes.
        table_.settle();
        ASSERT_EQ(table_.kept_count(), 0u);
        ASSERT_LE(table_.node_count(), model_.empty() ? 0 : model_.size() - 1);
        ASSERT_TRUE(table_.check_invariants()) << "after settling at op " << op;
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_TRUE(table_.check_invariants());
    ASSERT_EQ(table_.size(), model_.size());
    RecordFlats();
    RecordWindows();
    // The run exercised what it claims to: collisions, splits and collapses of nodes.
    EXPECT_GT(inserted_, operations / 20);
    EXPECT_GT(removed_, operations / 20);
    EXPECT_GT(collisions_, operations / 100);
    EXPECT_GT(max_nodes_, 8u);
    EXPECT_GT(max_kept_, 0u);
    // Purge reports exactly the model's regions, in address order.
    std::vector<PgtRegion *> purged, expected;
    for (auto &[start, region] : model_) expected.push_back(region);
    table_.purge([&](PgtRegion *region) { purged.push_back(region); });
    ASSERT_EQ(purged, expected);
    model_.clear();
    ASSERT_EQ(table_.node_count(), 0u);
  }

 private:
  unsigned pick(unsigned n) { return std::uniform_int_distribution<unsigned>(0, n - 1)(rng_); }
  uintptr_t pick64(uintptr_t n) { return std::uniform_int_distribution<uintptr_t>(0, n - 1)(rng_); }

  uintptr_t random_page_address() {
    return layout_.bases[pick(layout_.clusters)] + pick64(layout_.span_pages) * kPage;
  }

  uintptr_t random_length() {
    const unsigned kind = pick(100);
    if (layout_.packed && kind < 95) return (1 + pick64(2)) * kPage;
    if (kind < 60) return (1 + pick64(4)) * kPage;
    if (kind < 90) return (1 + pick64(64)) * kPage;
    if (kind < 99) return (1 + pick64(layout_.span_pages / 4)) * kPage;
    return (1 + pick64(layout_.span_pages * 4)) * kPage;  // crosses clusters, or the top
  }

  // The model's answer: the region containing address, or nullptr.
  PgtRegion *model_lookup(uintptr_t address) const {
    auto it = model_.upper_bound(address);
    if (it == model_.begin()) return nullptr;
    --it;
    return address < it->second->end ? it->second : nullptr;
  }

  bool model_overlaps(uintptr_t start, uintptr_t end) const {
    auto it = model_.lower_bound(end);
    if (it == model_.begin()) return false;
    --it;
    return it->second->end > start;
  }

  PgtRegion *fresh(uintptr_t start, uintptr_t end) {
    storage_.push_back(std::make_unique<PgtRegion>(PgtRegion{start, end}));
    return storage_.back().get();
  }

  void insert() {
    const uintptr_t start = random_page_address();
    const uintptr_t end = start + random_length();
    PgtRegion *region = fresh(start, end);
    mrc_status_t expected = MRC_OK;
    if (end > Table::kAddressLimit) {
      expected = MRC_ERR_INVALID;
    } else if (model_overlaps(start, end)) {
      expected = MRC_ERR_EXISTS;
    }
    ASSERT_EQ(table_.insert(region), expected) << std::hex << start << ".." << end;
    if (expected == MRC_OK) {
      model_[start] = region;
      ++inserted_;
      max_nodes_ = std::max(max_nodes_, table_.node_count());
      count_flat_changes();
      count_window_changes();
    }
    if (expected == MRC_ERR_EXISTS) ++collisions_;
  }

  void remove() {
    if (!model_.empty() && pick(10) != 0) {
      auto it = model_.lower_bound(random_page_address());
      if (it == model_.end()) it = model_.begin();
      ASSERT_EQ(table_.remove(it->second), MRC_OK);
      model_.erase(it);
      ++removed_;
      count_flat_changes();
      count_window_changes();
      // Kept nodes bound the memory beyond the canonical form: each holds up at most a path.
      max_kept_ = std::max(max_kept_, table_.kept_count());
      ASSERT_LE(table_.kept_count(), Table::kKeptNodes);
      ASSERT_LE(table_.node_count(), model_.empty()
                                         ? Table::kKeptNodes * Table::kLevels
                                         : model_.size() - 1 + Table::kKeptNodes * Table::kLevels);
      return;
    }
    // Absent: a copy of a present region, or a range nobody inserted.
    PgtRegion *absent;
    if (!model_.empty()) {
      PgtRegion *present = model_.begin()->second;
      absent = fresh(present->start, present->end);
    } else {
      const uintptr_t start = random_page_address();
      absent = fresh(start, start + kPage);
    }
    ASSERT_EQ(table_.remove(absent), MRC_ERR_NOT_FOUND);
  }

  void lookup() {
    uintptr_t address;
    if (!model_.empty() && pick(2) == 0) {
      // Near a region's edges, where mistakes live.
      auto it = model_.lower_bound(random_page_address());
      if (it == model_.end()) it = model_.begin();
      const PgtRegion *r = it->second;
      const uintptr_t edges[] = {r->start, r->start - 1, r->end, r->end - 1,
                                 r->start + pick64(r->end - r->start)};
      address = edges[pick(5)];
    } else {
      address = random_page_address() + pick64(kPage);
    }
    ASSERT_EQ(table_.lookup(address), model_lookup(address)) << std::hex << address;
  }

  void range() {
    const uintptr_t from = random_page_address() + pick64(kPage) - kPage / 2;
    const uintptr_t to = from + pick64(pick(4) == 0 ? layout_.span_pages * kPage : 64 * kPage);
    std::vector<PgtRegion *> got, expected;
    table_.for_each_overlapping(from, to, [&](PgtRegion *region) { got.push_back(region); });
    if (from < to) {
      auto it = model_.upper_bound(from);
      if (it != model_.begin() && std::prev(it)->second->end > from) --it;
      for (; it != model_.end() && it->first < to; ++it) expected.push_back(it->second);
    }
    ASSERT_EQ(got, expected) << std::hex << from << ".." << to;
  }

  std::mt19937_64 rng_;
  const Layout &layout_;
  EpochDomain domain_;
  Table table_{domain_};
  std::map<uintptr_t, PgtRegion *> model_;
  std::vector<std::unique_ptr<PgtRegion>> storage_;
  size_t inserted_ = 0, removed_ = 0, collisions_ = 0, max_nodes_ = 0, max_kept_ = 0;
  size_t flats_ = 0, flattened_ = 0, unflattened_ = 0;
  size_t window_ = 0, windows_built_ = 0;

  void count_window_changes() {
    const size_t window = table_.window_slots();
    windows_built_ += window != window_ && window != 0;
    window_ = window;
  }

  void count_flat_changes() {
    const size_t flats = table_.flat_count();
    if (flats > flats_) flattened_ += flats - flats_;
    if (flats < flats_) unflattened_ += flats_ - flats;
    flats_ = flats;
  }

 public:
  // Where the table's shape has flat nodes, the packed layout makes and unmakes them.
  void RecordFlats() {
    if (!Table::kFlats || !layout_.packed) return;
    EXPECT_GT(flattened_, 0u) << "no level-1 node became flat";
    EXPECT_GT(unflattened_, 0u) << "no flat node went back to a tree";
    ::testing::Test::RecordProperty(std::string("flattened_") + layout_.name,
                                    std::to_string(flattened_));
  }
  // Where the layout needs several level-1 nodes under one level-2 node, in one cluster or two,
  // windows are built (and rebuilt and dropped as the tree changes; check_invariants() compares
  // them with the tree).
  void RecordWindows() {
    const uintptr_t span = layout_.span_pages * kPage;
    if (layout_.clusters > 2 || span <= Table::block_size(2) || span > Table::block_size(3) / 8)
      return;
    EXPECT_GT(windows_built_, 0u) << "no window was built";
    ::testing::Test::RecordProperty(std::string("windows_") + layout_.name,
                                    std::to_string(windows_built_));
  }
};

template <class Table>
void run_seeds(size_t operations_per_run) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (const Layout &layout : kLayouts) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", layout " << layout.name);
      Differential<Table> differential(seed * 7919 + Table::kInnerFanout + Table::kLeafFanout,
                                       layout);
      differential.run(operations_per_run);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// 18 runs each: 18 * 120,000 = 2,160,000 operations for the production shape (PageTable).
TEST(PgtableDifferential, PageTableAgainstMapModel) { run_seeds<PageTable>(120'000); }
TEST(PgtableDifferential, Fanout4AgainstMapModel) { run_seeds<detail::RadixPageTable<2>>(30'000); }
TEST(PgtableDifferential, Fanout16AgainstMapModel) { run_seeds<detail::RadixPageTable<4>>(30'000); }
TEST(PgtableDifferential, Fanout256AgainstMapModel) {
  run_seeds<detail::RadixPageTable<8>>(30'000);
}
TEST(PgtableDifferential, Fanout64Leaves64AgainstMapModel) {
  run_seeds<detail::RadixPageTable<6>>(30'000);
}
TEST(PgtableDifferential, Fanout256Leaves32AgainstMapModel) {
  run_seeds<detail::RadixPageTable<8, 5>>(30'000);
}

}  // namespace
}  // namespace mrc
