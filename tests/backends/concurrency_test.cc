// SPDX-License-Identifier: BSD-3-Clause
// The backends under concurrent use (label concurrency: the TSan lane runs these): null
// serials from many threads and contexts, io_uring slot allocation from many threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <unordered_set>
#include <vector>

#include "helpers.h"
#include "mrcache/mrcache.h"

namespace {

using namespace mrc_test;  // NOLINT(google-build-using-namespace): test helpers

char g_memory[4096];

mrc_status_t NullReg(void *ctx, void **handle, uint64_t *key) {
  return mrc_backend_null()->reg(ctx, g_memory, sizeof g_memory, MRC_PROT_READ, handle, key);
}

TEST(NullBackend, SerialsAreUniqueAndNeverReusedAcrossContextsAndThreads) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 5000;
  NullCtx shared;
  std::vector<std::vector<uint64_t>> keys(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Threads alternate between no context, the shared context and a context of their own.
      NullCtx own;
      void *ctx = t % 3 == 0 ? nullptr : t % 3 == 1 ? static_cast<void *>(shared.ctx) : own.ctx;
      for (int i = 0; i < kPerThread; ++i) {
        void *h = nullptr;
        uint64_t key = 0;
        ASSERT_EQ(NullReg(ctx, &h, &key), MRC_OK);
        keys[t].push_back(key);
        // Deregistering at once must not make the serial available again.
        mrc_backend_null()->dereg(ctx, h);
      }
    });
  }
  for (auto &th : threads) th.join();
  std::unordered_set<uint64_t> all;
  for (const auto &per_thread : keys) {
    ASSERT_TRUE(std::is_sorted(per_thread.begin(), per_thread.end()));
    for (uint64_t k : per_thread) {
      EXPECT_NE(k, 0u);
      EXPECT_TRUE(all.insert(k).second) << "serial " << k << " handed out twice";
    }
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
}

TEST(IouringBackend, ManyThreadsRegisterConcurrently) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 3000;
  constexpr int kLivePerThread = 6;
  constexpr unsigned kSlots = 32;  // < kThreads * kLivePerThread * 2: slots get recycled
  IouringCtx c(kSlots);
  Mapping m(size_t{kThreads} * kLivePerThread * 4096);
  std::vector<std::atomic<int>> owner(kSlots);
  std::atomic<int> double_owned{0}, failures{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Registration> live;
      for (int round = 0; round < kRounds; ++round) {
        if (live.size() == kLivePerThread) {
          const Registration r = live[round % kLivePerThread];
          live.erase(live.begin() + round % kLivePerThread);
          owner[r.key].store(0);
          Ops().dereg(c.ctx, r.handle);
        }
        Registration r;
        char *addr = m.bytes() + (static_cast<size_t>(t) * kLivePerThread + live.size()) * 4096;
        if (Ops().reg(c.ctx, addr, 4096, MRC_PROT_WRITE, &r.handle, &r.key) != MRC_OK) {
          failures.fetch_add(1);
          continue;
        }
        if (owner[r.key].exchange(t + 1) != 0) double_owned.fetch_add(1);
        live.push_back(r);
      }
      for (const Registration &r : live) {
        owner[r.key].store(0);
        Ops().dereg(c.ctx, r.handle);
      }
    });
  }
  for (auto &th : threads) th.join();
  EXPECT_EQ(double_owned.load(), 0);
  EXPECT_EQ(failures.load(), 0) << LastError();
  const auto s = c.slots();
  EXPECT_EQ(s.installed, 0u);
  EXPECT_EQ(s.awaiting + s.free, kSlots);
}

}  // namespace
