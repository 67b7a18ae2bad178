// SPDX-License-Identifier: BSD-3-Clause
// Exactness of the public monitor under concurrent unmaps: the cache's serial-key oracle
// (tests/cache/exact_test.cc) against a registration cache that is not mrcache's, built
// the way libfabric's MR cache is: a table under one mutex, valid() on every hit, the entries an
// invalidation overlaps dropped by notify on the delivery thread, registration before the
// subscription (libfabric's order).
//
// The oracle: registrations are numbered. A thread reads the next number before its mmap; a hit
// whose number is below it was registered before the memory existed: a stale registration.
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mrcache/monitor.h"
#include "tests/monitor/monitor_fixture.h"

namespace mrc::monitor::test {
namespace {

constexpr size_t kMappingPages = 18;

// The runtime's cache: start -> (length, serial), exact ranges.
class RuntimeCache {
 public:
  explicit RuntimeCache(unsigned flags) : one_shot_((flags & MRC_MONITOR_ONE_SHOT) != 0) {
    mrc_monitor_params_t params;
    mrc_monitor_params_init(&params);
    params.notify = [](void *self, void *addr, size_t len) {
      static_cast<RuntimeCache *>(self)->forget(reinterpret_cast<uintptr_t>(addr), len);
    };
    params.notify_arg = this;
    params.flags = flags;
    status_ = mrc_monitor_open(&params, &monitor_);
  }
  ~RuntimeCache() {
    if (monitor_ != nullptr) {
      EXPECT_EQ(mrc_monitor_close(monitor_), MRC_OK);
    }
  }
  mrc_status_t status() const { return status_; }
  uint64_t next_serial() const { return serial_.load(); }

  // The serial of the registration a get of [p, p+length) uses.
  uint64_t get(void *p, size_t length) {
    const auto start = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> hold(mutex_);
    auto found = entries_.find(start);
    if (found != entries_.end() && found->second.length == length &&
        mrc_monitor_valid(monitor_, p, length) == 1) {
      ++hits_;
      return found->second.serial;
    }
    if (found != entries_.end()) drop(found);
    const uint64_t serial = serial_++;  // "registers" the memory
    if (mrc_monitor_subscribe(monitor_, p, length) == MRC_OK) {
      entries_[start] = Entry{length, serial};
    }
    return serial;
  }
  uint64_t hits() const { return hits_; }
  mrc_monitor_t *monitor() const { return monitor_; }

 private:
  struct Entry {
    size_t length;
    uint64_t serial;
  };
  void forget(uintptr_t start, size_t length) {
    const uintptr_t end = length > UINTPTR_MAX - start ? UINTPTR_MAX : start + length;
    std::lock_guard<std::mutex> hold(mutex_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->first < end && start < it->first + it->second.length ? drop(it) : ++it;
    }
  }

  // A runtime that unsubscribes what it forgets; one-shot subscriptions ended with the delivery.
  std::map<uintptr_t, Entry>::iterator drop(std::map<uintptr_t, Entry>::iterator it) {
    if (!one_shot_) {
      EXPECT_EQ(
          mrc_monitor_unsubscribe(monitor_, reinterpret_cast<void *>(it->first), it->second.length),
          MRC_OK);
    }
    return entries_.erase(it);
  }

  const bool one_shot_;
  mrc_monitor_t *monitor_ = nullptr;
  mrc_status_t status_;
  std::mutex mutex_;
  std::map<uintptr_t, Entry> entries_;
  std::atomic<uint64_t> serial_{1};
  uint64_t hits_ = 0;
};

struct Tally {
  std::atomic<uint64_t> gets{0}, stale{0}, failed{0};
};

// Each thread: mmap, get twice (a hit, unless something intervened), munmap, `rounds` times.
void run_churn(RuntimeCache &cache, unsigned threads, unsigned rounds, Tally &tally) {
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (unsigned i = 0; i < rounds; ++i) {
        const uint64_t floor = cache.next_serial();
        const size_t length = kMappingPages * kPage;
        void *p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
          ++tally.failed;
          continue;
        }
        for (int use = 0; use < 2; ++use) {
          ++tally.gets;
          if (cache.get(p, length) < floor) ++tally.stale;
        }
        munmap(p, length);
      }
    });
  }
  for (std::thread &worker : workers) worker.join();
}

class MonitorExactChurn : public ::testing::TestWithParam<std::tuple<unsigned, unsigned>> {};

TEST_P(MonitorExactChurn, NoHitIsOnARegistrationOlderThanItsMemory) {
  const auto [threads, flags] = GetParam();
  RuntimeCache cache(flags);
  if (cache.status() == MRC_ERR_UNSUPPORTED) GTEST_SKIP() << mrc_last_error();
  ASSERT_EQ(cache.status(), MRC_OK) << mrc_last_error();
  Tally tally;
  const unsigned rounds = 12000 / threads;
  if ((flags & MRC_MONITOR_DELIVERY_THREAD) != 0) {
    run_churn(cache, threads, rounds, tally);
  } else {
    // The runtime delivers from a thread of its own.
    std::atomic<bool> done{false};
    std::thread deliverer([&] {
      while (!done.load()) EXPECT_EQ(mrc_monitor_deliver(cache.monitor(), nullptr), MRC_OK);
    });
    run_churn(cache, threads, rounds, tally);
    done = true;
    deliverer.join();
  }
  EXPECT_EQ(tally.stale.load(), 0u)
      << "a hit used a registration of an earlier mapping at the same address";
  EXPECT_EQ(tally.failed.load(), 0u);
  EXPECT_EQ(tally.gets.load(), uint64_t{2} * rounds * threads);
  mrc_monitor_stats_t s{};
  ASSERT_EQ(mrc_monitor_stats(cache.monitor(), &s), MRC_OK);
  EXPECT_GT(cache.hits(), 0u) << "the cache never hit: the oracle checked nothing";
  EXPECT_GT(s.notifications, 0u);
  EXPECT_GT(s.valid_checks, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Threads, MonitorExactChurn,
    ::testing::Combine(::testing::Values(2U, 4U, 8U),
                       ::testing::Values(MRC_MONITOR_DELIVERY_THREAD | MRC_MONITOR_ONE_SHOT, 0U)),
    [](const ::testing::TestParamInfo<std::tuple<unsigned, unsigned>> &param) {
      return std::to_string(std::get<0>(param.param)) + "threads_" +
             (std::get<1>(param.param) != 0 ? "one_shot_thread" : "delivered_by_runtime");
    });

}  // namespace
}  // namespace mrc::monitor::test
