// SPDX-License-Identifier: BSD-3-Clause
// The invalidation queue on its own: records, lapping, the pending protocol, many readers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "tests/uffd/fixtures.h"
#include "uffd/queue.h"

namespace mrc::uffd {
namespace {

constexpr uint64_t kScale = test::kScale;

Invalidation record_for(uint64_t i) {
  return Invalidation{static_cast<uintptr_t>(i * 4096), static_cast<uintptr_t>(i * 4096 + 4096),
                      static_cast<InvalidationKind>(i % 3)};
}

// A few hundred cycles for another thread to look in, without giving the CPU away: a yield per
// round of a 200,000-round loop hands a busy machine's other tasks a time slice each time.
void widen_the_window() {
  for (int i = 0; i < 64; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
  }
}

struct Queue {
  InvalidationQueue q;
  explicit Queue(size_t capacity) { EXPECT_EQ(q.allocate(capacity), MRC_OK); }
  ~Queue() { q.release(); }
  void publish(uint64_t first, uint64_t count) {
    q.begin_batch();
    for (uint64_t i = first; i < first + count; ++i) q.append(record_for(i));
    q.end_batch();
  }
};

TEST(InvalidationQueue, RejectsCapacitiesThatAreNotPowersOfTwo) {
  InvalidationQueue q;
  EXPECT_EQ(q.allocate(0), MRC_ERR_INVALID);
  EXPECT_EQ(q.allocate(1), MRC_ERR_INVALID);
  EXPECT_EQ(q.allocate(12), MRC_ERR_INVALID);
  EXPECT_FALSE(q.allocated());
}

TEST(InvalidationQueue, RecordsComeBackInOrder) {
  Queue queue(16);
  EXPECT_EQ(queue.q.head(), 0u);
  queue.publish(0, 10);
  EXPECT_EQ(queue.q.head(), 10u);
  EXPECT_EQ(queue.q.pending(), 0u);
  for (uint64_t i = 0; i < 10; ++i) {
    Invalidation r;
    ASSERT_TRUE(queue.q.read(i, &r));
    EXPECT_EQ(r.start, record_for(i).start);
    EXPECT_EQ(r.end, record_for(i).end);
    EXPECT_EQ(r.kind, record_for(i).kind);
  }
}

TEST(InvalidationQueue, ALappedReaderIsTold) {
  Queue queue(8);
  queue.publish(0, 8);
  Invalidation r;
  EXPECT_TRUE(queue.q.read(0, &r));
  queue.publish(8, 1);  // overwrites record 0
  EXPECT_FALSE(queue.q.read(0, &r));
  EXPECT_TRUE(queue.q.read(1, &r));
  EXPECT_TRUE(queue.q.read(8, &r));
  queue.publish(9, 100);  // laps the ring many times
  EXPECT_FALSE(queue.q.read(8, &r));
  EXPECT_TRUE(queue.q.read(108, &r));
  EXPECT_EQ(r.start, record_for(108).start);
}

TEST(InvalidationQueue, HeadSurvivesReallocation) {
  InvalidationQueue q;
  ASSERT_EQ(q.allocate(4), MRC_OK);
  q.begin_batch();
  q.append(record_for(0));
  q.append(record_for(1));
  q.end_batch();
  q.release();
  ASSERT_EQ(q.allocate(4), MRC_OK);
  EXPECT_EQ(q.head(), 2u);  // a cursor from before never looks drained by accident
  Invalidation r;
  EXPECT_FALSE(q.read(0, &r));  // fresh storage holds no record
  q.begin_batch();
  q.append(record_for(2));
  q.end_batch();
  EXPECT_TRUE(q.read(2, &r));
  q.release();
}

// The protocol the fast path relies on: the producer raises pending before the "kernel" releases
// the unmapper (here: `released`), and lowers it only after the record is published. Whoever
// sees the release and then pending == 0 must also see the record.
TEST(InvalidationQueue, PendingCoversTheWindowBetweenReleaseAndPublish) {
  Queue queue(1024);
  const uint64_t rounds = 200000 / kScale;
  std::atomic<uint64_t> released{0};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> violations{0};
  std::atomic<uint64_t> checks{0};
  constexpr std::chrono::steady_clock::duration kWaitBudget = std::chrono::seconds(2);
  std::chrono::steady_clock::duration waited{};
  std::thread producer([&] {
    for (uint64_t i = 0; i < rounds; ++i) {
      queue.q.begin_batch();
      released.store(i + 1, std::memory_order_seq_cst);  // read() returned: unmapper released
      widen_the_window();
      queue.q.append(record_for(i));
      queue.q.end_batch();
      if (i % 64 == 0 && waited < kWaitBudget) {
        // Now and then, leave pending lowered until the observer has looked. The waits share
        // one budget: on a machine busy enough that the observer rarely runs, 3,000 waits of a
        // time slice each would otherwise outlast ctest's timeout (they did in CI).
        const uint64_t seen = checks.load();
        const auto from = std::chrono::steady_clock::now();
        while (checks.load() == seen &&
               waited + (std::chrono::steady_clock::now() - from) < kWaitBudget) {
          std::this_thread::yield();
        }
        waited += std::chrono::steady_clock::now() - from;
      }
    }
    done.store(true);
  });
  std::thread observer([&] {
    while (!done.load()) {
      const uint64_t seen_release = released.load(std::memory_order_seq_cst);
      if (queue.q.pending() == 0) {
        checks.fetch_add(1, std::memory_order_relaxed);
        if (queue.q.head() < seen_release) violations.fetch_add(1);
      }
    }
  });
  producer.join();
  observer.join();
  EXPECT_EQ(violations.load(), 0u);
  EXPECT_GT(checks.load(), 0u);
}

TEST(InvalidationQueue, WaitUntilIdleReturnsOnlyAfterThePublish) {
  Queue queue(16);
  std::atomic<bool> raised{false};
  std::thread producer([&] {
    queue.q.begin_batch();
    raised.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the spin: futex path
    queue.q.append(record_for(0));
    queue.q.end_batch();
  });
  while (!raised.load()) std::this_thread::yield();
  queue.q.wait_until_idle();
  EXPECT_EQ(queue.q.pending(), 0u);
  EXPECT_EQ(queue.q.head(), 1u);
  producer.join();
}

// One producer, several readers that each keep their own cursor; a small ring forces lapping.
// Every record a reader accepts must be exactly the one written at that index (never torn),
// and every lapped read must be noticed.
TEST(InvalidationQueue, ManyReadersNeverSeeATornRecord) {
  Queue queue(64);
  const uint64_t total = 400000 / kScale;
  std::atomic<bool> done{false};
  std::atomic<int> ready{0};
  constexpr int kReaders = 3;
  std::atomic<uint64_t> torn{0};
  std::atomic<uint64_t> laps{0};
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> cursors[kReaders] = {};  // where each reader has read up to
  auto all_caught_up = [&](uint64_t head) {
    for (const auto &cursor : cursors) {
      if (cursor.load(std::memory_order_relaxed) < head) return false;
    }
    return true;
  };
  constexpr std::chrono::steady_clock::duration kWaitBudget = std::chrono::seconds(2);
  std::chrono::steady_clock::duration waited{};
  std::thread producer([&] {
    while (ready.load() < kReaders) std::this_thread::yield();
    for (uint64_t i = 0; i < total;) {
      const uint64_t batch = 1 + (i % 7);
      const uint64_t n = std::min(batch, total - i);
      queue.publish(i, n);
      i += n;
      if (i % 16 < 7) widen_the_window();
      if (i / 32 != (i - n) / 32 && accepted.load(std::memory_order_relaxed) < 1000 &&
          waited < kWaitBudget) {
        // Until the readers have accepted some records: every half ring, wait until they have
        // caught up. A producer that never waits can lap every reader on a busy machine, and
        // then no record is read at all; after that, lapping is what the test is about. The
        // waits share one budget, as in the test above.
        const auto from = std::chrono::steady_clock::now();
        while (!all_caught_up(i) &&
               waited + (std::chrono::steady_clock::now() - from) < kWaitBudget) {
          std::this_thread::yield();
        }
        waited += std::chrono::steady_clock::now() - from;
      }
    }
    done.store(true, std::memory_order_release);
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&, t] {
      uint64_t cursor = 0;
      ready.fetch_add(1);
      for (;;) {
        const bool finished = done.load(std::memory_order_acquire);
        queue.q.wait_until_idle();
        const uint64_t head = queue.q.head();
        const bool nothing_new = cursor >= head;
        for (; cursor < head; ++cursor) {
          Invalidation r;
          if (!queue.q.read(cursor, &r)) {
            laps.fetch_add(1, std::memory_order_relaxed);
            cursor = head;  // a cache would purge here
            break;
          }
          const Invalidation want = record_for(cursor);
          if (r.start != want.start || r.end != want.end || r.kind != want.kind) {
            torn.fetch_add(1, std::memory_order_relaxed);
          }
          accepted.fetch_add(1, std::memory_order_relaxed);
        }
        cursors[t].store(cursor, std::memory_order_relaxed);
        if (finished && cursor >= queue.q.head()) break;
        // One slow reader gets lapped more often; the others give the producer the CPU only
        // when it is behind them (three spinning readers starve it on two cores).
        if (t == 0 || nothing_new) std::this_thread::yield();
      }
    });
  }
  producer.join();
  for (auto &reader : readers) reader.join();
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_GT(accepted.load(), 0u);
  EXPECT_EQ(queue.q.head(), total);
  printf("records accepted %lu, laps noticed %lu\n", static_cast<unsigned long>(accepted.load()),
         static_cast<unsigned long>(laps.load()));
}

}  // namespace
}  // namespace mrc::uffd
