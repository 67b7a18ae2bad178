// SPDX-License-Identifier: BSD-3-Clause
// libfabric's MR cache, its one concurrent behaviour: util_mr_cache_create registers outside the
// cache's lock and, when another thread inserted an entry for the same range meanwhile, drops
// its own and searches again (-FI_EAGAIN), so concurrent misses end with one cached entry.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "conformance.h"

namespace conformance {
namespace {

using LibfabricMt = Conformance;

TEST_F(LibfabricMt, EightThreadsMissingOnOneRangeAtOnceShareOneRegistration) {
  // libfabric util_mr_cache.c, util_mr_cache_create's -FI_EAGAIN retry (8 threads: the peer has
  // no thread count for it). mrcache serialises its slow path, so only one thread registers.
  constexpr int kThreads = 8;
  const size_t size = 64 * kPage;
  char *mem = alloc_pages(size);
  std::vector<uint64_t> keys(kThreads);
  std::atomic<int> next{0};
  run_on_threads(kThreads, [&](Barrier &barrier) {
    const int me = next++;
    barrier.wait();
    mrc_region_t *region = get(mem, size);
    keys[me] = key(region);
    barrier.wait();  // every thread holds its reference at once
    put(region);
  });
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(keys[i], keys[0]) << "thread " << i;
  EXPECT_EQ(backend.regs(), 1u);
  EXPECT_EQ(stats().regions, 1u);
  free_pages(mem, size);
}

}  // namespace
}  // namespace conformance
