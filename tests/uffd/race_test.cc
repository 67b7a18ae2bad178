// SPDX-License-Identifier: BSD-3-Clause
// The invariant under concurrency: once munmap has returned, a subscription that trusts its page
// table (quiescent()) has applied the record of that munmap.
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/uffd/fixtures.h"
#include "tests/uffd/helpers.h"
#include "uffd/testing.h"

namespace mrc::uffd::test {
namespace {

using Race = SubscribedTest;

// Stops and joins a thread when the scope ends, even on a failed ASSERT.
class Joined {
 public:
  Joined(std::atomic<bool> *stop, std::thread thread) : stop_(stop), thread_(std::move(thread)) {}
  ~Joined() {
    stop_->store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> *stop_;
  std::thread thread_;
};

// 10^5 rounds: mmap at A, watch, munmap, and at once ask whether the page table may be trusted.
// A drainer thread applies records concurrently, as other threads of a cache would; whenever the
// fast-path check says "trust", the record of the munmap that just returned must be applied.
TEST_F(Race, UnmapThenRemapAtTheSameAddress) {
  const size_t length = 64 << 10;
  std::atomic<uintptr_t> watched_start{0};
  std::mutex drain_lock;  // the cache's lock: one drainer at a time
  std::atomic<uint64_t> applied{0};
  auto apply = [&](const Invalidation &r) {
    const uintptr_t start = watched_start.load(std::memory_order_relaxed);
    if (r.kind == InvalidationKind::Unmap && r.start <= start && r.end >= start + length) {
      applied.fetch_add(1, std::memory_order_relaxed);  // ordered by the cursor's release
    }
  };
  std::atomic<bool> stop{false};
  Joined drainer(&stop, std::thread([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      {
        std::lock_guard<std::mutex> hold(drain_lock);
        EXPECT_EQ(subscription_->drain(apply), DrainResult::Ok);
      }
      std::this_thread::yield();
    }
  }));
  // Reserved after the drainer thread exists: its stack must not land on A.
  char *a = map_anonymous(length);
  ASSERT_EQ(munmap(a, length), 0);
  watched_start.store(u(a));

  const uint64_t rounds = 100000 / kScale;
  uint64_t trusted = 0;
  uint64_t moves = 0;
  uint64_t expected = 0;  // records for the current address that must have been applied
  const auto begin = std::chrono::steady_clock::now();
  for (uint64_t round = 0; round < rounds; ++round) {
    void *p = mmap(a, length, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) {
      // Someone else (a sanitizer's runtime, say) took the address: carry on elsewhere. Every
      // record for the old address has been applied already (checked last round).
      p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(p, MAP_FAILED);
      a = static_cast<char *>(p);
      watched_start.store(u(a));
      expected = applied.load();
      ++moves;
    }
    ASSERT_EQ(p, a) << "round " << round;
    ++expected;
    ASSERT_EQ(uffd::watch(u(a), length), WatchResult::Watched) << "round " << round;
    ASSERT_EQ(munmap(a, length), 0);
    if (subscription_->quiescent()) {
      ++trusted;
      ASSERT_GE(applied.load(std::memory_order_relaxed), expected)
          << "round " << round << ": trusted the page table before the unmap was applied";
    } else {
      std::lock_guard<std::mutex> hold(drain_lock);
      ASSERT_EQ(subscription_->drain(apply), DrainResult::Ok);
      ASSERT_GE(applied.load(std::memory_order_relaxed), expected) << "round " << round;
    }
    uffd::unwatch(u(a), length);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  printf("%lu rounds in %.2f s; fast path trusted %lu times; address changed %lu times\n",
         static_cast<unsigned long>(rounds), seconds, static_cast<unsigned long>(trusted),
         static_cast<unsigned long>(moves));
}

// The record of a munmap done by another thread is visible once that thread is joined; no
// drain happened in between, so the fast path must refuse to trust.
TEST_F(Race, MunmapFromAnotherThread) {
  const size_t length = 16 * page_size();
  for (int round = 0; round < 2000 / kScale; ++round) {
    char *p = map_anonymous(length);
    ASSERT_EQ(uffd::watch(u(p), length), WatchResult::Watched);
    std::thread unmapper([p, length] { ASSERT_EQ(munmap(p, length), 0); });
    unmapper.join();
    ASSERT_FALSE(subscription_->quiescent()) << "round " << round;
    const auto records = drain_all(subscription_);
    ASSERT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap))
        << "round " << round << "\n"
        << describe(records);
    EXPECT_TRUE(subscription_->quiescent());
    uffd::unwatch(u(p), length);
  }
}

// Several threads, each a cache of its own (its own subscription), watch, unmap and drain at once;
// every one sees its own records (the queue is a broadcast), while another thread keeps
// subscribing and leaving. Each thread keeps an address range of its own, and "unmaps" by
// mapping PROT_NONE over its buffer (MAP_FIXED: an UNMAP event, and never a hole another thread
// could map into): at an address another thread has just unmapped, a watch may be answered from
// that thread's registration until the monitor has read its unmap (the window watch() accepts,
// uffd.h), and this test checks that every thread sees its own unmap.
TEST_F(Race, ManyCachesAtOnce) {
  constexpr int kThreads = 4;
  const int rounds = 1500 / kScale;
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  Joined churn(&stop, std::thread([&] {
    while (!stop.load()) {
      Subscription *extra = nullptr;
      if (uffd::subscribe(&extra) == MRC_OK) uffd::unsubscribe(extra);
      std::this_thread::yield();
    }
  }));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Subscription *mine = nullptr;
      if (uffd::subscribe(&mine) != MRC_OK) {
        failures.fetch_add(1);
        return;
      }
      const size_t length = (4 + static_cast<size_t>(t)) * page_size();
      char *reserved = map_anonymous(length + 2 * page_size(), PROT_NONE);
      char *const p = reserved + page_size();
      auto map_over = [p, length](int prot) {
        return mmap(p, length, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p;
      };
      for (int round = 0; round < rounds; ++round) {
        if (!map_over(PROT_READ | PROT_WRITE)) {
          if (failures.fetch_add(1) < 3) ADD_FAILURE() << "mmap: " << strerror(errno);
          break;
        }
        char why[256];
        if (uffd::watch(u(p), length, why, sizeof(why)) != WatchResult::Watched) {
          if (failures.fetch_add(1) < 3) ADD_FAILURE() << "watch: " << why;
          continue;
        }
        (void)map_over(PROT_NONE);  // unmaps the watched buffer
        bool seen = false;
        const DrainResult result = mine->drain([&](const Invalidation &r) {
          seen = seen || (r.start <= u(p) && r.end >= u(p) + length);
        });
        // Four busy threads can lap a subscription only if the queue is tiny; it is not.
        if ((result != DrainResult::Ok || !seen) && failures.fetch_add(1) < 3) {
          ADD_FAILURE() << "drain " << static_cast<int>(result) << " seen " << seen;
        }
        uffd::unwatch(u(p), length);
      }
      munmap(reserved, length + 2 * page_size());
      uffd::unsubscribe(mine);
    });
  }
  for (auto &thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

// ---- the watch table's lock-free fast path against its locked slow path ----

// One idle mapping is kept: of two mappings that fall idle, the older is unregistered, so that
// the slow path's decisions race the fast path's counts often.
class FastPathRace : public SubscribedTest {
 protected:
  void SetUp() override {
    testing::set_idle_vmas(1);
    SubscribedTest::SetUp();
  }
  void TearDown() override {
    SubscribedTest::TearDown();
    testing::set_idle_vmas(-1);
  }
  // Makes the idle mapping kept (if any) the older of two idle ones: it is unregistered.
  void let_the_idle_mapping_go();
};

// A mapping of `pages` pages with PROT_NONE guards around it (a VMA of its own).
char *map_alone_pages(size_t pages) {
  char *raw = map_anonymous((pages + 2) * page_size(), PROT_NONE);
  char *p = raw + page_size();
  EXPECT_EQ(mprotect(p, pages * page_size(), PROT_READ | PROT_WRITE), 0);
  return p;
}
void unmap_alone_pages(char *p, size_t pages) {
  munmap(p - page_size(), (pages + 2) * page_size());
}

void FastPathRace::let_the_idle_mapping_go() {
  char *third = map_alone_pages(1);
  ASSERT_EQ(uffd::watch(u(third), page_size()), WatchResult::Watched);
  uffd::unwatch(u(third), page_size());
  unmap_alone_pages(third, 1);
}

// Threads watch and unwatch pages of two mappings that nothing else watches: a watch that finds
// another thread's watch is a lock-free count; the last unwatch leaves the mapping idle, and
// once both are idle the older is unregistered, under the mutex; a watch of an idle mapping
// finds its old piece with a count of 0 and brings it back under the mutex. While a thread holds a
// watch the mapping must be registered (asked of /proc/self/smaps, which makes no event: an event
// would send every watch to the slow path until it is drained). A count revived after the slow path
// let its piece go, or a count lost, leaves watched memory unregistered; a count added leaves the
// mapping registered at the end.
TEST_F(FastPathRace, WatchersAgainstTheLastUnwatch) {
  constexpr int kThreads = 4;
  const int rounds = 20000 / kScale;
  char *m[2] = {map_alone_pages(kThreads), map_alone_pages(kThreads)};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < rounds; ++round) {
        char *page = m[(round / 8 + t) % 2] + static_cast<size_t>(t) * page_size();
        if (uffd::watch(u(page), page_size()) != WatchResult::Watched) {
          if (failures.fetch_add(1) < 3) ADD_FAILURE() << "watch failed, round " << round;
          break;
        }
        // Now and then (a smaps read is slow): most rounds are quick pairs that cross zero.
        if (round % 16 == t && !registered_with_uffd(u(page)) && failures.fetch_add(1) < 3) {
          ADD_FAILURE() << "round " << round << ": a watched page is not registered";
        }
        uffd::unwatch(u(page), page_size());
      }
    });
  }
  for (auto &thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  // Both idle now, one of them kept, until another mapping falls idle. A watch still counted
  // would keep its mapping registered.
  let_the_idle_mapping_go();
  EXPECT_FALSE(registered_with_uffd(u(m[0]))) << "a watch was counted twice, or never released";
  EXPECT_FALSE(registered_with_uffd(u(m[1]))) << "a watch was counted twice, or never released";
  for (char *mapping : m) unmap_alone_pages(mapping, kThreads);
}

// Lock-free counting stays exact while the slow path rebuilds and retires what the fast path
// reads: threads hold and release batches of watches in a mapping that an anchor keeps
// registered, while another thread cuts holes into that mapping and fills them (its records make
// the fast path wait for the drain; the table and its snapshot change shape) and watches
// mappings of its own (new pieces, unregistrations). Afterwards the anchor alone keeps the
// mapping registered, and its unwatch lets the mapping go: any count lost or added shows.
TEST_F(FastPathRace, CountsStayExactWhileTheTableChangesShape) {
  constexpr int kWatchers = 3;
  constexpr size_t kPages = 256;
  constexpr size_t kHole = 240;  // the churn's page; watchers stay below 200
  const int churn_rounds = 300 / kScale;
  const size_t page = page_size();
  char *m = map_alone_pages(kPages);
  ASSERT_EQ(uffd::watch(u(m), page), WatchResult::Watched);  // the anchor
  std::atomic<bool> churned{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kWatchers; ++t) {
    threads.emplace_back([&, t] {
      constexpr size_t kBatch = 8;
      WatchRange batch[kBatch];
      uint64_t i = static_cast<uint64_t>(t);
      for (int round = 0; !churned.load() || round < 2000 / kScale; ++round) {
        for (auto &range : batch) {
          range = {u(m + (1 + i++ % 199) * page), page};
          if (uffd::watch(range.start, range.length) != WatchResult::Watched) {
            if (failures.fetch_add(1) < 3) ADD_FAILURE() << "watch failed, round " << round;
            return;
          }
        }
        if (round % 2 == 0) {
          uffd::unwatch_many(batch, kBatch);
        } else {
          for (const auto &range : batch) uffd::unwatch(range.start, range.length);
        }
      }
    });
  }
  threads.emplace_back([&] {
    char *hole = m + kHole * page;
    for (int round = 0; round < churn_rounds; ++round) {
      char *other = map_alone_pages(4);
      EXPECT_EQ(uffd::watch(u(other), page), WatchResult::Watched);
      EXPECT_EQ(munmap(hole, page), 0);
      void *again = mmap(hole, page, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      EXPECT_EQ(again, hole);
      EXPECT_EQ(uffd::watch(u(hole), page), WatchResult::Watched);
      uffd::unwatch(u(hole), page);
      uffd::unwatch(u(other), page);
      unmap_alone_pages(other, 4);
    }
    churned.store(true);
  });
  for (auto &thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(registered_with_uffd(u(m + 210 * page)))
      << "the anchor's mapping was let go while the anchor held it";
  uffd::unwatch(u(m), page);
  let_the_idle_mapping_go();
  EXPECT_FALSE(registered_with_uffd(u(m + 210 * page)))
      << "a watch was counted twice, or never released";
  unmap_alone_pages(m, kPages);
}

// ---- eviction against an unmap in flight ----

// Idle mappings are let go only once no unmap of watched memory is in flight (an entry may still
// stand for memory another thread has unmapped). Every wait on the monitor has a bound and none
// holds a lock a get needs (docs/DESIGN.md, "Watching"): with another thread's unmap held in
// flight by a paused monitor, a last unwatch that leaves more idle mappings than are kept (a
// cache's purge, the retirement of its regions) returns at once and leaves the eviction for
// later; meanwhile a mapping's first watch (a get's, under the registry mutex) and
// Monitor::info go through. Once the unmap has been read, the next call that takes the mutex
// evicts. Each call runs on a thread of its own, so that a call that waits fails the test
// instead of hanging it: the monitor is resumed before the threads are joined.
class EvictionRace : public SubscribedTest {
 protected:
  void SetUp() override {
    testing::set_idle_vmas(0);  // every mapping whose last watch leaves is evicted at once
    SubscribedTest::SetUp();
  }
  void TearDown() override {
    testing::pause_monitor(false);
    SubscribedTest::TearDown();
    testing::set_idle_vmas(-1);
    testing::set_vma_budget(0);
  }
  // A fresh monitor that keeps `idle` idle mappings registered, under a VMA budget.
  void restart(int64_t idle, uint64_t budget) {
    uffd::unsubscribe(subscription_);
    subscription_ = nullptr;
    testing::set_idle_vmas(idle);
    testing::set_vma_budget(budget);
    ASSERT_EQ(uffd::subscribe(&subscription_), MRC_OK);
  }
  // Holds another thread's unmap of the watched `page` in flight: pauses the monitor, starts the
  // unmap on a thread of `threads` and returns once the kernel counts it in flight.
  void unmap_in_flight(std::vector<std::thread> *threads, char *page) {
    testing::pause_monitor(true);
    threads->emplace_back([page] { EXPECT_EQ(munmap(page, page_size()), 0); });
    for (int i = 0; i < 5000 && subscription_->probe_unmaps() != Subscription::Unmaps::InFlight;
         ++i) {
      usleep(1000);
    }
    ASSERT_EQ(subscription_->probe_unmaps(), Subscription::Unmaps::InFlight);
  }
};

// Starts `call` on a thread of its own (joined by the caller) and says whether it returned within
// `patience`.
bool returns_within(std::vector<std::thread> *threads, std::function<void()> call,
                    std::chrono::milliseconds patience) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  threads->emplace_back([call = std::move(call), done] {
    call();
    done->store(true);
  });
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (!done->load() && std::chrono::steady_clock::now() < deadline) usleep(200);
  return done->load();
}

TEST_F(EvictionRace, ALastUnwatchNeverWaitsForAnUnmapInFlight) {
  constexpr std::chrono::milliseconds kPatience{3000};  // on main: for ever
  const size_t page = page_size();
  char *idle = map_alone_pages(16);
  char *unmapped = map_alone_pages(16);
  char *fresh = map_alone_pages(16);
  ASSERT_EQ(uffd::watch(u(idle), page), WatchResult::Watched);
  ASSERT_EQ(uffd::watch(u(unmapped), page), WatchResult::Watched);
  std::vector<std::thread> threads;
  unmap_in_flight(&threads, unmapped + 8 * page);
  const bool unwatched = returns_within(
      &threads, [&] { uffd::unwatch(u(idle), page); }, kPatience);
  const bool watched = returns_within(
      &threads, [&] { EXPECT_EQ(uffd::watch(u(fresh), page), WatchResult::Watched); }, kPatience);
  const bool informed = returns_within(
      &threads, [] { (void)monitor_info(); }, kPatience);
  const bool still_registered = registered_with_uffd(u(idle));
  testing::pause_monitor(false);
  for (auto &thread : threads) thread.join();
  EXPECT_TRUE(unwatched) << "the last unwatch waited for the unmap in flight";
  EXPECT_TRUE(watched) << "a first watch waited for the unmap in flight";
  EXPECT_TRUE(informed) << "Monitor::info waited for the unmap in flight";
  EXPECT_TRUE(still_registered) << "an idle mapping was let go while an unmap was in flight";
  // The unmap has been read: the next call that takes the mutex evicts what was left.
  uffd::unwatch(u(fresh), page);
  EXPECT_FALSE(registered_with_uffd(u(idle))) << "the eviction left for later never came";
  EXPECT_FALSE(registered_with_uffd(u(fresh)));
  uffd::unwatch(u(unmapped), page);
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  for (char *m : {idle, unmapped, fresh}) unmap_alone_pages(m, 16);
}

// Under the VMA budget a watch makes room by letting idle mappings go: not while an unmap is in
// flight. It answers NotMonitorable at once (the get registers uncached), and a watch after the
// unmap was read makes the room.
TEST_F(EvictionRace, AWatchThatNeedsRoomNeverWaitsForAnUnmapInFlight) {
  constexpr std::chrono::milliseconds kPatience{3000};  // on main: for ever
  restart(/*idle=*/-1, /*budget=*/4);                   // two registered mappings
  const size_t page = page_size();
  char *idle = map_alone_pages(16);
  char *unmapped = map_alone_pages(16);
  char *fresh = map_alone_pages(16);
  ASSERT_EQ(uffd::watch(u(idle), page), WatchResult::Watched);
  ASSERT_EQ(uffd::watch(u(unmapped), page), WatchResult::Watched);
  uffd::unwatch(u(idle), page);  // idle, kept, and holding half of the budget
  std::vector<std::thread> threads;
  unmap_in_flight(&threads, unmapped + 15 * page);  // its mapping stays one registered entry
  WatchResult result = WatchResult::Watched;
  char why[256] = "";
  const bool answered = returns_within(
      &threads, [&] { result = uffd::watch(u(fresh), page, why, sizeof(why)); }, kPatience);
  testing::pause_monitor(false);
  for (auto &thread : threads) thread.join();
  EXPECT_TRUE(answered) << "a watch that needed room waited for the unmap in flight";
  EXPECT_EQ(result, WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why).find("in flight"), std::string::npos) << why;
  ASSERT_EQ(uffd::watch(u(fresh), page, why, sizeof(why)), WatchResult::Watched) << why;
  EXPECT_FALSE(registered_with_uffd(u(idle)));
  uffd::unwatch(u(fresh), page);
  uffd::unwatch(u(unmapped), page);
  for (char *m : {idle, unmapped, fresh}) unmap_alone_pages(m, 16);
}

// ---- MISSING mode: the monitor resolves the first touch of every page of a watched mapping ----

// A watch of one page registers its whole mapping (docs/DESIGN.md, "Watching"), so in MISSING
// mode every untouched page of that mapping faults to the monitor, which maps the zero page.
// Several threads touch the same untouched pages at once: two faults of one page race (the
// second zero page meets the first: EEXIST, and the monitor wakes the thread, which finds the
// page), reads must see zeros, and every thread's writes must stay.
TEST(MissingMode, UntouchedPagesOfAWatchedMappingReadZeroAndTakeWritesFromSeveralThreads) {
  ScopedEnv missing("MRC_MONITOR", "missing");
  ScopedSubscription subscription;
  if (subscription->mode() != MRC_MONITOR_MISSING) {
    GTEST_SKIP() << "MISSING mode is not available here: " << monitor_info().reason;
  }
  constexpr int kThreads = 4;
  constexpr size_t kPages = 512;
  const size_t page = page_size();
  char *p = map_alone_pages(kPages);
  p[0] = 1;  // the buffer a get asks for, in use
  ASSERT_EQ(uffd::watch(u(p), page), WatchResult::Watched);
  ASSERT_TRUE(registered_with_uffd(u(p) + (kPages - 1) * page)) << "the whole mapping is watched";
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread starts at another page and walks all of them: some pages are first touched
      // by a read, some by a write, some by several threads at once.
      for (size_t i = 0; i < kPages; ++i) {
        char *at = p + ((i + static_cast<size_t>(t) * kPages / kThreads) % kPages) * page;
        if (at[kThreads + 1 + t] != 0 && failures.fetch_add(1) < 3) {
          ADD_FAILURE() << "an untouched page did not read as zero";
        }
        at[1 + t] = static_cast<char>(1 + t);
      }
    });
  }
  for (auto &thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  for (size_t i = 0; i < kPages; ++i) {
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_EQ(p[i * page + 1 + static_cast<size_t>(t)], static_cast<char>(1 + t))
          << "page " << i << ", thread " << t;
    }
  }
  // Still one mapping, still watched: its unmap far from the watch is reported.
  EXPECT_EQ(count_vmas_in(u(p), u(p) + kPages * page), 1u);
  ASSERT_EQ(munmap(p + 300 * page, page), 0);
  EXPECT_TRUE(covered(drain_all(subscription.get()), u(p + 300 * page), u(p + 301 * page),
                      InvalidationKind::Unmap));
  uffd::unwatch(u(p), page);
  unmap_alone_pages(p, kPages);
}

}  // namespace
}  // namespace mrc::uffd::test
