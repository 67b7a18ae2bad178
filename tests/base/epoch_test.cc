// SPDX-License-Identifier: BSD-3-Clause
// Epoch-based reclamation: what retire() frees, when, and what delays it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/epoch.h"

namespace mrc {
namespace {

using namespace std::chrono_literals;

// A retired object that records its reclamation.
struct Tracked {
  std::atomic<int> *reclaimed;
  static void reclaim(void *object) {
    auto *tracked = static_cast<Tracked *>(object);
    tracked->reclaimed->fetch_add(1);
    delete tracked;
  }
};

void retire_tracked(EpochDomain &domain, std::atomic<int> &reclaimed) {
  domain.retire(new Tracked{&reclaimed}, &Tracked::reclaim);
}

// A thread that holds a guard until released.
class GuardHolder {
 public:
  explicit GuardHolder(EpochDomain &domain) {
    thread_ = std::thread([this, &domain] {
      EpochGuard guard(domain);
      inside_.store(true);
      while (!release_.load()) std::this_thread::sleep_for(100us);
    });
    while (!inside_.load()) std::this_thread::yield();
  }
  ~GuardHolder() { release(); }
  void release() {
    release_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> inside_{false}, release_{false};
  std::thread thread_;
};

class EpochTest : public ::testing::TestWithParam<EpochBarrier> {
 protected:
  EpochDomain domain_{GetParam()};
};

std::string barrier_name(const ::testing::TestParamInfo<EpochBarrier> &param_info) {
  return param_info.param == EpochBarrier::Auto ? "Auto" : "Fences";
}

INSTANTIATE_TEST_SUITE_P(Barriers, EpochTest,
                         ::testing::Values(EpochBarrier::Auto, EpochBarrier::Fences),
                         &barrier_name);

TEST_P(EpochTest, RetireThenSynchronizeFrees) {
  std::atomic<int> reclaimed{0};
  for (int i = 0; i < 10; ++i) retire_tracked(domain_, reclaimed);
  EXPECT_EQ(domain_.pending() + static_cast<size_t>(reclaimed.load()), 10u);
  domain_.synchronize();
  EXPECT_EQ(reclaimed.load(), 10);
  EXPECT_EQ(domain_.pending(), 0u);
}

TEST_P(EpochTest, RetireManyWaitsForGuardsLikeRetire) {
  std::atomic<int> reclaimed{0};
  void *objects[200];
  for (void *&object : objects) object = new Tracked{&reclaimed};
  {
    GuardHolder holder(domain_);
    domain_.retire_many(objects, 200, &Tracked::reclaim);  // more than a batch and a chunk
    domain_.poll();
    EXPECT_EQ(reclaimed.load(), 0) << "reclaimed under a guard that was active at retirement";
    EXPECT_EQ(domain_.pending(), 200u);
  }
  domain_.synchronize();
  EXPECT_EQ(reclaimed.load(), 200);
  EXPECT_EQ(domain_.pending(), 0u);
}

TEST_P(EpochTest, PollReclaimsWhenNoReaderIsInside) {
  std::atomic<int> reclaimed{0};
  retire_tracked(domain_, reclaimed);
  EXPECT_EQ(reclaimed.load(), 0);  // below the batch size: waits for a poll
  domain_.poll();
  EXPECT_EQ(reclaimed.load(), 1);
}

TEST_P(EpochTest, AGuardHeldDelaysReclamation) {
  std::atomic<int> reclaimed{0};
  GuardHolder holder(domain_);
  retire_tracked(domain_, reclaimed);
  for (int i = 0; i < 5; ++i) {
    domain_.poll();
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(reclaimed.load(), 0);
  EXPECT_EQ(domain_.pending(), 1u);
  // synchronize() waits for the holder; it returns only after the guard ended.
  std::atomic<bool> synchronized{false};
  std::thread waiter([&] {
    domain_.synchronize();
    synchronized.store(true);
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(synchronized.load());
  EXPECT_EQ(reclaimed.load(), 0);
  holder.release();
  waiter.join();
  EXPECT_TRUE(synchronized.load());
  EXPECT_EQ(reclaimed.load(), 1);
}

TEST_P(EpochTest, WaitForReadersReturnsAfterActiveGuardsEnd) {
  GuardHolder holder(domain_);
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    domain_.wait_for_readers();
    waited.store(true);
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(waited.load());
  holder.release();
  waiter.join();
  EXPECT_TRUE(waited.load());
}

TEST_P(EpochTest, NestedGuardsEndWithTheOutermost) {
  std::atomic<int> reclaimed{0};
  std::atomic<bool> inner_done{false}, release{false};
  std::thread reader([&] {
    EpochGuard outer(domain_);
    { EpochGuard inner(domain_); }
    inner_done.store(true);
    while (!release.load()) std::this_thread::sleep_for(100us);
  });
  while (!inner_done.load()) std::this_thread::yield();
  retire_tracked(domain_, reclaimed);
  domain_.poll();
  std::this_thread::sleep_for(5ms);
  domain_.poll();
  EXPECT_EQ(reclaimed.load(), 0);  // the outer guard still protects it
  release.store(true);
  reader.join();
  domain_.poll();
  EXPECT_EQ(reclaimed.load(), 1);
}

TEST_P(EpochTest, GuardsOnTheRetiringThreadAreFine) {
  std::atomic<int> reclaimed{0};
  {
    EpochGuard guard(domain_);
    EXPECT_TRUE(domain_.in_guard());
    retire_tracked(domain_, reclaimed);
    domain_.poll();
    EXPECT_EQ(reclaimed.load(), 0);  // our own guard delays it
  }
  EXPECT_FALSE(domain_.in_guard());
  domain_.poll();
  EXPECT_EQ(reclaimed.load(), 1);
}

TEST_P(EpochTest, RetiredListsStayBoundedWithoutReaders) {
  std::atomic<int> reclaimed{0};
  size_t most_pending = 0;
  for (int i = 0; i < 20'000; ++i) {
    retire_tracked(domain_, reclaimed);
    most_pending = std::max(most_pending, domain_.pending());
  }
  EXPECT_LE(most_pending, 2 * EpochDomain::kBatch);
  domain_.synchronize();
  EXPECT_EQ(reclaimed.load(), 20'000);
}

TEST_P(EpochTest, RetiredListsCatchUpAfterAStuckReader) {
  std::atomic<int> reclaimed{0};
  {
    GuardHolder holder(domain_);
    for (int i = 0; i < 1000; ++i) retire_tracked(domain_, reclaimed);
    EXPECT_EQ(reclaimed.load(), 0);
    EXPECT_EQ(domain_.pending(), 1000u);
  }
  retire_tracked(domain_, reclaimed);  // the next retire or poll reclaims the backlog
  domain_.poll();
  domain_.poll();
  EXPECT_EQ(reclaimed.load(), 1001);
}

TEST_P(EpochTest, ThreadsExitingReleaseTheirSlots) {
  const size_t before = domain_.registered_threads();
  {
    std::vector<std::thread> threads;
    std::atomic<int> inside{0};
    std::atomic<bool> release{false};
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&] {
        EpochGuard guard(domain_);
        inside.fetch_add(1);
        while (!release.load()) std::this_thread::sleep_for(100us);
      });
    }
    while (inside.load() < 4) std::this_thread::yield();
    EXPECT_EQ(domain_.registered_threads(), before + 4);
    release.store(true);
    for (auto &t : threads) t.join();
  }
  EXPECT_EQ(domain_.registered_threads(), before);
  // Many short-lived threads reuse the same few slots.
  for (int i = 0; i < 200; ++i) {
    std::thread([&] { EpochGuard guard(domain_); }).join();
  }
  EXPECT_EQ(domain_.registered_threads(), before);
  EXPECT_LE(domain_.slot_capacity(), 64u);
  // And a reader that exited never holds up a grace period.
  std::atomic<int> reclaimed{0};
  retire_tracked(domain_, reclaimed);
  domain_.synchronize();
  EXPECT_EQ(reclaimed.load(), 1);
}

TEST_P(EpochTest, CallbacksMayRetireMore) {
  static std::atomic<int> second{0};
  second = 0;
  struct Chain {
    EpochDomain *domain;
    static void reclaim(void *object) {
      auto *chain = static_cast<Chain *>(object);
      chain->domain->retire(chain, [](void *o) {
        second.fetch_add(1);
        delete static_cast<Chain *>(o);
      });
    }
  };
  domain_.retire(new Chain{&domain_}, &Chain::reclaim);
  domain_.synchronize();  // runs the first callback, which retires again
  domain_.synchronize();
  EXPECT_EQ(second.load(), 1);
}

TEST_P(EpochTest, DestroyingADomainReclaimsWhatIsPending) {
  std::atomic<int> reclaimed{0};
  {
    EpochDomain domain(GetParam());
    for (int i = 0; i < 5; ++i) retire_tracked(domain, reclaimed);
    { EpochGuard guard(domain); }
  }
  EXPECT_EQ(reclaimed.load(), 5);
  // This thread's stale slot cache for the dead domain is harmless: a new domain works.
  EpochDomain another(GetParam());
  { EpochGuard guard(another); }
  retire_tracked(another, reclaimed);
  another.synchronize();
  EXPECT_EQ(reclaimed.load(), 6);
}

// Readers dereference a shared object under guards while a writer swaps and retires it; a
// reclaimed object is poisoned first, so a reader that sees poison caught a use after free.
TEST_P(EpochTest, ReadersNeverSeeReclaimedObjects) {
  struct Box {
    std::atomic<uint64_t> value;
    std::atomic<uint64_t> alive;
  };
  static constexpr uint64_t kAlive = 0xA11CE, kPoison = 0xDEAD;
  std::atomic<Box *> current{new Box{{0}, {kAlive}}};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, bad{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        EpochGuard guard(domain_);
        Box *box = current.load(std::memory_order_acquire);
        if (box->alive.load(std::memory_order_relaxed) != kAlive) bad.fetch_add(1);
        (void)box->value.load(std::memory_order_relaxed);
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
#if defined(MRC_TSAN)
  constexpr int kSwaps = 5'000;
#else
  constexpr int kSwaps = 50'000;
#endif
  auto poison_and_free = [](void *object) {
    auto *box = static_cast<Box *>(object);
    box->alive.store(kPoison, std::memory_order_relaxed);
    delete box;
  };
  // Swap at least kSwaps times, and until the readers have really overlapped with the swaps (on
  // a loaded machine they may start late); a deadline keeps a starved run bounded.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (int i = 1;
       i <= kSwaps || (reads.load() < 1000 && std::chrono::steady_clock::now() < deadline); ++i) {
    Box *old = current.exchange(new Box{{static_cast<uint64_t>(i)}, {kAlive}});
    domain_.retire(old, poison_and_free);
  }
  stop.store(true);
  for (auto &t : readers) t.join();
  delete current.load();
  domain_.synchronize();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(reads.load(), 0u);
  EXPECT_EQ(domain_.pending(), 0u);
}

TEST(EpochDomainTest, ProcessDomainUsesMembarrierWhenTheKernelHasIt) {
#if defined(MRC_TSAN)
  GTEST_SKIP() << "ThreadSanitizer builds always use fences";
#else
  { EpochGuard guard; }  // decides the mode
  if (!epoch_domain().uses_membarrier()) {
    GTEST_SKIP() << "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) unavailable on this kernel";
  }
  EXPECT_TRUE(epoch_domain().uses_membarrier());
  EpochDomain fences(EpochBarrier::Fences);
  { EpochGuard guard(fences); }
  EXPECT_FALSE(fences.uses_membarrier());
#endif
}

TEST(EpochDomainTest, ProcessDomainWorks) {
  std::atomic<int> reclaimed{0};
  { EpochGuard guard; }
  retire_tracked(epoch_domain(), reclaimed);
  epoch_domain().synchronize();
  EXPECT_EQ(reclaimed.load(), 1);
}

TEST(EpochDeathTest, SynchronizeInsideAGuardAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EpochDomain domain;
  EXPECT_DEATH(
      {
        EpochGuard guard(domain);
        domain.synchronize();
      },
      "internal check failed");
}

TEST(EpochDeathTest, WaitForReadersInsideAGuardAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EpochDomain domain;
  EXPECT_DEATH(
      {
        EpochGuard guard(domain);
        domain.wait_for_readers();
      },
      "internal check failed");
}

TEST(EpochForkTest, ChildDoesNotWaitForParentThreads) {
#if defined(MRC_TSAN)
  GTEST_SKIP() << "fork() of a multithreaded process is unreliable under ThreadSanitizer";
#else
  std::atomic<int> reclaimed{0};
  GuardHolder holder(epoch_domain());  // a thread that will not exist in the child
  retire_tracked(epoch_domain(), reclaimed);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(10);  // a hang is a failure, not a stuck test run
    epoch_domain().synchronize();
    { EpochGuard guard; }
    _exit(reclaimed.load() == 1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_EQ(reclaimed.load(), 0);  // the parent's holder still protects it here
  holder.release();
  epoch_domain().synchronize();
  EXPECT_EQ(reclaimed.load(), 1);
#endif
}

}  // namespace
}  // namespace mrc
