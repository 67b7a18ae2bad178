// SPDX-License-Identifier: BSD-3-Clause
// The public monitor's contract (include/mrcache/monitor.h): subscriptions, delivery, validity,
// one-shot subscriptions, the delivery thread, calls from notify, and bad input.
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "tests/monitor/monitor_fixture.h"
#include "uffd/testing.h"

namespace mrc::monitor::test {
namespace {

constexpr unsigned kManual = 0;  // the test delivers with mrc_monitor_deliver

size_t deliver(mrc_monitor_t *monitor) {
  size_t delivered = 0;
  EXPECT_EQ(mrc_monitor_deliver(monitor, &delivered), MRC_OK);
  return delivered;
}

TEST_F(MonitorTest, DeliversTheUnmapOfASubscribedRangeAndNothingElse) {
  open(kManual);
  char *watched = map(4);
  char *other = map(4);
  ASSERT_NE(watched, nullptr);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, watched + kPage, kPage), MRC_OK) << mrc_last_error();
  unmap(other);  // not watched by anyone: no record at all
  unmap(watched);
  EXPECT_EQ(deliver(monitor_), 1u);
  EXPECT_TRUE(was_notified(watched + kPage, kPage));
  EXPECT_FALSE(was_notified(other, 4 * kPage));
  const mrc_monitor_stats_t s = stats();
  EXPECT_EQ(s.subscribes, 1u);
  EXPECT_EQ(s.notifications, 1u);
  EXPECT_EQ(s.subscriptions, 1u) << "without MRC_MONITOR_ONE_SHOT a subscription stays";
}

TEST_F(MonitorTest, DeliversMadviseAndMremapOfASubscribedRange) {
  open(kManual);
  char *dropped = map(4);
  char *moved = map(4);
  ASSERT_NE(dropped, nullptr);
  ASSERT_NE(moved, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, dropped, 4 * kPage), MRC_OK) << mrc_last_error();
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, moved, 4 * kPage), MRC_OK) << mrc_last_error();
  std::memset(dropped, 1, 4 * kPage);
  ASSERT_EQ(madvise(dropped + kPage, kPage, MADV_DONTNEED), 0);
  void *target = mmap(nullptr, 4 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(target, MAP_FAILED);
  ASSERT_EQ(mremap(moved, 4 * kPage, 4 * kPage, MREMAP_MAYMOVE | MREMAP_FIXED, target), target);
  deliver(monitor_);
  EXPECT_TRUE(was_notified(dropped + kPage, kPage));
  EXPECT_TRUE(was_notified(moved, 4 * kPage));
  munmap(target, 4 * kPage);
  // The moved range is empty now; the test's guard pages stay around it.
  ASSERT_EQ(mrc_monitor_unsubscribe(monitor_, moved, 4 * kPage), MRC_OK);
}

TEST_F(MonitorTest, SubscriptionsAreCountedPerExactRange) {
  open(kManual);
  char *p = map(4);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, 4 * kPage), MRC_OK);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, 4 * kPage), MRC_OK);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, 2 * kPage), MRC_OK);
  EXPECT_EQ(stats().subscriptions, 2u);
  EXPECT_EQ(mrc_monitor_unsubscribe(monitor_, p, 4 * kPage), MRC_OK);
  EXPECT_EQ(mrc_monitor_unsubscribe(monitor_, p, 4 * kPage), MRC_OK);
  EXPECT_EQ(mrc_monitor_unsubscribe(monitor_, p, 4 * kPage), MRC_ERR_NOT_FOUND);
  EXPECT_NE(std::string(mrc_last_error()).find("not subscribed"), std::string::npos);
  EXPECT_EQ(stats().subscriptions, 1u);
  // The remaining subscription still watches: its unmap is delivered.
  unmap(p);
  deliver(monitor_);
  EXPECT_TRUE(was_notified(p, 2 * kPage));
}

TEST_F(MonitorTest, ValidIsFalseWhileAnUnmapIsInFlightAndUntilItIsDelivered) {
  open(kManual);
  char *p = map(4);
  char *elsewhere = map(4);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(elsewhere, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, 4 * kPage), MRC_OK);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, elsewhere, 4 * kPage), MRC_OK);
  EXPECT_EQ(mrc_monitor_valid(monitor_, p, 4 * kPage), 1);

  // Another thread's munmap stays in flight while the monitor is paused.
  std::atomic<bool> go{false};
  std::thread unmapper([&] {
    while (!go.load()) std::this_thread::yield();
    unmap(p);
  });
  mrc::uffd::testing::pause_monitor(true);
  go = true;
  void *again = MAP_FAILED;
  for (int i = 0; i < 25000 && again == MAP_FAILED; ++i) {  // until the VMA is gone
    again = mmap(p, 4 * kPage, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (again == MAP_FAILED) usleep(200);
  }
  const int valid_in_flight = mrc_monitor_valid(monitor_, p, 4 * kPage);
  const int elsewhere_in_flight = mrc_monitor_valid(monitor_, elsewhere, 4 * kPage);
  mrc::uffd::testing::pause_monitor(false);
  unmapper.join();
  ASSERT_EQ(again, static_cast<void *>(p)) << "the unmapped range was not free within 5 s";
  EXPECT_EQ(valid_in_flight, 0) << "a hit on memory whose unmap is in flight was answered valid";
  EXPECT_EQ(elsewhere_in_flight, 0) << "the probe cannot tell which range is in flight";

  // Read but not delivered: the range it overlaps is invalid, others are valid again.
  for (int i = 0; i < 5000 && mrc_monitor_valid(monitor_, elsewhere, 4 * kPage) == 0; ++i) {
    usleep(1000);
  }
  EXPECT_EQ(mrc_monitor_valid(monitor_, elsewhere, 4 * kPage), 1);
  EXPECT_EQ(mrc_monitor_valid(monitor_, p, 4 * kPage), 0)
      << "a hit on memory whose unmap was read but not delivered was answered valid";
  EXPECT_FALSE(was_notified(p, 4 * kPage));
  deliver(monitor_);
  EXPECT_TRUE(was_notified(p, 4 * kPage));
  EXPECT_EQ(mrc_monitor_valid(monitor_, p, 4 * kPage), 1) << "nothing is waiting any more";
  EXPECT_GE(stats().valid_refused, 3u);
  munmap(p, 4 * kPage);  // the test's own mapping at the old address
}

TEST_F(MonitorTest, ValidReadsABoundedNumberOfUndeliveredRecords) {
  open(kManual);
  char *quiet = map(1);
  char *busy = map(1);
  ASSERT_NE(quiet, nullptr);
  ASSERT_NE(busy, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, quiet, kPage), MRC_OK);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, busy, kPage), MRC_OK);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(madvise(busy, kPage, MADV_DONTNEED), 0);
  // madvise returns once its event is read, before the monitor has appended its record; until
  // then valid() answers "may concern" whatever the count.
  mrc::uffd::testing::wait_until_idle();
  EXPECT_EQ(mrc_monitor_valid(monitor_, quiet, kPage), 1) << "100 records are read through";
  for (int i = 0; i < 300; ++i) ASSERT_EQ(madvise(busy, kPage, MADV_DONTNEED), 0);
  mrc::uffd::testing::wait_until_idle();
  // Past a few hundred the answer is "may concern" without reading them: it stays quick, and the
  // caller registers again.
  EXPECT_EQ(mrc_monitor_valid(monitor_, quiet, kPage), 0);
  EXPECT_EQ(deliver(monitor_), 400u);
  EXPECT_EQ(mrc_monitor_valid(monitor_, quiet, kPage), 1);
}

TEST_F(MonitorTest, AOneShotDeliveryEndsTheSubscriptionsItOverlaps) {
  open(MRC_MONITOR_ONE_SHOT);
  char *p = map(4);
  char *kept = map(4);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(kept, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, 2 * kPage), MRC_OK);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p + kPage, 3 * kPage), MRC_OK);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, kept, 4 * kPage), MRC_OK);
  ASSERT_EQ(madvise(p + kPage, kPage, MADV_DONTNEED), 0);
  EXPECT_EQ(deliver(monitor_), 1u);
  const mrc_monitor_stats_t s = stats();
  EXPECT_EQ(s.ended_by_delivery, 2u);
  EXPECT_EQ(s.subscriptions, 1u);
  EXPECT_EQ(mrc_monitor_unsubscribe(monitor_, p, 2 * kPage), MRC_ERR_NOT_FOUND);
  // Ended means unwatched: the next change there is no one's business...
  ASSERT_EQ(madvise(p, kPage, MADV_DONTNEED), 0);
  EXPECT_EQ(deliver(monitor_), 0u);
  // ...until the range is subscribed again.
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, 2 * kPage), MRC_OK);
  unmap(p);
  EXPECT_EQ(deliver(monitor_), 1u);
  EXPECT_EQ(mrc_monitor_unsubscribe(monitor_, kept, 4 * kPage), MRC_OK);
}

TEST_F(MonitorTest, TheDeliveryThreadNotifiesOnAThreadOfItsOwn) {
  static std::atomic<std::thread::id> notifier{};
  on_notify_ = [](MonitorTest *, void *, size_t) { notifier = std::this_thread::get_id(); };
  open(MRC_MONITOR_DELIVERY_THREAD);
  char *p = map(4);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, 4 * kPage), MRC_OK);
  unmap(p);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!was_notified(p, 4 * kPage) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(was_notified(p, 4 * kPage)) << "no delivery within 10 s";
  EXPECT_NE(notifier.load(), std::this_thread::get_id());
  EXPECT_EQ(mrc_monitor_valid(monitor_, p, 4 * kPage), 1);
}

TEST_F(MonitorTest, NotifyMaySubscribeAndCheckButNotDeliverOrClose) {
  static mrc_status_t deliver_status, close_status, subscribe_status;
  static int valid_answer;
  static char *fresh;
  on_notify_ = [](MonitorTest *self, void *, size_t) {
    deliver_status = mrc_monitor_deliver(self->monitor(), nullptr);
    close_status = mrc_monitor_close(self->monitor());
    subscribe_status = mrc_monitor_subscribe(self->monitor(), fresh, kPage);
    valid_answer = mrc_monitor_valid(self->monitor(), fresh, kPage);
  };
  open(kManual);
  char *p = map(1);
  fresh = map(1);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(fresh, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, kPage), MRC_OK);
  unmap(p);
  EXPECT_EQ(deliver(monitor_), 1u);
  EXPECT_EQ(deliver_status, MRC_ERR_BUSY);
  EXPECT_EQ(close_status, MRC_ERR_BUSY);
  EXPECT_EQ(subscribe_status, MRC_OK);
  EXPECT_EQ(valid_answer, 1);
  EXPECT_EQ(mrc_monitor_unsubscribe(monitor_, fresh, kPage), MRC_OK);
}

TEST_F(MonitorTest, LostRecordsAreDeliveredAsTheWholeAddressSpace) {
  // A queue of two records, at the monitor's next start (none runs between the tests).
  mrc::uffd::testing::set_queue_capacity(2);
  open(MRC_MONITOR_ONE_SHOT);
  mrc::uffd::testing::set_queue_capacity(0);
  char *pages[6];
  for (char *&p : pages) {
    p = map(1);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, kPage), MRC_OK);
  }
  for (char *p : pages) unmap(p);
  EXPECT_EQ(mrc_monitor_valid(monitor_, pages[5], kPage), 0);
  deliver(monitor_);
  const mrc_monitor_stats_t s = stats();
  EXPECT_EQ(s.whole_space, 1u);
  EXPECT_EQ(s.subscriptions, 0u) << "one-shot: the whole space ends every subscription";
  EXPECT_TRUE(was_notified(nullptr, SIZE_MAX - 1));
}

TEST_F(MonitorTest, MemoryTheKernelCannotWatchIsRefusedWithTheReason) {
  open(kManual);
  const int id = shmget(IPC_PRIVATE, kPage, IPC_CREAT | 0600);
  ASSERT_GE(id, 0);
  void *shm = shmat(id, nullptr, 0);
  shmctl(id, IPC_RMID, nullptr);
  ASSERT_NE(shm, reinterpret_cast<void *>(-1));
  EXPECT_EQ(mrc_monitor_subscribe(monitor_, shm, kPage), MRC_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mrc_last_error()), "");
  EXPECT_EQ(stats().subscribes_refused, 1u);
  EXPECT_EQ(stats().subscriptions, 0u);
  shmdt(shm);
}

TEST_F(MonitorTest, BadInputIsRefusedAndChangesNothing) {
  mrc_monitor_params_t params;
  mrc_monitor_params_init(&params);
  mrc_monitor_t *monitor = nullptr;
  EXPECT_EQ(mrc_monitor_open(&params, &monitor), MRC_ERR_INVALID) << "no notify";
  EXPECT_NE(std::string(mrc_last_error()).find("notify"), std::string::npos);
  params.notify = [](void *, void *, size_t) {};
  EXPECT_EQ(mrc_monitor_open(nullptr, &monitor), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_open(&params, nullptr), MRC_ERR_INVALID);
  params.flags = 1u << 7;
  EXPECT_EQ(mrc_monitor_open(&params, &monitor), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_last_error()).find("flags"), std::string::npos);
  params.flags = 0;
  params.struct_size = 3;
  EXPECT_EQ(mrc_monitor_open(&params, &monitor), MRC_ERR_INVALID);
  params.struct_size = 1u << 20;
  EXPECT_EQ(mrc_monitor_open(&params, &monitor), MRC_ERR_INVALID);
  EXPECT_EQ(monitor, nullptr);

  open(kManual);
  char *p = map(1);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(mrc_monitor_subscribe(monitor_, p, kPage), MRC_OK);
  const mrc_monitor_stats_t before = stats();
  EXPECT_EQ(mrc_monitor_subscribe(nullptr, p, kPage), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_subscribe(monitor_, p, 0), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_subscribe(monitor_, p, SIZE_MAX), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_last_error()).find("wraps"), std::string::npos);
  EXPECT_EQ(mrc_monitor_unsubscribe(nullptr, p, kPage), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_unsubscribe(monitor_, p, 0), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_unsubscribe(monitor_, p + kPage, kPage), MRC_ERR_NOT_FOUND);
  EXPECT_EQ(mrc_monitor_valid(nullptr, p, kPage), 0);
  EXPECT_EQ(mrc_monitor_valid(monitor_, p, 0), 0);
  EXPECT_EQ(mrc_monitor_deliver(nullptr, nullptr), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_close(nullptr), MRC_ERR_INVALID);
  mrc_monitor_stats_t s{};
  EXPECT_EQ(mrc_monitor_stats(nullptr, &s), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_stats(monitor_, nullptr), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_stats_sized(monitor_, &s, 8), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_stats_sized(monitor_, &s, 1u << 20), MRC_ERR_INVALID);
  const mrc_monitor_stats_t after = stats();
  EXPECT_EQ(after.subscriptions, before.subscriptions);
  EXPECT_EQ(after.subscribes, before.subscribes);
  EXPECT_EQ(after.unsubscribes, before.unsubscribes);
  EXPECT_EQ(mrc_monitor_valid(monitor_, p, kPage), 1) << "the subscription is intact";
  // A larger stats struct gets its unknown tail zeroed.
  unsigned char larger[sizeof(mrc_monitor_stats_t) + 16];
  std::memset(larger, 0xff, sizeof larger);
  ASSERT_EQ(mrc_monitor_stats_sized(monitor_, reinterpret_cast<mrc_monitor_stats_t *>(larger),
                                    sizeof larger),
            MRC_OK);
  for (size_t i = sizeof(mrc_monitor_stats_t); i < sizeof larger; ++i) EXPECT_EQ(larger[i], 0);
}

}  // namespace
}  // namespace mrc::monitor::test
