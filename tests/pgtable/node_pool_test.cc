// SPDX-License-Identifier: BSD-3-Clause
// The page table's node pool: unlinked nodes come back only after the readers that might have
// seen them are gone, churn reuses nodes instead of growing, and a table may die while its
// nodes still wait for readers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <set>
#include <thread>
#include <vector>

#include "base/epoch.h"
#include "pgtable/pgtable.h"

namespace mrc {
namespace {

constexpr uintptr_t kPage = 4096;
constexpr uintptr_t kBase = 0x7f0000000000;

// Pairs of one-page regions in every other 64 KiB block: each pair needs a leaf, the pairs need
// inner nodes above them, and no level-1 node has enough leaves to become flat.
std::deque<PgtRegion> make_pairs(uintptr_t base, size_t pairs) {
  std::deque<PgtRegion> regions;
  for (uintptr_t i = 0; i < pairs; ++i) {
    const uintptr_t block = base + i * 32 * kPage;
    regions.push_back({block, block + kPage});
    regions.push_back({block + 2 * kPage, block + 3 * kPage});
  }
  return regions;
}

std::set<const void *> nodes_of(const PageTable &table) {
  std::set<const void *> nodes;
  table.for_each_node([&](const void *node) { nodes.insert(node); });
  return nodes;
}

size_t common(const std::set<const void *> &a, const std::set<const void *> &b) {
  std::vector<const void *> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return both.size();
}

TEST(NodePool, ReusesANodeOnlyAfterTheReadersThatMightHaveSeenItAreGone) {
  EpochDomain domain;
  PageTable table(domain);
  std::deque<PgtRegion> first = make_pairs(kBase, 300);
  for (PgtRegion &region : first) ASSERT_EQ(table.insert(&region), MRC_OK);
  const std::set<const void *> old_nodes = nodes_of(table);
  ASSERT_GT(old_nodes.size(), 300u);

  std::deque<PgtRegion> second = make_pairs(kBase + (uintptr_t{1} << 32), 300);
  {
    // A reader that started before the removals, and may still be looking at those nodes.
    EpochGuard reader(domain);
    for (PgtRegion &region : first) ASSERT_EQ(table.remove(&region), MRC_OK);
    EXPECT_EQ(table.node_count(), 0u);
    domain.poll();  // a grace period starts; it cannot end while the reader is inside
    for (PgtRegion &region : second) ASSERT_EQ(table.insert(&region), MRC_OK);
    EXPECT_EQ(common(old_nodes, nodes_of(table)), 0u) << "a node was reused under a reader";
    EXPECT_GE(table.pool().nodes_waiting(), old_nodes.size() - detail::NodePool::kBatchNodes);
    for (PgtRegion &region : second) ASSERT_EQ(table.remove(&region), MRC_OK);
  }
  // The reader has left: after a grace period the old nodes serve new inserts.
  domain.synchronize();
  const size_t carved = table.pool().carved_bytes();
  for (PgtRegion &region : first) ASSERT_EQ(table.insert(&region), MRC_OK);
  EXPECT_GT(common(old_nodes, nodes_of(table)), 0u) << "nodes were not recycled";
  EXPECT_EQ(table.pool().carved_bytes(), carved) << "new memory carved while free nodes waited";
  EXPECT_TRUE(table.check_invariants());
  table.purge([](PgtRegion *) {});
  domain.synchronize();
}

TEST(NodePool, ChurnReusesNodesInsteadOfGrowing) {
  EpochDomain domain;
  PageTable table(domain);
  std::deque<PgtRegion> fixed = make_pairs(kBase, 64);
  for (PgtRegion &region : fixed) ASSERT_EQ(table.insert(&region), MRC_OK);
  // A region beside each fixed one and back: a node made and unlinked every time.
  std::vector<PgtRegion> beside;
  for (uintptr_t i = 0; i < 64; ++i) {
    const uintptr_t block = kBase + i * 32 * kPage;
    beside.push_back({block + 8 * kPage, block + 9 * kPage});
  }
  size_t carved_after_warmup = 0;
  for (int round = 0; round < 200; ++round) {
    for (PgtRegion &region : beside) {
      ASSERT_EQ(table.insert(&region), MRC_OK);
      ASSERT_EQ(table.remove(&region), MRC_OK);
    }
    if (round == 20) carved_after_warmup = table.pool().carved_bytes();
  }
  EXPECT_EQ(table.pool().carved_bytes(), carved_after_warmup);
  // Bounded by what waits for readers, not by the number of rounds.
  EXPECT_LE(table.pool().nodes_waiting(),
            (detail::NodePool::kPollAfter + 1) * detail::NodePool::kBatchNodes);
  EXPECT_TRUE(table.check_invariants());
  table.purge([](PgtRegion *) {});
  domain.synchronize();
}

TEST(NodePool, TableMayDieWhileItsNodesWaitForReaders) {
  EpochDomain domain;
  std::atomic<int> phase{0};
  std::thread reader([&] {
    EpochGuard guard(domain);
    phase.store(1);
    while (phase.load() != 2) std::this_thread::yield();
  });
  while (phase.load() != 1) std::this_thread::yield();
  {
    PageTable table(domain);
    std::deque<PgtRegion> regions = make_pairs(kBase, 1000);
    for (PgtRegion &region : regions) ASSERT_EQ(table.insert(&region), MRC_OK);
    for (PgtRegion &region : regions) ASSERT_EQ(table.remove(&region), MRC_OK);
    domain.poll();
    ASSERT_GT(table.pool().nodes_waiting(), 0u);
  }  // destroyed with batches in flight: they own the chunks now
  EXPECT_GT(domain.pending(), 0u);
  phase.store(2);
  reader.join();
  domain.synchronize();  // the callbacks free the batches, the last one the chunks
  EXPECT_EQ(domain.pending(), 0u);
}

TEST(NodePool, RejectedInsertsGiveTheirNodesBack) {
  EpochDomain domain;
  PageTable table(domain);
  std::deque<PgtRegion> regions = make_pairs(kBase, 16);
  for (PgtRegion &region : regions) ASSERT_EQ(table.insert(&region), MRC_OK);
  const size_t carved = table.pool().carved_bytes();
  // Overlaps found before any node is taken, many times over: nothing is carved.
  for (int i = 0; i < 1000; ++i) {
    PgtRegion overlapping{kBase, kBase + 4 * kPage};
    ASSERT_EQ(table.insert(&overlapping), MRC_ERR_EXISTS);
  }
  EXPECT_EQ(table.pool().carved_bytes(), carved);
  table.purge([](PgtRegion *) {});
  domain.synchronize();
}

}  // namespace
}  // namespace mrc
