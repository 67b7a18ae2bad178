// SPDX-License-Identifier: BSD-3-Clause
// The node pool's huge chunks when the kernel refuses MADV_HUGEPAGE (no transparent huge pages,
// a seccomp filter, an old kernel): the advice is only advice, so the chunks must serve nodes as
// usual. A program of its own: it replaces madvise() for everything it links.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <deque>

#include "base/epoch.h"
#include "pgtable/node_pool.h"
#include "pgtable/pgtable.h"

namespace {
std::atomic<bool> refuse_huge_pages{false};
std::atomic<int> huge_page_requests{0};
}  // namespace

// Every madvise() of the program, the pool's included (its objects are linked in, so this
// definition is the one they call).
extern "C" int madvise(void *address, size_t length, int advice) noexcept {
  if (advice == MADV_HUGEPAGE) {
    huge_page_requests.fetch_add(1);
    if (refuse_huge_pages.load()) {
      errno = EINVAL;
      return -1;
    }
  }
  return static_cast<int>(syscall(SYS_madvise, address, length, advice));
}

namespace mrc {
namespace {

constexpr uintptr_t kPage = 4096;

// Pairs of one-page regions in every other 64 KiB block, a leaf for each pair: enough nodes to
// fill the small chunks and several huge ones.
void fill_and_check(bool refuse) {
  refuse_huge_pages = refuse;
  huge_page_requests = 0;
  EpochDomain domain;
  {
    PageTable table(domain);
    std::deque<PgtRegion> regions;
    for (uintptr_t i = 0; i < 30000; ++i) {
      const uintptr_t block = 0x7f0000000000 + i * 32 * kPage;
      regions.push_back({block, block + kPage});
      regions.push_back({block + 2 * kPage, block + 3 * kPage});
    }
    for (PgtRegion &region : regions) ASSERT_EQ(table.insert(&region), MRC_OK);
    EXPECT_GT(huge_page_requests.load(), 0) << "no chunk was big enough to ask for huge pages";
    EXPECT_GE(table.pool().mapped_bytes(), 2 * detail::NodePool::kHugeChunk);
    for (PgtRegion &region : regions) {
      ASSERT_EQ(table.lookup(region.start), &region);
      ASSERT_EQ(table.lookup(region.end), nullptr);
    }
    EXPECT_TRUE(table.check_invariants());
    for (size_t i = 0; i < regions.size(); i += 2) ASSERT_EQ(table.remove(&regions[i]), MRC_OK);
    for (size_t i = 0; i < regions.size(); i += 2) ASSERT_EQ(table.insert(&regions[i]), MRC_OK);
    EXPECT_TRUE(table.check_invariants());
    table.purge([](PgtRegion *) {});
  }
  domain.synchronize();
}

TEST(NodePoolHugePages, ChunksServeNodesWhenTheKernelRefusesHugePages) { fill_and_check(true); }

TEST(NodePoolHugePages, ChunksServeNodesWhenTheKernelTakesTheAdvice) { fill_and_check(false); }

}  // namespace
}  // namespace mrc
