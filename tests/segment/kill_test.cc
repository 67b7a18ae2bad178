// SPDX-License-Identifier: BSD-3-Clause
// kill -9 of a helper process at random moments, over and over: the next process recovers
// the domain lock and the heap lock within a second and finds everything consistent.
// MRC_SEG_KILLS: how many kills (1,000 in the default suite, 10,000 under the slow label).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "mrcache/mrcache.h"
#include "seg_test_util.h"

#ifndef MRC_SEG_KILLS
#define MRC_SEG_KILLS 1000
#endif
// ctest names must differ between the default and the slow program.
#if MRC_SEG_KILLS > 1000
#define MRC_KILL_SUITE SlowKillTest
#else
#define MRC_KILL_SUITE KillTest
#endif

namespace {

using segtest::Child;
using segtest::shm_files;

class MRC_KILL_SUITE : public ::testing::Test {
 protected:
  void SetUp() override { prefix_ = segtest::unique_prefix("k"); }
  void TearDown() override { segtest::remove_shm(prefix_); }
  std::vector<std::string> args(const std::string &cmd) {
    return {cmd, "prefix=" + prefix_, "timeout=10000"};
  }
  mrc_seg_domain_t *open() {
    mrc_seg_domain_params_t p;
    mrc_seg_domain_params_init(&p);
    p.prefix = prefix_.c_str();
    p.join_timeout_ms = 10000;
    mrc_seg_domain_t *d = nullptr;
    EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK) << mrc_seg_last_error();
    return d;
  }
  std::string prefix_;
};

// kill -9 at random moments of a process that creates, uses and deletes segments and works on a
// shared heap without pause: most kills land inside the domain or the heap lock.
TEST_F(MRC_KILL_SUITE, KillNineAtRandomMomentsRecoversWithinASecond) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *heap = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "heap", 16 << 20, MRC_SEG_HEAP, &heap), MRC_OK);
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  std::chrono::nanoseconds worst{0};
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < MRC_SEG_KILLS; ++i) {
    Child c = Child::spawn(args("churn"));
    c.expect("ready");
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    const int status = c.kill9();
    ASSERT_TRUE(WIFSIGNALED(status)) << "helper ended by itself: " << status;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(mrc_seg_domain_scan(d), MRC_OK) << mrc_seg_last_error();
    mrc_seg_heap_stats_t hs;
    ASSERT_EQ(mrc_seg_heap_check(heap, &hs), MRC_OK) << i << ": " << mrc_seg_last_error();
    const auto took = std::chrono::steady_clock::now() - t0;
    worst = std::max(worst, std::chrono::duration_cast<std::chrono::nanoseconds>(took));
    ASSERT_LT(took, std::chrono::seconds(1)) << "iteration " << i;
    ASSERT_EQ(mrc_seg_domain_check(d), MRC_OK) << i << ": " << mrc_seg_last_error();
  }
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  mrc_seg_heap_stats_t hs;
  ASSERT_EQ(mrc_seg_heap_check(heap, &hs), MRC_OK);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%d kills in %.1f s: %llu inside the domain lock, %llu inside the heap lock, "
      "%llu clients reaped; slowest recovery %.2f ms\n",
      MRC_SEG_KILLS, secs, static_cast<unsigned long long>(di.repairs),
      static_cast<unsigned long long>(hs.repairs),
      static_cast<unsigned long long>(di.clients_reaped), worst.count() / 1e6);
  EXPECT_EQ(di.clients_reaped, static_cast<uint64_t>(MRC_SEG_KILLS));
  EXPECT_GT(di.repairs + hs.repairs, static_cast<uint64_t>(MRC_SEG_KILLS / 10))
      << "the kills rarely landed inside a lock: the test lost its point";
  EXPECT_EQ(di.segments, 1u);  // only our heap: every dead helper's segments were reaped
  EXPECT_EQ(shm_files(prefix_).size(), 2u);
  EXPECT_EQ(mrc_seg_close(heap), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

}  // namespace
