// SPDX-License-Identifier: BSD-3-Clause
// Boundary cases of the radix page table, for several fanouts.
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <set>
#include <vector>

#include "base/epoch.h"
#include "pgtable/pgtable.h"

namespace mrc {
namespace {

constexpr uintptr_t kPage = 4096;
constexpr uintptr_t kTiB = uintptr_t{1} << 40;

template <class Table>
class PgtableTest : public ::testing::Test {
 protected:
  static constexpr uintptr_t kTop = Table::kAddressLimit;

  ~PgtableTest() override {
    table_.purge([](PgtRegion *) {});
    domain_.synchronize();
  }

  PgtRegion *make(uintptr_t start, uintptr_t end) {
    regions_.push_back(PgtRegion{start, end});
    return &regions_.back();
  }
  PgtRegion *add(uintptr_t start, uintptr_t end) {
    PgtRegion *region = make(start, end);
    EXPECT_EQ(table_.insert(region), MRC_OK) << std::hex << start << ".." << end;
    return region;
  }
  std::vector<PgtRegion *> overlapping(uintptr_t from, uintptr_t to) {
    std::vector<PgtRegion *> found;
    table_.for_each_overlapping(from, to, [&](PgtRegion *region) { found.push_back(region); });
    return found;
  }
  // The invariants hold, and every region in the table is found at its first and last byte, and
  // one past its end finds nothing or the next region.
  void verify_lookups(const char *step) {
    SCOPED_TRACE(step);
    EXPECT_TRUE(table_.check_invariants());
    for (const PgtRegion &region : regions_) {
      PgtRegion *present = nullptr;
      table_.for_each_overlapping(region.start, region.start + 1, [&](PgtRegion *found) {
        present = found == &region ? found : present;
      });
      if (present == nullptr) continue;
      EXPECT_EQ(table_.lookup(region.start), &region);
      EXPECT_EQ(table_.lookup(region.end - 1), &region);
      if (const PgtRegion *next = table_.lookup(region.end); next != nullptr) {
        EXPECT_EQ(next->start, region.end);
      }
    }
  }

  EpochDomain domain_;
  Table table_{domain_};
  std::deque<PgtRegion> regions_;  // stable addresses
};

using Tables = ::testing::Types<PageTable, detail::RadixPageTable<2>, detail::RadixPageTable<4>,
                                detail::RadixPageTable<6>, detail::RadixPageTable<8>,
                                detail::RadixPageTable<6, 4>, detail::RadixPageTable<8, 5>>;
TYPED_TEST_SUITE(PgtableTest, Tables);

TYPED_TEST(PgtableTest, EmptyTableFindsNothing) {
  EXPECT_EQ(this->table_.lookup(0), nullptr);
  EXPECT_EQ(this->table_.lookup(0x7f0000001000), nullptr);
  EXPECT_EQ(this->table_.lookup(~uintptr_t{0}), nullptr);
  EXPECT_TRUE(this->overlapping(0, ~uintptr_t{0}).empty());
  EXPECT_EQ(this->table_.size(), 0u);
  EXPECT_EQ(this->table_.memory_bytes(), 0u);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, FirstByteLastByteAndOnePastTheEnd) {
  const uintptr_t start = 0x7f1234560000, end = start + 5 * kPage;
  PgtRegion *region = this->add(start, end);
  EXPECT_EQ(this->table_.lookup(start), region);
  EXPECT_EQ(this->table_.lookup(start + 1), region);
  EXPECT_EQ(this->table_.lookup(end - 1), region);
  EXPECT_EQ(this->table_.lookup(end), nullptr);
  EXPECT_EQ(this->table_.lookup(start - 1), nullptr);
  EXPECT_EQ(this->table_.lookup(start - kPage), nullptr);
  EXPECT_EQ(this->table_.size(), 1u);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, AdjacentRegionsSplitExactlyAtTheBoundary) {
  const uintptr_t a = 0x10000000;
  PgtRegion *left = this->add(a, a + 3 * kPage);
  PgtRegion *right = this->add(a + 3 * kPage, a + 4 * kPage);
  PgtRegion *farther = this->add(a + 4 * kPage, a + 64 * kPage);
  EXPECT_EQ(this->table_.lookup(a + 3 * kPage - 1), left);
  EXPECT_EQ(this->table_.lookup(a + 3 * kPage), right);
  EXPECT_EQ(this->table_.lookup(a + 4 * kPage - 1), right);
  EXPECT_EQ(this->table_.lookup(a + 4 * kPage), farther);
  EXPECT_EQ(this->table_.lookup(a + 64 * kPage - 1), farther);
  EXPECT_EQ(this->table_.lookup(a + 64 * kPage), nullptr);
  EXPECT_TRUE(this->table_.check_invariants());
  ASSERT_EQ(this->table_.remove(right), MRC_OK);
  EXPECT_EQ(this->table_.lookup(a + 3 * kPage), nullptr);
  EXPECT_EQ(this->table_.lookup(a + 3 * kPage - 1), left);
  EXPECT_EQ(this->table_.lookup(a + 4 * kPage), farther);
  EXPECT_TRUE(this->table_.check_invariants());
}

// The last inner level, which lookup() reads without a branch on what a slot holds: a region
// covering part of its slot (its bounds must still be checked), a region covering slots whole, a
// leaf with a gap between two regions, empty slots, and a region across two slots. Every page's
// first and last byte against a model.
TYPED_TEST(PgtableTest, EveryPageBelowALastLevelNodeWithRegionsLeavesAndGaps) {
  const uintptr_t slot = TypeParam::block_size(1);  // one slot of a level-1 node
  const uintptr_t base = 0x7f0000000000;            // aligned to a level-1 node's block
  std::vector<PgtRegion *> regions = {
      this->add(base + kPage, base + 3 * kPage),                            // part of slot 0
      this->add(base + slot, base + 3 * slot),                              // slots 1 and 2 whole
      this->add(base + 3 * slot, base + 3 * slot + kPage),                  // slot 3: a leaf,
      this->add(base + 3 * slot + 2 * kPage, base + 3 * slot + 3 * kPage),  // with a gap
      this->add(base + 6 * slot - kPage, base + 6 * slot + 2 * kPage),      // slots 5 and 6, part
  };
  ASSERT_TRUE(this->table_.check_invariants());
  auto model = [&](uintptr_t address) -> PgtRegion * {
    for (PgtRegion *region : regions) {
      if (address >= region->start && address < region->end) return region;
    }
    return nullptr;
  };
  for (uintptr_t page = base - kPage; page < base + 8 * slot; page += kPage) {
    EXPECT_EQ(this->table_.lookup(page), model(page)) << std::hex << page;
    EXPECT_EQ(this->table_.lookup(page + kPage - 1), model(page + kPage - 1)) << std::hex << page;
  }
}

TYPED_TEST(PgtableTest, InvalidRegionsAreRejectedAndChangeNothing) {
  PgtRegion *existing = this->add(0x200000, 0x400000);
  const size_t bytes = this->table_.memory_bytes();
  EXPECT_EQ(this->table_.insert(nullptr), MRC_ERR_INVALID);
  EXPECT_EQ(this->table_.insert(this->make(0x1001, 0x3000)), MRC_ERR_INVALID);  // start
  EXPECT_EQ(this->table_.insert(this->make(0x1000, 0x2fff)), MRC_ERR_INVALID);  // end
  EXPECT_EQ(this->table_.insert(this->make(0x5000, 0x5000)), MRC_ERR_INVALID);  // empty
  EXPECT_EQ(this->table_.insert(this->make(0x9000, 0x5000)), MRC_ERR_INVALID);  // wraps
  EXPECT_EQ(this->table_.insert(this->make(~uintptr_t{0} - 0xfff, 0x1000)), MRC_ERR_INVALID);
  EXPECT_EQ(this->table_.insert(this->make(this->kTop, this->kTop + kPage)), MRC_ERR_INVALID);
  EXPECT_EQ(this->table_.insert(this->make(this->kTop - kPage, this->kTop + kPage)),
            MRC_ERR_INVALID);
  EXPECT_EQ(this->table_.insert(this->make(uintptr_t{1} << 63, (uintptr_t{1} << 63) + kPage)),
            MRC_ERR_INVALID);  // non-canonical
  EXPECT_EQ(this->table_.size(), 1u);
  EXPECT_EQ(this->table_.memory_bytes(), bytes);
  EXPECT_EQ(this->table_.lookup(0x200000), existing);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, OverlapFromEachSideIsRejectedAndChangesNothing) {
  const uintptr_t s = 0x40000000, e = s + 16 * kPage;
  PgtRegion *existing = this->add(s, e);
  PgtRegion *neighbour = this->add(e + 64 * kPage, e + 65 * kPage);
  const size_t bytes = this->table_.memory_bytes();
  const std::pair<uintptr_t, uintptr_t> overlaps[] = {
      {s, e},                               // the same range
      {s - kPage, s + kPage},               // from the left
      {e - kPage, e + kPage},               // from the right
      {s + kPage, e - kPage},               // inside
      {s - kTiB / 1024, e + kPage},         // around
      {s, s + kPage},                       // first page
      {e - kPage, e},                       // last page
      {e - kPage, e + 64 * kPage + kPage},  // spans the gap to the neighbour
  };
  for (auto [from, to] : overlaps) {
    EXPECT_EQ(this->table_.insert(this->make(from, to)), MRC_ERR_EXISTS) << std::hex << from;
  }
  EXPECT_EQ(this->table_.insert(existing), MRC_ERR_EXISTS);  // the same object again
  EXPECT_EQ(this->table_.size(), 2u);
  EXPECT_EQ(this->table_.memory_bytes(), bytes);
  EXPECT_EQ(this->table_.lookup(s), existing);
  EXPECT_EQ(this->table_.lookup(e - 1), existing);
  EXPECT_EQ(this->table_.lookup(e), nullptr);
  EXPECT_EQ(this->table_.lookup(e + 64 * kPage), neighbour);
  EXPECT_TRUE(this->table_.check_invariants());
  // Touching on either side is not an overlap.
  PgtRegion *before = this->add(s - kPage, s);
  PgtRegion *after = this->add(e, e + kPage);
  EXPECT_EQ(this->table_.lookup(s - 1), before);
  EXPECT_EQ(this->table_.lookup(e), after);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, RemovingWhatIsAbsentFails) {
  const uintptr_t s = 0x7f0000000000;
  PgtRegion *region = this->add(s, s + 4 * kPage);
  PgtRegion *twin = this->make(s, s + 4 * kPage);  // same range, another object
  PgtRegion *never = this->make(s + 8 * kPage, s + 9 * kPage);
  EXPECT_EQ(this->table_.remove(twin), MRC_ERR_NOT_FOUND);
  EXPECT_EQ(this->table_.remove(never), MRC_ERR_NOT_FOUND);
  EXPECT_EQ(this->table_.remove(nullptr), MRC_ERR_INVALID);
  EXPECT_EQ(this->table_.lookup(s), region);
  ASSERT_EQ(this->table_.remove(region), MRC_OK);
  EXPECT_EQ(this->table_.remove(region), MRC_ERR_NOT_FOUND);
  EXPECT_EQ(this->table_.lookup(s), nullptr);
  EXPECT_EQ(this->table_.size(), 0u);
  EXPECT_EQ(this->table_.memory_bytes(), 0u);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, RangeQueriesWhoseEndsTouchARegion) {
  const uintptr_t s = 0x50000000, e = s + 8 * kPage;
  PgtRegion *left = this->add(s - 4 * kPage, s - 2 * kPage);
  PgtRegion *region = this->add(s, e);
  PgtRegion *right = this->add(e + 2 * kPage, e + 3 * kPage);
  using V = std::vector<PgtRegion *>;
  EXPECT_EQ(this->overlapping(e, e + 2 * kPage), V{});  // starts at its end
  EXPECT_EQ(this->overlapping(s - 2 * kPage, s), V{});  // ends at its start
  EXPECT_EQ(this->overlapping(e - 1, e), V{region});    // its last byte
  EXPECT_EQ(this->overlapping(s, s + 1), V{region});    // its first byte
  EXPECT_EQ(this->overlapping(s - 1, s + 1), V{region});
  EXPECT_EQ(this->overlapping(s - 2 * kPage - 1, s), V{left});  // left's last byte
  EXPECT_EQ(this->overlapping(e - 1, e + 2 * kPage + 1), (V{region, right}));
  EXPECT_EQ(this->overlapping(0, ~uintptr_t{0}), (V{left, region, right}));
  EXPECT_EQ(this->overlapping(s + kPage, s + kPage), V{});  // empty range
  EXPECT_EQ(this->overlapping(e, s), V{});                  // reversed range
  // Stopping early.
  size_t calls = 0;
  this->table_.for_each_overlapping(0, ~uintptr_t{0}, [&](PgtRegion *) { return ++calls < 2; });
  EXPECT_EQ(calls, 2u);
}

TYPED_TEST(PgtableTest, HugeRegionIsFewEntriesAndVisitedOnce) {
  // Unaligned ends next to small neighbours force the deepest descent on both sides.
  const uintptr_t s = 0x100000000 + 3 * kPage, e = s + kTiB + 5 * kPage;
  PgtRegion *before = this->add(s - kPage, s);
  PgtRegion *after = this->add(e, e + kPage);
  PgtRegion *huge = this->add(s, e);
  using Table = TypeParam;
  // O(log N) entries: a bounded number of nodes per level, independent of the 2^28 pages.
  EXPECT_LE(this->table_.node_count(), 2 * Table::kLevels + 1);
  EXPECT_EQ(this->table_.lookup(s), huge);
  EXPECT_EQ(this->table_.lookup(s + kTiB / 2 + 12345), huge);
  EXPECT_EQ(this->table_.lookup(e - 1), huge);
  EXPECT_EQ(this->table_.lookup(e), after);
  EXPECT_EQ(this->table_.lookup(s - 1), before);
  EXPECT_EQ(this->overlapping(s - 1, e + 1), (std::vector<PgtRegion *>{before, huge, after}));
  EXPECT_EQ(this->overlapping(s + kTiB / 3, s + kTiB / 2), std::vector<PgtRegion *>{huge});
  EXPECT_TRUE(this->table_.check_invariants());
  ASSERT_EQ(this->table_.remove(huge), MRC_OK);
  EXPECT_EQ(this->table_.lookup(s + kTiB / 2), nullptr);
  EXPECT_EQ(this->table_.lookup(e), after);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, WholeAddressSpaceAndItsTop) {
  const uintptr_t top = this->kTop;
  PgtRegion *last = this->add(top - kPage, top);
  EXPECT_EQ(this->table_.lookup(top - 1), last);
  EXPECT_EQ(this->table_.lookup(top - kPage), last);
  EXPECT_EQ(this->table_.lookup(top), nullptr);
  EXPECT_EQ(this->table_.lookup(~uintptr_t{0}), nullptr);
  EXPECT_EQ(this->table_.lookup(top - kPage - 1), nullptr);
  PgtRegion *first = this->add(0, kPage);
  EXPECT_EQ(this->table_.lookup(0), first);
  EXPECT_EQ(this->table_.lookup(kPage), nullptr);
  EXPECT_EQ(this->overlapping(top - 1, ~uintptr_t{0}), std::vector<PgtRegion *>{last});
  PgtRegion *middle = this->add(kPage, top - kPage);  // everything in between
  EXPECT_EQ(this->table_.lookup(kPage), middle);
  EXPECT_EQ(this->table_.lookup(top / 2), middle);
  EXPECT_EQ(this->table_.lookup(top - kPage - 1), middle);
  EXPECT_EQ(this->overlapping(0, ~uintptr_t{0}), (std::vector<PgtRegion *>{first, middle, last}));
  EXPECT_TRUE(this->table_.check_invariants());
  ASSERT_EQ(this->table_.remove(first), MRC_OK);
  ASSERT_EQ(this->table_.remove(last), MRC_OK);
  EXPECT_EQ(this->table_.lookup(top / 3), middle);
  EXPECT_TRUE(this->table_.check_invariants());  // with the nodes the removals kept
  this->table_.settle();
  EXPECT_EQ(this->table_.lookup(top / 3), middle);  // now alone: one partial root entry
  EXPECT_EQ(this->table_.node_count(), 0u);
  EXPECT_EQ(this->table_.lookup(0), nullptr);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, DistantClustersArePathCompressed) {
  // Heap-like low addresses and mmap-like high ones: one node separates them; the depth of a
  // lookup does not pay for the empty levels in between.
  PgtRegion *low = this->add(0x555555554000, 0x555555558000);
  PgtRegion *high = this->add(0x7ffff7a00000, 0x7ffff7c00000);
  EXPECT_EQ(this->table_.node_count(), 1u);
  EXPECT_EQ(this->table_.lookup(0x555555557fff), low);
  EXPECT_EQ(this->table_.lookup(0x7ffff7bfffff), high);
  EXPECT_EQ(this->table_.lookup(0x655555557fff), nullptr);
  // A third region between them and close to one of them, then away again.
  PgtRegion *near = this->add(0x555555560000, 0x555555561000);
  EXPECT_EQ(this->table_.lookup(0x555555560000), near);
  EXPECT_EQ(this->table_.lookup(0x555555559000), nullptr);
  EXPECT_TRUE(this->table_.check_invariants());
  ASSERT_EQ(this->table_.remove(near), MRC_OK);
  this->table_.settle();  // the canonical form, without the node the removal kept
  EXPECT_EQ(this->table_.node_count(), 1u);
  ASSERT_EQ(this->table_.remove(low), MRC_OK);
  this->table_.settle();
  EXPECT_EQ(this->table_.node_count(), 0u);
  EXPECT_EQ(this->table_.lookup(0x7ffff7a00000), high);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, AddressesMissingAPathCompressedNodeAreMisses) {
  // Two regions 64 pages apart in one 2^19-byte block sit in a node well below the root; an
  // address that shares the root slot but not the node's prefix must not alias into it.
  const uintptr_t base = 0x7f0000000000;
  PgtRegion *a = this->add(base, base + kPage);
  PgtRegion *b = this->add(base + 64 * kPage, base + 65 * kPage);
  for (unsigned bit = 19; bit < 57; ++bit) {
    EXPECT_EQ(this->table_.lookup(base ^ (uintptr_t{1} << bit)), nullptr) << bit;
    EXPECT_EQ(this->table_.lookup((base + 64 * kPage) ^ (uintptr_t{1} << bit)), nullptr) << bit;
  }
  EXPECT_EQ(this->table_.lookup(base), a);
  EXPECT_EQ(this->table_.lookup(base + 64 * kPage), b);
}

TYPED_TEST(PgtableTest, PurgeVisitsEachRegionOnceInOrderAndEmptiesTheTable) {
  std::vector<PgtRegion *> expected;
  for (uintptr_t i = 0; i < 300; ++i) {
    const uintptr_t start = 0x10000000 + i * 3 * kPage;
    expected.push_back(this->add(start, start + (i % 2 + 1) * kPage));
  }
  expected.push_back(this->add(0x7f0000000000, 0x7f0000000000 + kTiB / 64));
  ASSERT_GT(this->table_.node_count(), 0u);
  std::vector<PgtRegion *> purged;
  this->table_.purge([&](PgtRegion *region) { purged.push_back(region); });
  EXPECT_EQ(purged, expected);
  EXPECT_EQ(this->table_.size(), 0u);
  EXPECT_EQ(this->table_.node_count(), 0u);
  EXPECT_EQ(this->table_.lookup(0x10000000), nullptr);
  EXPECT_TRUE(this->table_.check_invariants());
  // Usable again.
  PgtRegion *again = this->add(0x10000000, 0x10001000);
  EXPECT_EQ(this->table_.lookup(0x10000fff), again);
}

TYPED_TEST(PgtableTest, PackedBlocksBecomeFlatAndGoBack) {
  using Table = TypeParam;
  if constexpr (!Table::kFlats) {
    GTEST_SKIP() << "this shape has no flat nodes (they would be bigger than 16 KiB)";
  } else {
    // Two one-page regions in every group of leaf-sized blocks, over two level-1 blocks: every
    // group needs a leaf, so each level-1 node becomes flat once kFlatFrom of them have one.
    const uintptr_t base = 0x7f0000000000;
    const uintptr_t group = Table::kLeafFanout * kPage;
    const unsigned groups = 2 * Table::kInnerFanout;
    std::vector<PgtRegion *> first, second;
    size_t bytes_before_flat = 0, bytes_after_flat = 0;
    for (unsigned g = 0; g < groups; ++g) {
      first.push_back(this->add(base + g * group, base + g * group + kPage));
      const size_t bytes = this->table_.memory_bytes();
      const size_t flats = this->table_.flat_count();
      second.push_back(this->add(base + g * group + 2 * kPage, base + g * group + 3 * kPage));
      if (flats == 0 && this->table_.flat_count() == 1) {
        bytes_before_flat = bytes;
        bytes_after_flat = this->table_.memory_bytes();
      }
    }
    EXPECT_EQ(this->table_.flat_count(), 2u);
    // Both flat nodes sit under a level-2 root: the window spells their groups out as leaves.
    EXPECT_EQ(this->table_.window_slots(), 2u * Table::kInnerFanout);
    // The flat node is smaller than the level-1 node and the leaves it replaced (the leaf that
    // made it flat included).
    const size_t leaf_bytes = sizeof(uintptr_t) * (Table::kLeafFanout + 1);
    EXPECT_GT(bytes_before_flat, 0u);
    EXPECT_LT(bytes_after_flat, bytes_before_flat + leaf_bytes);
    EXPECT_TRUE(this->table_.check_invariants());
    for (unsigned g = 0; g < groups; ++g) {
      const uintptr_t at = base + g * group;
      EXPECT_EQ(this->table_.lookup(at + kPage / 2), first[g]);
      EXPECT_EQ(this->table_.lookup(at + kPage), nullptr);
      EXPECT_EQ(this->table_.lookup(at + 3 * kPage - 1), second[g]);
      EXPECT_EQ(this->table_.lookup(at + 3 * kPage), nullptr);
    }
    std::vector<PgtRegion *> all;
    for (unsigned g = 0; g < groups; ++g) {
      all.push_back(first[g]);
      all.push_back(second[g]);
    }
    EXPECT_EQ(this->overlapping(base, base + groups * group), all);
    // A flat node's prefix is checked: the same page offsets in another block miss.
    EXPECT_EQ(this->table_.lookup(base + Table::block_size(2) * 4), nullptr);

    // Thinned out group by group, the first block's flat node goes back to a tree once fewer
    // than kFlatUntil of its groups hold two regions.
    for (unsigned g = 0; g < Table::kInnerFanout; ++g) {
      ASSERT_EQ(this->table_.remove(second[g]), MRC_OK);
      const bool leafy_enough = Table::kInnerFanout - (g + 1) >= Table::kFlatUntil;
      EXPECT_EQ(this->table_.flat_count(), leafy_enough ? 2u : 1u) << g;
      EXPECT_EQ(this->table_.lookup(base + g * group + 2 * kPage), nullptr);
      EXPECT_EQ(this->table_.lookup(base + g * group), first[g]);
    }
    EXPECT_TRUE(this->table_.check_invariants());
    EXPECT_EQ(this->table_.lookup(base + (Table::kInnerFanout + 1) * group + 2 * kPage),
              second[Table::kInnerFanout + 1]);
  }
}

// The root window (pgtable.h, shape notes): built when the root is a level-2 node whose occupied
// slots are mostly level-1 nodes, kept equal to the tree through every change (check_invariants()
// compares them slot by slot), rebuilt when the root's slots spread, dropped when they thin out
// or the root changes; lookups through it find what the tree holds.
TYPED_TEST(PgtableTest, RootWindowFollowsTheTree) {
  using Table = TypeParam;
  const uintptr_t base = 0x7f0000000000;  // aligned to the level-2 root's block in every shape
  const uintptr_t block = Table::block_size(2);  // a root slot's: one level-1 node's block
  const uintptr_t slot = Table::block_size(1);   // a level-1 slot's
  auto verify = [this](const char *step) { this->verify_lookups(step); };
  // Two regions in each of the first two root slots' blocks: two level-1 nodes.
  std::vector<PgtRegion *> pairs;
  for (uintptr_t b = 0; b < 2; ++b) {
    pairs.push_back(this->add(base + b * block, base + b * block + kPage));
    pairs.push_back(this->add(base + b * block + slot + kPage, base + b * block + 2 * slot));
  }
  EXPECT_EQ(this->table_.window_slots(), 2u * Table::kInnerFanout);
  verify("two level-1 nodes");
  EXPECT_EQ(this->table_.lookup(base + kPage), nullptr);  // gaps miss through the window
  EXPECT_EQ(this->table_.lookup(base + 2 * block), nullptr);
  EXPECT_EQ(this->table_.lookup(base - 1), nullptr);

  // A region spanning a whole root slot's block and part of the next, then a node there: the
  // window grows to cover them, the region spelled out in level-1 slots.
  PgtRegion *wide = this->add(base + 2 * block, base + 3 * block + slot);
  PgtRegion *third = this->add(base + 4 * block - slot, base + 4 * block);
  EXPECT_EQ(this->table_.window_slots(), 4u * Table::kInnerFanout);
  verify("a wide region and a third node");
  EXPECT_EQ(this->table_.lookup(base + 3 * block + 2 * slot), nullptr);
  EXPECT_EQ(this->table_.lookup(base + 2 * block + block / 2), wide);

  // A region in another root block: the root moves up a level, and the window goes (the root
  // holds a region besides the level-2 node: see ClustersFarApartKeepAWindowEach).
  PgtRegion *far =
      this->add(base + 5 * Table::block_size(3), base + 5 * Table::block_size(3) + kPage);
  EXPECT_EQ(this->table_.window_slots(), 0u);
  verify("a far region");
  ASSERT_EQ(this->table_.remove(far), MRC_OK);
  EXPECT_EQ(this->table_.window_slots(), 4u * Table::kInnerFanout);
  verify("the far region gone");

  // Occupied root slots spread out more than twice the nodes: no window; back again after.
  if constexpr (Table::kInnerFanout >= 16) {
    const uintptr_t lone_at = base + (Table::kInnerFanout - 1) * block;
    PgtRegion *lone = this->add(lone_at, lone_at + kPage);
    EXPECT_EQ(this->table_.window_slots(), 0u);
    verify("a lone region at the root's end");
    ASSERT_EQ(this->table_.remove(lone), MRC_OK);
    EXPECT_EQ(this->table_.window_slots(), 4u * Table::kInnerFanout);
  }

  // Thinned out: each removal is mirrored; with one level-1 node left over four root slots the
  // window still pays for itself (a quarter), with none it goes.
  ASSERT_EQ(this->table_.remove(third), MRC_OK);
  ASSERT_EQ(this->table_.remove(pairs[3]), MRC_OK);
  this->table_.settle();
  verify("one node left in the first two blocks");
  EXPECT_EQ(this->table_.window_slots(), 4u * Table::kInnerFanout);
  ASSERT_EQ(this->table_.remove(pairs[1]), MRC_OK);
  this->table_.settle();
  EXPECT_EQ(this->table_.window_slots(), 0u);
  verify("no level-1 node left");
  EXPECT_EQ(this->table_.lookup(base), pairs[0]);
  EXPECT_EQ(this->table_.lookup(base + 3 * block + slot - 1), wide);

  // The window's bytes count as the table's, and go with purge().
  ASSERT_EQ(this->table_.remove(wide), MRC_OK);
  this->add(base + slot, base + slot + kPage);
  EXPECT_EQ(this->table_.window_slots(), 2u * Table::kInnerFanout);
  EXPECT_GT(this->table_.memory_bytes(), 2 * Table::kInnerFanout * sizeof(uintptr_t) +
                                             this->table_.node_count() * sizeof(uintptr_t));
  this->table_.purge([](PgtRegion *) {});
  EXPECT_EQ(this->table_.window_slots(), 0u);
  EXPECT_EQ(this->table_.memory_bytes(), 0u);
}

// Clusters far apart (a process's heap and mmap area) put the root high; when the root holds just
// two level-2 nodes, each gets a window of its own, and lookups pick the right one. With a third
// cluster there are none (lookups go through the tree); when one cluster is left, its node is the
// root and its window holds every region again.
TYPED_TEST(PgtableTest, ClustersFarApartKeepAWindowEach) {
  using Table = TypeParam;
  const uintptr_t cluster = Table::block_size(3);  // a level-2 node's block
  const uintptr_t block = Table::block_size(2);
  const uintptr_t slot = Table::block_size(1);
  const uintptr_t heap = 0x555555000000 & ~(cluster - 1);
  const uintptr_t middle = 0x600000000000;
  const uintptr_t mmap_area = 0x7f0000000000;
  // Two level-1 nodes in the first two blocks of a cluster.
  auto fill = [&](uintptr_t base) {
    std::vector<PgtRegion *> added;
    for (uintptr_t b = 0; b < 2; ++b) {
      added.push_back(this->add(base + b * block, base + b * block + kPage));
      added.push_back(this->add(base + b * block + slot + kPage, base + b * block + 2 * slot));
    }
    return added;
  };
  auto drain = [&](const std::vector<PgtRegion *> &added) {
    for (PgtRegion *region : added) ASSERT_EQ(this->table_.remove(region), MRC_OK);
    this->table_.settle();
  };
  const std::vector<PgtRegion *> in_heap = fill(heap);
  EXPECT_EQ(this->table_.window_slots(), 2u * Table::kInnerFanout);  // the root's
  const std::vector<PgtRegion *> in_mmap = fill(mmap_area);
  EXPECT_EQ(this->table_.window_slots(), 4u * Table::kInnerFanout);
  this->verify_lookups("two clusters");
  for (const uintptr_t base : {heap, mmap_area}) {
    EXPECT_EQ(this->table_.lookup(base + kPage), nullptr);  // a gap inside a window
    EXPECT_EQ(this->table_.lookup(base + 2 * block), nullptr);
    EXPECT_EQ(this->table_.lookup(base - 1), nullptr);  // outside both: through the tree
  }

  // A third cluster between them: no windows while it is there.
  const std::vector<PgtRegion *> in_middle = fill(middle);
  EXPECT_EQ(this->table_.window_slots(), 0u);
  this->verify_lookups("three clusters");
  drain(in_middle);
  EXPECT_EQ(this->table_.window_slots(), 4u * Table::kInnerFanout);
  this->verify_lookups("the middle one gone");

  // One cluster left: its node becomes the root, with the one window.
  drain(in_heap);
  EXPECT_EQ(this->table_.window_slots(), 2u * Table::kInnerFanout);
  this->verify_lookups("the mmap cluster alone");
  EXPECT_EQ(this->table_.lookup(heap + kPage), nullptr);
  drain(in_mmap);
  EXPECT_EQ(this->table_.window_slots(), 0u);
  EXPECT_EQ(this->table_.memory_bytes(), 0u);
}

TYPED_TEST(PgtableTest, ANodeKeptAfterARemovalIsReusedWithoutNodeTraffic) {
  // The cache's miss next to a cached neighbour: one page inserted beside it and removed, again
  // and again. The node separating them stays after the first removal and takes the page back.
  const uintptr_t base = 0x7f0000000000;
  PgtRegion *neighbour = this->add(base + 15 * kPage, base + 16 * kPage);
  PgtRegion *page = this->add(base, base + kPage);
  const size_t nodes = this->table_.node_count();
  ASSERT_GT(nodes, 0u);
  ASSERT_EQ(this->table_.remove(page), MRC_OK);
  EXPECT_EQ(this->table_.kept_count(), 1u);
  EXPECT_EQ(this->table_.node_count(), nodes);
  EXPECT_EQ(this->table_.lookup(base), nullptr);
  EXPECT_EQ(this->table_.lookup(base + 15 * kPage), neighbour);
  EXPECT_EQ(this->table_.lookup(base + 14 * kPage), nullptr);
  EXPECT_EQ(this->overlapping(0, ~uintptr_t{0}), std::vector<PgtRegion *>{neighbour});
  EXPECT_TRUE(this->table_.check_invariants());
  const size_t carved = this->table_.pool().carved_bytes();
  const size_t waiting = this->table_.pool().nodes_waiting();
  for (int round = 0; round < 1000; ++round) {
    ASSERT_EQ(this->table_.insert(page), MRC_OK);
    ASSERT_EQ(this->table_.lookup(base + kPage - 1), page);
    ASSERT_EQ(this->table_.remove(page), MRC_OK);
    ASSERT_EQ(this->table_.lookup(base), nullptr);
  }
  EXPECT_EQ(this->table_.node_count(), nodes);
  EXPECT_EQ(this->table_.pool().carved_bytes(), carved);
  EXPECT_EQ(this->table_.pool().nodes_waiting(), waiting) << "nodes unlinked on the round trips";
  EXPECT_TRUE(this->table_.check_invariants());
  // Left with nothing, a kept node collapses at once.
  ASSERT_EQ(this->table_.remove(neighbour), MRC_OK);
  EXPECT_EQ(this->table_.kept_count(), 0u);
  EXPECT_EQ(this->table_.node_count(), 0u);
  EXPECT_EQ(this->table_.memory_bytes(), 0u);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, KeptNodesAreBoundedAndAgeOut) {
  using Table = TypeParam;
  constexpr unsigned kKept = Table::kKeptNodes;
  const uintptr_t spot = uintptr_t{1} << 32;  // far apart: nothing shared below the top nodes
  // Twice as many removals that could keep their node as there is room for.
  std::vector<PgtRegion *> pages;
  for (uintptr_t i = 0; i < 2 * kKept; ++i) {
    const uintptr_t at = 0x100000000000 + i * spot;
    this->add(at + 3 * kPage, at + 4 * kPage);
    pages.push_back(this->add(at, at + kPage));
  }
  for (PgtRegion *page : pages) ASSERT_EQ(this->table_.remove(page), MRC_OK);
  EXPECT_EQ(this->table_.kept_count(), kKept);
  EXPECT_LE(this->table_.node_count(), this->table_.size() - 1 + kKept * Table::kLevels);
  EXPECT_TRUE(this->table_.check_invariants());
  std::set<const void *> before;
  this->table_.for_each_node([&](const void *node) { before.insert(node); });

  // Removals elsewhere whose node is never wanted again (no insert lands in a kept node, so
  // keeping does not pay): every kAgeRemovals of them the oldest kept node makes room.
  std::vector<PgtRegion *> anchors;
  for (uintptr_t j = 0; j < Table::kAgeRemovals * (kKept + 1); ++j) {
    const uintptr_t at = 0x200000000000 + j * spot;
    anchors.push_back(this->add(at + 3 * kPage, at + 4 * kPage));
  }
  {
    EpochGuard guard(this->domain_);  // nothing is recycled: a node seen again is the same node
    for (PgtRegion *anchor : anchors) {
      PgtRegion *page = this->add(anchor->start - 3 * kPage, anchor->start - 2 * kPage);
      ASSERT_EQ(this->table_.remove(page), MRC_OK);
    }
    EXPECT_EQ(this->table_.kept_count(), kKept);  // the newest ones
    EXPECT_TRUE(this->table_.check_invariants());
    size_t gone = 0;
    std::set<const void *> after;
    this->table_.for_each_node([&](const void *node) { after.insert(node); });
    for (const void *node : before) gone += after.count(node) == 0;
    EXPECT_GE(gone, kKept) << "the first kept nodes are still in the table";
  }
  // And the canonical form is one call away.
  const size_t regions = this->table_.size();
  this->table_.settle();
  EXPECT_EQ(this->table_.kept_count(), 0u);
  EXPECT_LE(this->table_.node_count(), regions - 1);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, InsertsIntoKeptNodesPayForEvictions) {
  using Table = TypeParam;
  constexpr unsigned kKept = Table::kKeptNodes;
  const uintptr_t spot = uintptr_t{1} << 32;
  // kKept spots kept, then a round trip into one of them earns an eviction: the next removal at a
  // new spot keeps its node at once (without kAgeRemovals removals first).
  std::vector<PgtRegion *> pages;
  for (uintptr_t i = 0; i < kKept + 2; ++i) {
    const uintptr_t at = 0x100000000000 + i * spot;
    this->add(at + 3 * kPage, at + 4 * kPage);
    pages.push_back(this->add(at, at + kPage));
  }
  for (unsigned i = 0; i < kKept; ++i) ASSERT_EQ(this->table_.remove(pages[i]), MRC_OK);
  ASSERT_EQ(this->table_.kept_count(), kKept);
  const size_t canonical_later = this->table_.node_count();
  ASSERT_EQ(this->table_.remove(pages[kKept]), MRC_OK);  // no credit: collapses
  EXPECT_EQ(this->table_.node_count(), canonical_later - 1);
  ASSERT_EQ(this->table_.insert(pages[kKept - 1]), MRC_OK);  // lands in a kept node
  ASSERT_EQ(this->table_.remove(pages[kKept - 1]), MRC_OK);
  const size_t nodes = this->table_.node_count();
  ASSERT_EQ(this->table_.remove(pages[kKept + 1]), MRC_OK);  // kept, the oldest evicted
  EXPECT_EQ(this->table_.kept_count(), kKept);
  EXPECT_EQ(this->table_.node_count(), nodes - 1);
  EXPECT_TRUE(this->table_.check_invariants());
  // The evicted node was the oldest: its page needs a new node again, the newest does not.
  ASSERT_EQ(this->table_.insert(pages[kKept + 1]), MRC_OK);
  EXPECT_EQ(this->table_.node_count(), nodes - 1);
  ASSERT_EQ(this->table_.insert(pages[0]), MRC_OK);
  EXPECT_EQ(this->table_.node_count(), nodes);
  EXPECT_EQ(this->table_.lookup(pages[0]->start), pages[0]);
  EXPECT_TRUE(this->table_.check_invariants());
}

TYPED_TEST(PgtableTest, NodesAreReclaimedThroughTheDomain) {
  std::vector<PgtRegion *> regions;
  for (uintptr_t i = 0; i < 64; ++i)
    regions.push_back(this->add(i * 2 * kPage, (i * 2 + 1) * kPage));
  const size_t nodes = this->table_.node_count();
  ASSERT_GT(nodes, 0u);
  this->domain_.synchronize();
  EXPECT_EQ(this->domain_.pending(), 0u);
  for (PgtRegion *region : regions) ASSERT_EQ(this->table_.remove(region), MRC_OK);
  EXPECT_EQ(this->table_.node_count(), 0u);
  this->domain_.synchronize();
  EXPECT_EQ(this->domain_.pending(), 0u);
}

TEST(PgtableNodes, SiblingRegionsShareNodesDensely) {
  // 4096 one-page regions with one-page gaps: the leaves are full, so the table costs about two
  // words per region (the slot of the region and the slot of the gap) plus the leaf's header.
  EpochDomain domain;
  PageTable table(domain);
  std::vector<PgtRegion> regions(4096);
  for (uintptr_t i = 0; i < regions.size(); ++i) {
    regions[i] = {0x7f0000000000 + 2 * i * kPage, 0x7f0000000000 + (2 * i + 1) * kPage};
    ASSERT_EQ(table.insert(&regions[i]), MRC_OK);
  }
  EXPECT_LE(table.memory_bytes(), regions.size() * 19);
  EXPECT_TRUE(table.check_invariants());
  table.purge([](PgtRegion *) {});
  domain.synchronize();
}

}  // namespace
}  // namespace mrc
