// SPDX-License-Identifier: BSD-3-Clause
// Watching: whole mappings are registered (never a part of an application's VMA), counted
// watches, idle mappings kept registered up to a limit, what unmaps and moves do to the watch
// table, the unmap window, the VMA budget, memory that cannot be watched, and the mapping
// queries behind it.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/proc_maps.h"
#include "tests/uffd/fixtures.h"
#include "tests/uffd/helpers.h"
#include "uffd/testing.h"

namespace mrc::uffd::test {
namespace {

// A mapping of its own: PROT_NONE guard pages on both sides keep the kernel from merging it with
// its neighbours (anonymous mappings placed next to each other otherwise become one VMA).
char *map_alone(size_t length) {
  char *raw = map_anonymous(length + 2 * page_size(), PROT_NONE);
  char *p = raw + page_size();
  EXPECT_EQ(mprotect(p, length, PROT_READ | PROT_WRITE), 0);
  return p;
}
void unmap_alone(char *p, size_t length) { munmap(p - page_size(), length + 2 * page_size()); }

class Watch : public SubscribedTest {
 protected:
  void TearDown() override {
    SubscribedTest::TearDown();
    testing::set_vma_budget(0);
    testing::set_idle_vmas(-1);
  }
  // A fresh monitor that keeps `idle` idle mappings registered (0: unregister at once).
  void restart(int64_t idle, uint64_t budget = 0) {
    uffd::unsubscribe(subscription_);
    subscription_ = nullptr;
    testing::set_idle_vmas(idle);
    testing::set_vma_budget(budget);
    ASSERT_EQ(uffd::subscribe(&subscription_), MRC_OK);
  }
  WatchResult try_watch(const void *p, size_t length) {
    why_[0] = '\0';
    return uffd::watch(u(p), length, why_, sizeof(why_));
  }
  void watch(const void *p, size_t length) {
    ASSERT_EQ(try_watch(p, length), WatchResult::Watched) << why_;
  }
  void unwatch(const void *p, size_t length) { uffd::unwatch(u(p), length); }
  std::vector<Invalidation> drain() { return drain_all(subscription_); }
  // Unmaps one page and says whether the monitor reported it.
  bool unmap_is_reported(char *page) {
    EXPECT_EQ(munmap(page, page_size()), 0);
    const auto records = drain();
    return covered(records, u(page), u(page) + page_size(), InvalidationKind::Unmap);
  }

  // madvise(DONTNEED)s one page (the mapping stays whole) and says whether it was reported.
  bool madvise_is_reported(char *page) {
    EXPECT_EQ(madvise(page, page_size(), MADV_DONTNEED), 0);
    const auto records = drain();
    return covered(records, u(page), u(page) + page_size(), InvalidationKind::Remove);
  }

  char why_[256];
};

TEST_F(Watch, AWatchInARegisteredMappingCostsNoSyscall) {
  const size_t page = page_size();
  const size_t length = 8 * kWatchBlock;
  char *p = map_alone(length);
  const uint64_t before = testing::registrations();
  watch(p, page);
  EXPECT_EQ(testing::registrations(), before + 1);
  watch(p + 100 * page, 4 * page);
  watch(p, page);
  watch(p + 6 * kWatchBlock, page);  // blocks away, same mapping
  watch(p + length - page, page);
  EXPECT_EQ(testing::registrations(), before + 1);
  unmap_alone(p, length);
}

// The lock-free path reads a snapshot that copies the whole table. Made after every first watch,
// n mappings' first watches would copy O(n^2) items (measured: 65% of a first get's time with
// 20,000 mappings watched); past 64 items one is made per table/8 locked calls.
TEST_F(Watch, FirstWatchesOfManyMappingsCopyTheTableRarely) {
  restart(/*idle=*/0);
  constexpr size_t kMappings = 1000;
  const size_t page = page_size();
  std::vector<char *> mappings;
  const uint64_t before = testing::snapshots();
  for (size_t i = 0; i < kMappings; ++i) {
    mappings.push_back(map_alone(page));
    watch(mappings.back(), page);
  }
  const uint64_t copies = testing::snapshots() - before;
  EXPECT_GE(copies, 1u);
  EXPECT_LE(copies, 100u) << "a snapshot per first watch is " << kMappings;
  // Watched all the same: a second watch of each is counted without a registration.
  const uint64_t registered = testing::registrations();
  for (char *p : mappings) watch(p, page);
  EXPECT_EQ(testing::registrations(), registered);
  for (char *p : mappings) {
    unwatch(p, page);
    unwatch(p, page);
    unmap_alone(p, page);
  }
}

// The brk heap is watched page by page, not whole: nothing mremaps it, and a watch of one buffer
// in it must not make every free() that trims the heap or madvises its free memory wait for the
// monitor. Pages of the heap away from the watch send no event; the watched page does.
TEST_F(Watch, InTheBrkHeapOnlyTheWatchedPagesAreRegistered) {
  if (testing::monitor_loop() == std::string("none")) GTEST_SKIP() << "no monitor";
  const size_t page = page_size();
  constexpr size_t kPages = 64;
  // Grown by hand (malloc may take the break too, but never gives back what it did not take).
  auto *top = static_cast<char *>(sbrk(0));
  ASSERT_NE(sbrk(static_cast<intptr_t>((kPages + 1) * page)), reinterpret_cast<void *>(-1));
  char *heap = reinterpret_cast<char *>((u(top) + page - 1) & ~(page - 1));
  for (size_t i = 0; i < kPages; ++i) heap[i * page] = 1;
  char *watched = heap + 8 * page;
  watch(watched, 2 * page);
  mrc::os::Vma vma{};
  ASSERT_EQ(mrc::os::query_vma(u(watched), &vma), MRC_OK);
  EXPECT_EQ(vma.start, u(watched)) << "the watch registers its own pages, not the whole heap";
  EXPECT_EQ(vma.end, u(watched) + 2 * page);
  EXPECT_FALSE(madvise_is_reported(heap + 40 * page)) << "a heap page no watch covers";
  EXPECT_FALSE(madvise_is_reported(heap + 2 * page));
  EXPECT_TRUE(madvise_is_reported(watched + page));
  unwatch(watched, 2 * page);
}

TEST_F(Watch, ALargeWatchIsOneRegistration) {
  const size_t length = 64 * kWatchBlock;
  char *p = map_alone(length);
  const uint64_t before = testing::registrations();
  watch(p + 4096, length - 8192);
  EXPECT_EQ(testing::registrations(), before + 1);
  EXPECT_EQ(monitor_info().watched_bytes, length);
  unmap_alone(p, length);
}

// Registering part of a VMA splits it; the application's mremap of the buffer then fails.
TEST_F(Watch, WatchingAPageInTheMiddleAddsNoVma) {
  const size_t length = 64 * kWatchBlock;
  char *p = map_alone(length);
  const size_t vmas_before = count_vmas_in(u(p), u(p) + length);
  ASSERT_EQ(vmas_before, 1u);
  watch(p + length / 2 + 5 * page_size(), page_size());
  EXPECT_EQ(count_vmas_in(u(p), u(p) + length), vmas_before);
  EXPECT_EQ(monitor_info().watched_bytes, length);
  unmap_alone(p, length);
}

TEST_F(Watch, TheWholeMappingIsWatchedButNotTheNextOne) {
  const size_t page = page_size();
  const size_t length = 4 * kWatchBlock;
  char *p = map_alone(length);
  // Two mappings: different protections keep them separate VMAs.
  ASSERT_EQ(mprotect(p + length / 2, length / 2, PROT_READ), 0);
  watch(p, page);
  // Unwatched, far from the watch, in the watched mapping: reported.
  EXPECT_TRUE(unmap_is_reported(p + length / 2 - page));
  // The other mapping was not registered: not reported.
  EXPECT_FALSE(unmap_is_reported(p + length / 2));
  unmap_alone(p, length);
}

// Watches are counted over the whole mapping, not per registration: a mapping stays registered
// while any watch in it lives, wherever that watch lies.
TEST_F(Watch, NeighboursNeverUnwatchEachOther) {
  restart(/*idle=*/0);
  const size_t page = page_size();
  const size_t length = 8 * kWatchBlock;
  char *p = map_alone(length);
  char *far = p + 5 * kWatchBlock;
  watch(p, page);
  watch(p + 2 * page, page);
  watch(p, page);  // the same range twice: two watches
  watch(far, page);
  unwatch(p, page);
  unwatch(p, page);
  unwatch(p + 2 * page, page);
  // The far watch keeps the mapping registered, next to the released ones too.
  EXPECT_TRUE(unmap_is_reported(p + 3 * page));
  EXPECT_GT(monitor_info().watched_bytes, 0u);
  unwatch(far, page);
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  EXPECT_EQ(monitor_info().vmas_added, 0u);
  // Last watch gone (and no idle mapping kept): unregistered, nothing is reported any more.
  EXPECT_FALSE(unmap_is_reported(p + 4 * kWatchBlock));
  unmap_alone(p, length);
}

TEST_F(Watch, UnwatchManyDropsEachWatchOnce) {
  restart(/*idle=*/0);
  const size_t page = page_size();
  char *p = map_alone(8 * page);
  watch(p, page);
  watch(p, page);
  watch(p + 4 * page, page);
  const WatchRange ranges[] = {{u(p), page}, {u(p + 4 * page), page}};
  uffd::unwatch_many(ranges, 2);
  // One of the two watches of the first page is left: the mapping stays registered.
  EXPECT_TRUE(unmap_is_reported(p + 7 * page));
  uffd::unwatch_many(ranges, 1);
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  EXPECT_FALSE(unmap_is_reported(p + 6 * page));
  unmap_alone(p, 8 * page);
}

// ---- the lock-free fast path ----

// Runs `call` on another thread while this one holds the monitor's registry mutex for up to
// `patience`; true if the call finished meanwhile (so it never took the mutex). The call always
// finishes: the mutex is released after `patience` and the thread joined.
bool finishes_while_registry_locked(std::function<void()> call,
                                    std::chrono::milliseconds patience) {
  struct Context {
    std::function<void()> call;
    std::chrono::milliseconds patience;
    std::atomic<bool> done{false};
    bool finished = false;
    std::thread thread;
  } context;
  context.call = std::move(call);
  context.patience = patience;
  testing::with_registry_locked(
      [](void *arg) {
        auto *c = static_cast<Context *>(arg);
        c->thread = std::thread([c] {
          c->call();
          c->done.store(true);
        });
        const auto deadline = std::chrono::steady_clock::now() + c->patience;
        while (!c->done.load() && std::chrono::steady_clock::now() < deadline) usleep(200);
        c->finished = c->done.load();
      },
      &context);
  context.thread.join();
  return context.finished;
}

constexpr std::chrono::milliseconds kPatience{5000};  // a loaded machine, a sanitizer
constexpr std::chrono::milliseconds kShortPatience{200};

// A watch of memory whose mapping already counts a watch, and an unwatch that leaves one, are a
// count on that mapping's piece: they finish while another thread holds the registry mutex.
TEST_F(Watch, WatchesThatOnlyCountTakeNoLock) {
  restart(/*idle=*/0);
  const size_t page = page_size();
  char *p = map_alone(16 * page);
  watch(p, page);  // the mapping's first watch: registers it, makes its piece
  const uint64_t before = testing::registrations();
  EXPECT_TRUE(finishes_while_registry_locked(
      [&] { EXPECT_EQ(uffd::watch(u(p + 5 * page), page), WatchResult::Watched); }, kPatience));
  EXPECT_TRUE(finishes_while_registry_locked(
      [&] { EXPECT_EQ(uffd::watch(u(p + 5 * page), 3 * page), WatchResult::Watched); }, kPatience));
  EXPECT_TRUE(
      finishes_while_registry_locked([&] { uffd::unwatch(u(p + 5 * page), page); }, kPatience));
  const WatchRange ranges[] = {{u(p + 5 * page), 3 * page}};
  EXPECT_TRUE(finishes_while_registry_locked([&] { uffd::unwatch_many(ranges, 1); }, kPatience));
  EXPECT_EQ(testing::registrations(), before);
  // Counted exactly: the first watch is the only one left, and it keeps the mapping registered.
  EXPECT_TRUE(registered_with_uffd(u(p + 12 * page)));
  unwatch(p, page);
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  EXPECT_FALSE(registered_with_uffd(u(p + 12 * page)));
  unmap_alone(p, 16 * page);
}

// A run of equal ranges (a cache retiring regions of one buffer) is dropped in one step, never
// past the last watch: that one is left to the mutex, counted exactly.
TEST_F(Watch, ARunOfEqualUnwatchesDropsTogetherDownToTheLastWatch) {
  restart(/*idle=*/0);
  const size_t page = page_size();
  char *p = map_alone(16 * page);
  for (int i = 0; i < 5; ++i) watch(p, page);
  const WatchRange run[] = {{u(p), page}, {u(p), page}, {u(p), page}, {u(p), page}};
  EXPECT_TRUE(finishes_while_registry_locked([&] { uffd::unwatch_many(run, 4); }, kPatience));
  EXPECT_TRUE(registered_with_uffd(u(p + 12 * page))) << "one watch is left";
  uffd::unwatch_many(run, 1);
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  // A run as long as the watches: all but the last without the lock, the last with it.
  for (int i = 0; i < 3; ++i) watch(p, page);
  uffd::unwatch_many(run, 3);
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  EXPECT_FALSE(registered_with_uffd(u(p + 12 * page)));
  unmap_alone(p, 16 * page);
}

// The calls that change more than a count wait for the mutex: a mapping's first watch and its
// last unwatch (which may let the mapping go). Also shows that the helper above can fail.
TEST_F(Watch, FirstAndLastWatchesTakeTheLock) {
  restart(/*idle=*/0);
  const size_t page = page_size();
  char *p = map_alone(16 * page);
  EXPECT_FALSE(finishes_while_registry_locked(
      [&] { EXPECT_EQ(uffd::watch(u(p), page), WatchResult::Watched); }, kShortPatience));
  EXPECT_FALSE(finishes_while_registry_locked([&] { uffd::unwatch(u(p), page); }, kShortPatience));
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  unmap_alone(p, 16 * page);
}

// An idle mapping (still registered, its piece still shown to the fast path with a count of 0)
// that is watched again is in use again: the idle limit never lets it go while watched. A fast
// path that revived the count itself would leave the table counting the mapping idle.
TEST_F(Watch, AnIdleMappingWatchedAgainIsInUse) {
  restart(/*idle=*/1);
  const size_t page = page_size();
  char *a = map_alone(16 * page);
  char *b = map_alone(16 * page);
  watch(a, page);
  unwatch(a, page);
  ASSERT_TRUE(registered_with_uffd(u(a)));  // idle, kept
  const uint64_t before = testing::registrations();
  watch(a + 3 * page, page);
  EXPECT_EQ(testing::registrations(), before);
  watch(b, page);
  unwatch(b, page);  // one idle mapping (b); a is watched
  EXPECT_TRUE(registered_with_uffd(u(a))) << "a watched mapping was let go as idle";
  EXPECT_TRUE(registered_with_uffd(u(b)));
  unwatch(a + 3 * page, page);  // two idle: the older (b) goes
  EXPECT_TRUE(registered_with_uffd(u(a)));
  EXPECT_FALSE(registered_with_uffd(u(b)));
  unmap_alone(a, 16 * page);
  unmap_alone(b, 16 * page);
}

// A mapping let go after its last watch (no idle mapping kept) is registered again by the next
// watch, each time, although the fast path may still see the piece it had (same shape, count
// 0): only the mutex holder brings such a piece back. Nothing here makes an event, so the fast
// path is tried every time.
TEST_F(Watch, TheLastUnwatchLetsAMappingGoAndTheNextWatchRegistersItAgain) {
  restart(/*idle=*/0);
  const size_t page = page_size();
  char *p = map_alone(16 * page);
  for (int round = 0; round < 3; ++round) {
    const uint64_t before = testing::registrations();
    watch(p + 2 * page, page);
    EXPECT_EQ(testing::registrations(), before + 1) << "round " << round;
    watch(p + 3 * page, page);  // counted in the same piece, without the lock
    unwatch(p + 2 * page, page);
    EXPECT_TRUE(registered_with_uffd(u(p + 8 * page))) << "round " << round;
    unwatch(p + 3 * page, page);
    EXPECT_EQ(monitor_info().watched_bytes, 0u) << "round " << round;
    EXPECT_FALSE(registered_with_uffd(u(p + 8 * page))) << "round " << round;
  }
  EXPECT_FALSE(madvise_is_reported(p + 8 * page));
  unmap_alone(p, 16 * page);
}

TEST_F(Watch, AnIdleMappingStaysRegisteredUpToTheLimit) {
  restart(/*idle=*/2);
  const size_t page = page_size();
  const size_t length = 16 * page;
  char *mappings[3];
  for (char *&m : mappings) {
    m = map_alone(length);
    watch(m, page);
    unwatch(m, page);
  }
  // The first fell idle first: it went when the third made three idle mappings.
  EXPECT_FALSE(unmap_is_reported(mappings[0] + 4 * page));
  EXPECT_TRUE(unmap_is_reported(mappings[1] + 4 * page));
  // A watch of an idle mapping is a count, not a registration.
  const uint64_t before = testing::registrations();
  watch(mappings[2] + 8 * page, page);
  EXPECT_EQ(testing::registrations(), before);
  unwatch(mappings[2] + 8 * page, page);
  for (char *m : mappings) unmap_alone(m, length);
}

TEST_F(Watch, ReRegistersAfterAnUnmapTookTheRegistrationAway) {
  const size_t page = page_size();
  char *p = map_alone(16 * page);
  watch(p, page);
  ASSERT_TRUE(unmap_is_reported(p + 3 * page));  // the kernel drops that page's registration
  // New memory at the same address, then a watch there: must register again (it is no longer
  // covered by the old registration), or its unmap would go unseen.
  void *again = mmap(p + 3 * page, page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(again, p + 3 * page);
  const uint64_t before = testing::registrations();
  watch(p + 3 * page, page);
  EXPECT_GT(testing::registrations(), before);
  EXPECT_TRUE(unmap_is_reported(p + 3 * page));
  // The rest of the mapping kept its registration: a watch there needs none.
  const uint64_t after = testing::registrations();
  watch(p + 10 * page, page);
  EXPECT_EQ(testing::registrations(), after);
  unmap_alone(p, 16 * page);
}

TEST_F(Watch, MemoryMappedIntoAHoleIsRegisteredWhenWatched) {
  const size_t page = page_size();
  char *p = map_alone(16 * page);
  watch(p, page);
  ASSERT_EQ(munmap(p + 4 * page, page), 0);  // a hole
  (void)drain();
  watch(p, page);
  void *filled = mmap(p + 4 * page, page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(filled, p + 4 * page);
  watch(p + 4 * page, page);
  EXPECT_TRUE(unmap_is_reported(p + 4 * page));
  unmap_alone(p, 16 * page);
}

// Between the lookup of a mapping and its registration the application may unmap part of it
// (no event: it was not registered yet). UFFDIO_REGISTER then registers what is left and
// succeeds; the table must not record the hole as registered, or memory mapped there later would
// be answered from the table and never registered.
TEST_F(Watch, ARegistrationRacingAnUnmapDoesNotClaimTheHole) {
  const size_t page = page_size();
  static char *victim = nullptr;
  static size_t victim_pages = 0;
  char *p = map_alone(16 * page);
  victim = p + 8 * page;
  victim_pages = 8;
  testing::set_before_register_hook([](uintptr_t, uintptr_t) {
    if (victim != nullptr) munmap(victim, victim_pages * page_size());
    victim = nullptr;
  });
  struct Unhook {
    ~Unhook() { testing::set_before_register_hook(nullptr); }
  } unhook;
  watch(p, page);
  void *again = mmap(p + 8 * page, 8 * page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(again, p + 8 * page);
  const uint64_t before = testing::registrations();
  watch(p + 12 * page, page);
  EXPECT_GT(testing::registrations(), before);
  EXPECT_TRUE(unmap_is_reported(p + 12 * page));
  unmap_alone(p, 16 * page);
}

// The decision: a watch never waits for unmaps in flight. Until the monitor has read
// another thread's munmap, a watch of new memory mapped at the same address is answered from the
// old registration, without a syscall; the record, once drained, cuts that registration out of
// the table (and invalidates what a cache holds there), and the next watch registers.
TEST_F(Watch, AWatchInTheUnmapWindowDoesNotWaitAndTheRecordCorrectsIt) {
  const size_t page = page_size();
  char *p = map_alone(16 * page);
  watch(p, page);
  char *hole = p + 4 * page;
  testing::pause_monitor(true);
  struct Resume {
    ~Resume() { testing::pause_monitor(false); }
  } resume;
  std::thread unmapper([hole, page] { munmap(hole, page); });  // blocks: nobody reads the event
  void *again = MAP_FAILED;
  for (int i = 0; i < 5000 && again == MAP_FAILED; ++i) {  // until the VMA is gone
    again = mmap(hole, page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (again == MAP_FAILED) usleep(200);
  }
  ASSERT_EQ(again, hole);
  const uint64_t before = testing::registrations();
  std::atomic<bool> watched{false};
  WatchResult result = WatchResult::NotMonitorable;
  std::thread watcher([&] {
    result = uffd::watch(u(hole), page);
    watched.store(true);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!watched.load() && std::chrono::steady_clock::now() < deadline) usleep(1000);
  const bool waited = !watched.load();
  testing::pause_monitor(false);
  unmapper.join();
  watcher.join();
  EXPECT_FALSE(waited) << "the watch waited for the unmap in flight";
  ASSERT_EQ(result, WatchResult::Watched);
  EXPECT_EQ(testing::registrations(), before) << "no syscall: the old entry answered";
  // The record of the unmap in flight covers the new memory: a cache drops what it holds there.
  auto records = drain();
  EXPECT_TRUE(covered(records, u(hole), u(hole) + page, InvalidationKind::Unmap))
      << describe(records);
  unwatch(hole, page);
  watch(hole, page);
  EXPECT_GT(testing::registrations(), before) << "the record cut the stale entry";
  EXPECT_TRUE(unmap_is_reported(hole));
  unmap_alone(p, 16 * page);
}

TEST_F(Watch, AMillionRegionsInOneMappingAddNoVma) {
  const size_t length = size_t{4} << 30;  // virtual only: never touched
  char *p = map_alone(length);
  const size_t vmas_before = count_vmas_in(u(p), u(p) + length);
  const uint64_t registrations_before = testing::registrations();
  const size_t regions = 1000000;
  const size_t stride = length / regions & ~size_t{63};
  for (size_t i = 0; i < regions; ++i) {
    ASSERT_EQ(try_watch(p + i * stride, 64), WatchResult::Watched) << why_;
  }
  EXPECT_EQ(count_vmas_in(u(p), u(p) + length), vmas_before);
  EXPECT_LE(monitor_info().vmas_added, 2u);
  EXPECT_EQ(testing::registrations() - registrations_before, 1u);
  for (size_t i = 0; i < regions; ++i) unwatch(p + i * stride, 64);
  EXPECT_EQ(count_vmas_in(u(p), u(p) + length), vmas_before);
  // Idle now, and kept: watching again is a count.
  watch(p + 12345 * stride, 64);
  EXPECT_EQ(testing::registrations() - registrations_before, 1u);
  unmap_alone(p, length);
}

TEST_F(Watch, PastTheVmaBudgetTheAnswerIsNotMonitorable) {
  restart(/*idle=*/0, /*budget=*/4);  // two registered mappings, two VMAs each at most
  EXPECT_EQ(monitor_info().vma_budget, 4u);
  const size_t length = 16 * page_size();
  char *a = map_alone(length);
  char *b = map_alone(length);
  char *c = map_alone(length);
  watch(a, 4096);
  watch(b, 4096);
  EXPECT_EQ(monitor_info().vmas_added, 4u);
  EXPECT_EQ(try_watch(c, 4096), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why_).find("VMA budget"), std::string::npos) << why_;
  // In a mapping already registered: nothing is added.
  watch(a + 8 * page_size(), 4096);
  // The last watch of b leaves: its room is free again.
  unwatch(b, 4096);
  watch(c, 4096);
  EXPECT_EQ(monitor_info().vmas_added, 4u);
  for (char *m : {a, b, c}) unmap_alone(m, length);
}

TEST_F(Watch, IdleMappingsGiveWayUnderTheVmaBudget) {
  restart(/*idle=*/-1, /*budget=*/4);
  const size_t length = 16 * page_size();
  char *a = map_alone(length);
  char *b = map_alone(length);
  char *c = map_alone(length);
  watch(a, 4096);
  watch(b, 4096);
  unwatch(a, 4096);  // idle, still registered
  watch(c, 4096);    // needs a's room
  EXPECT_EQ(monitor_info().vmas_added, 4u);
  EXPECT_FALSE(unmap_is_reported(a + 4 * page_size()));
  EXPECT_TRUE(unmap_is_reported(b + 4 * page_size()));
  for (char *m : {a, b, c}) unmap_alone(m, length);
}

TEST_F(Watch, AnotherUserfaultfdsMemoryIsNotMonitorable) {
  const int foreign =
      static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  ASSERT_GE(foreign, 0) << strerror(errno);
  uffdio_api api{UFFD_API, 0, 0};
  ASSERT_EQ(ioctl(foreign, UFFDIO_API, &api), 0);
  const size_t length = 4 * page_size();
  char *p = map_anonymous(length);
  uffdio_register reg{};
  reg.range.start = u(p);
  reg.range.len = length;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;  // never touched, so never faults
  ASSERT_EQ(ioctl(foreign, UFFDIO_REGISTER, &reg), 0);
  EXPECT_EQ(try_watch(p, length), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why_).find("EBUSY"), std::string::npos) << why_;
  close(foreign);
  munmap(p, length);
}

TEST_F(Watch, ReadOnlySharedFileIsNotMonitorable) {
  char path[] = "/tmp/mrc-uffd-ro-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(page_size())), 0);
  close(fd);
  const int ro = open(path, O_RDONLY | O_CLOEXEC);
  unlink(path);
  void *p = mmap(nullptr, page_size(), PROT_READ, MAP_SHARED, ro, 0);
  close(ro);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(try_watch(p, page_size()), WatchResult::NotMonitorable);
  EXPECT_NE(why_[0], '\0');
  munmap(p, page_size());
}

TEST_F(Watch, EmptyAndWrappingRangesAreRefused) {
  char *p = map_anonymous(page_size());
  EXPECT_EQ(try_watch(p, 0), WatchResult::NotMonitorable);
  EXPECT_EQ(uffd::watch(UINTPTR_MAX - 100, 4096, why_, sizeof(why_)), WatchResult::NotMonitorable);
  unwatch(p, 0);  // harmless
  munmap(p, page_size());
}

// A failed watch counts nothing; what it registered before it failed is an idle mapping like
// any other (here: none are kept), and no VMA is split.
TEST_F(Watch, AFailedWatchLeavesNothingBehind) {
  restart(/*idle=*/0);
  const size_t page = page_size();
  char *p = map_alone(32 * page);
  ASSERT_EQ(munmap(p + 8 * page, page), 0);  // a hole inside the range
  const size_t vmas_before = count_vmas_in(u(p), u(p) + 32 * page);
  EXPECT_EQ(try_watch(p, 16 * page), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why_).find("not mapped"), std::string::npos) << why_;
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  EXPECT_EQ(count_vmas_in(u(p), u(p) + 32 * page), vmas_before);
  EXPECT_FALSE(unmap_is_reported(p));
  unmap_alone(p, 32 * page);
}

// ---- the application's mremap of watched memory ----

// A buffer of `length` that cannot grow in place: a PROT_NONE page follows it.
char *map_unable_to_grow(size_t length) {
  char *p = map_alone(length + page_size());
  EXPECT_EQ(mprotect(p + length, page_size(), PROT_NONE), 0);
  return p;
}

TEST_F(Watch, TheApplicationCanMoveABufferWithAWatchInItsMiddle) {
  const size_t length = 8 * kWatchBlock;
  char *p = map_alone(length);
  char *target = map_alone(length);
  ASSERT_EQ(mprotect(target, length, PROT_NONE), 0);  // a reservation, as allocators do
  watch(p + length / 2, page_size());
  p[length / 2] = 7;
  void *moved = mremap(p, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, target);
  ASSERT_EQ(moved, target) << "mremap: " << strerror(errno);
  EXPECT_EQ(target[length / 2], 7);
  auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Remap)) << describe(records);
  // The kernel moved the registration with the VMA: its unmaps are reported, and it is whole.
  EXPECT_EQ(count_vmas_in(u(target), u(target) + length), 1u);
  EXPECT_TRUE(unmap_is_reported(target + 3 * page_size()));
  unwatch(p + length / 2, page_size());
  unmap_alone(target, length);
}

TEST_F(Watch, TheApplicationCanGrowABufferWithAWatchInItsMiddle) {
  const size_t length = 8 * kWatchBlock;
  char *p = map_unable_to_grow(length);
  watch(p + length / 2, page_size());
  p[length / 2] = 9;
  void *grown = mremap(p, length, 2 * length, MREMAP_MAYMOVE);
  ASSERT_NE(grown, MAP_FAILED) << "mremap: " << strerror(errno);
  ASSERT_NE(grown, p);
  char *q = static_cast<char *>(grown);
  EXPECT_EQ(q[length / 2], 9);
  auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Remap)) << describe(records);
  unwatch(p + length / 2, page_size());
  munmap(q, 2 * length);
  unmap_alone(p, length + page_size());  // what is left: the guards
}

// A growing move's record is the old range, of the old length: [from, from + old length). The
// new memory, of the new length, lies at `to` and carries the registration (the kernel moves it
// with the VMA). The table must not keep an entry at the old address: memory mapped there later
// is registered by the next watch, and its unmap is seen.
TEST_F(Watch, AGrowingMoveIsReportedOnceAndLeavesNoEntryBehind) {
  const size_t page = page_size();
  const size_t length = 4 * kWatchBlock;
  char *p = map_unable_to_grow(length);
  watch(p + page, page);
  (void)drain();
  char *q = static_cast<char *>(mremap(p, length, 2 * length, MREMAP_MAYMOVE));
  ASSERT_NE(q, MAP_FAILED) << strerror(errno);
  ASSERT_NE(q, p);
  auto records = drain();
  bool exact = false;
  for (const Invalidation &r : records) {
    EXPECT_FALSE(r.start < u(q) + 2 * length && u(q) < r.end) << "a record of the new place\n"
                                                              << describe(records);
    exact =
        exact || (r.kind == InvalidationKind::Remap && r.start == u(p) && r.end == u(p) + length);
  }
  EXPECT_TRUE(exact) << "want remap [from, from + old length)\n" << describe(records);
  // The moved VMA, grown part included, is registered (by the kernel, not by a watch).
  EXPECT_TRUE(unmap_is_reported(q + length + 3 * page));
  // The old address: new memory there is not covered by anything any more.
  void *again = mmap(p, length, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(again, p);
  const uint64_t before = testing::registrations();
  watch(p + page, page);
  EXPECT_GT(testing::registrations(), before);
  EXPECT_TRUE(unmap_is_reported(p + 2 * page));
  unwatch(p + page, page);
  unwatch(p + page, page);  // the watch from before the move
  munmap(q, 2 * length);
  unmap_alone(p, length + page);
}

// A watch taken in the moved VMA at its new address: registers again (the table knew nothing
// there), as a no-op for the kernel: the VMA stays whole.
TEST_F(Watch, AWatchAtTheNewPlaceOfAMovedBufferKeepsItWhole) {
  const size_t length = 4 * kWatchBlock;
  char *p = map_unable_to_grow(length);
  watch(p, page_size());
  char *q = static_cast<char *>(mremap(p, length, 2 * length, MREMAP_MAYMOVE));
  ASSERT_NE(q, MAP_FAILED) << strerror(errno);
  (void)drain();
  watch(q + length + kWatchBlock, page_size());  // in the grown part
  EXPECT_EQ(count_vmas_in(u(q), u(q) + 2 * length), 1u);
  EXPECT_TRUE(unmap_is_reported(q + 5 * page_size()));
  unwatch(q + length + kWatchBlock, page_size());
  unwatch(p, page_size());
  munmap(q, 2 * length);
  unmap_alone(p, length + page_size());
}

// A MAP_FIXED over part of a watched mapping: the kernel keeps the new mapping apart from its
// registered neighbours, where it would have merged with them; registering it too merges them
// back, and the application's mremap of the whole range works again.
TEST_F(Watch, AMappingPutOverPartOfAWatchedOneIsWatchedAndMergedBack) {
  const size_t page = page_size();
  const size_t length = 64 * page;
  char *p = map_alone(length);
  watch(p, page);
  void *replaced = mmap(p + 16 * page, 16 * page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_EQ(replaced, p + 16 * page);
  auto records = drain();
  EXPECT_TRUE(covered(records, u(p + 16 * page), u(p + 32 * page), InvalidationKind::Unmap))
      << describe(records);
  unwatch(p, page);  // the watch table follows the records at its next watch or unwatch
  EXPECT_EQ(count_vmas_in(u(p), u(p) + length), 1u);
  char *target = map_alone(length);
  ASSERT_EQ(mprotect(target, length, PROT_NONE), 0);
  ASSERT_EQ(mremap(p, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, target), target)
      << "mremap: " << strerror(errno);
  EXPECT_TRUE(unmap_is_reported(target + 20 * page));  // the part mapped over is watched too
  unmap_alone(target, length);
  unmap_alone(p, length);
}

TEST_F(Watch, ReRegistersAfterAMove) {
  const size_t length = 4 * page_size();
  char *p = map_alone(length);
  char *elsewhere = map_alone(length);
  ASSERT_EQ(mprotect(elsewhere, length, PROT_NONE), 0);
  watch(p, length);
  ASSERT_EQ(mremap(p, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, elsewhere), elsewhere);
  void *again = mmap(p, length, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(again, p);
  watch(p, length);
  (void)drain();
  ASSERT_EQ(munmap(p, length), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap)) << describe(records);
  unmap_alone(elsewhere, length);
  unmap_alone(p, length);
}

TEST(WatchUncached, MonitorOffWatchesNothing) {
  ScopedEnv off("MRC_MONITOR", "off");
  ScopedSubscription subscription;
  EXPECT_EQ(subscription->mode(), MRC_MONITOR_UNCACHED);
  char why[256];
  char *p = map_anonymous(page_size());
  EXPECT_EQ(uffd::watch(u(p), page_size(), why, sizeof(why)), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why).find("uncached"), std::string::npos) << why;
  EXPECT_TRUE(subscription->quiescent());
  EXPECT_EQ(subscription->drain([](const Invalidation &) { FAIL(); }), DrainResult::Ok);
  const mrc_monitor_info_t info = monitor_info();
  EXPECT_EQ(info.mode, MRC_MONITOR_UNCACHED);
  EXPECT_STREQ(info.mode_name, "uncached");
  EXPECT_NE(std::string(info.reason).find("MRC_MONITOR=off"), std::string::npos) << info.reason;
  EXPECT_EQ(info.running, 0);
  munmap(p, page_size());
}

}  // namespace
}  // namespace mrc::uffd::test
