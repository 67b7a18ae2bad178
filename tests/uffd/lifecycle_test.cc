// SPDX-License-Identifier: BSD-3-Clause
// The monitor's life: start/stop/restart, modes and reasons, overflow, fork, seccomp, and the
// test-only switches.
#include <fcntl.h>
#include <liburing.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <string>
#include <thread>

#include "tests/common/fork_child.h"
#include "tests/uffd/helpers.h"
#include "uffd/testing.h"

#if defined(__SANITIZE_THREAD__) || defined(MRC_TSAN)
// The fork tests start a monitor thread in the child of a multi-threaded parent, which
// ThreadSanitizer only tolerates when told so.
extern "C" const char *__tsan_default_options() { return "die_after_fork=0"; }
#endif

namespace mrc::uffd::test {
namespace {

bool have_userfaultfd() {
  ScopedSubscription probe;
  return probe->mode() != MRC_MONITOR_UNCACHED;
}

TEST(Lifecycle, StartStopRestartAThousandTimesLeaksNothing) {
  const size_t length = 4 * page_size();
  {
    ScopedSubscription warm;  // lazily opened descriptors (the /proc/self/maps slot) open here
    char *p = map_anonymous(length);
    (void)uffd::watch(u(p), length);
    munmap(p, length);
  }
  const size_t fds = count_dir("/proc/self/fd");
  const size_t tasks = count_dir("/proc/self/task");
  for (int i = 0; i < 1000; ++i) {
    Subscription *subscription = nullptr;
    ASSERT_EQ(uffd::subscribe(&subscription), MRC_OK);
    if (i % 50 == 0 && subscription->mode() != MRC_MONITOR_UNCACHED) {
      char *p = map_anonymous(length);
      ASSERT_EQ(uffd::watch(u(p), length), WatchResult::Watched);
      munmap(p, length);
      const auto records = drain_all(subscription);
      EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap)) << i;
    }
    uffd::unsubscribe(subscription);
  }
  EXPECT_EQ(count_dir("/proc/self/fd"), fds);
  EXPECT_EQ(count_dir("/proc/self/task"), tasks);
  EXPECT_EQ(monitor_info().running, 0);
}

// subscribe() returns only once the monitor thread runs the monitor's own code: before that it
// is inside the threading runtime's start-up, which may hold that runtime's locks (ASan's
// allocator); a fork then handed them to the child, whose own monitor blocked on them while the
// child's munmap waited for that monitor (the hang of Fork.ChildForgetsAndReArms... under ASan).
TEST(Lifecycle, SubscribeReturnsOnceTheMonitorThreadRuns) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  for (int i = 0; i < 200; ++i) {
    ScopedSubscription subscription;
    ASSERT_STRNE(testing::monitor_loop(), "not started") << "subscription " << i;
  }
  EXPECT_STREQ(testing::monitor_loop(), "none");
}

// Linux release as major * 100 + minor (6.1 -> 601).
int kernel_release() {
  utsname name;
  if (uname(&name) != 0) return 0;
  int major = 0;
  int minor = 0;
  if (sscanf(name.release, "%d.%d", &major, &minor) != 2) return 0;
  return major * 100 + minor;
}

// The monitor waits on io_uring with a single issuer and deferred task work (Linux 6.1+): the
// monitor thread itself must enable the ring, or the kernel refuses its submissions and the loop
// falls back to poll(2), silently slower.
TEST(Lifecycle, TheMonitorWaitsOnIoUringWithDeferredTaskWork) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  io_uring probe;
  const int rc = io_uring_queue_init(4, &probe, 0);
  if (rc != 0) GTEST_SKIP() << "io_uring is not available here: " << strerrorname_np(-rc);
  io_uring_queue_exit(&probe);
  ScopedSubscription subscription;
  EXPECT_STREQ(testing::monitor_loop(), kernel_release() >= 601 ? "io_uring+defer" : "io_uring");
  const size_t length = 4 * page_size();
  for (int i = 0; i < 3; ++i) {
    char *p = map_anonymous(length);
    ASSERT_EQ(uffd::watch(u(p), length), WatchResult::Watched);
    ASSERT_EQ(munmap(p, length), 0);
    EXPECT_TRUE(
        covered(drain_all(subscription.get()), u(p), u(p) + length, InvalidationKind::Unmap));
    uffd::unwatch(u(p), length);
  }
  EXPECT_STREQ(testing::monitor_loop(), kernel_release() >= 601 ? "io_uring+defer" : "io_uring");
}

// A stopped monitor must leave no registration behind: the next monitor registers the same
// memory (a lingering one would answer EBUSY: "another userfaultfd").
TEST(Lifecycle, StoppingReleasesEveryRegistration) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  const size_t length = 8 * page_size();
  char *p = map_anonymous(length);
  char why[256] = "";
  for (int i = 0; i < 20; ++i) {
    ScopedSubscription subscription;
    ASSERT_EQ(uffd::watch(u(p), length, why, sizeof(why)), WatchResult::Watched)
        << i << ": " << why;
  }
  munmap(p, length);
}

TEST(Lifecycle, EveryConsumerSeesEveryRecord) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  ScopedSubscription first;
  ScopedSubscription second;
  const size_t length = 4 * page_size();
  char *p = map_anonymous(length);
  ASSERT_EQ(uffd::watch(u(p), length), WatchResult::Watched);
  munmap(p, length);
  EXPECT_TRUE(covered(drain_all(first.get()), u(p), u(p) + length, InvalidationKind::Unmap));
  EXPECT_TRUE(covered(drain_all(second.get()), u(p), u(p) + length, InvalidationKind::Unmap));
}

TEST(Lifecycle, InfoReportsTheRunningMonitor) {
  EXPECT_EQ(mrc_monitor_info(nullptr), MRC_ERR_INVALID);
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  ScopedSubscription subscription;
  mrc_monitor_info_t info;
  ASSERT_EQ(mrc_monitor_info(&info), MRC_OK);
  EXPECT_EQ(info.running, 1);
  EXPECT_EQ(info.mode, subscription->mode());
  EXPECT_NE(info.reason[0], '\0');
  EXPECT_NE(info.features & UFFD_FEATURE_EVENT_UNMAP, 0u);
  EXPECT_GT(info.vma_budget, 0u);
  const uint64_t events = info.events;
  const size_t length = 4 * page_size();
  char *p = map_aligned(length, length);
  ASSERT_EQ(uffd::watch(u(p), length), WatchResult::Watched);
  EXPECT_GE(monitor_info().watched_bytes, length);
  munmap(p, length);
  (void)drain_all(subscription.get());
  EXPECT_GT(monitor_info().events, events);
}

TEST(Lifecycle, TheRoundTripIsMeasuredAtStartAndItsUnmapsReachNoSubscriber) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  ScopedSubscription subscription;
  // Three unmaps of a watched scratch page measured what an unmap waits for the monitor; their
  // events were read (the unmaps returned) but neither published nor counted.
  EXPECT_GT(Monitor::round_trip_ticks(), 0u);
  EXPECT_EQ(monitor_info().events, 0u);
  EXPECT_TRUE(drain_all(subscription.get()).empty());
  // Only the scratch page's own unmaps are held back: an application's unmap is published.
  const size_t length = page_size();
  char *p = map_anonymous(length);
  ASSERT_EQ(uffd::watch(u(p), length), WatchResult::Watched);
  munmap(p, length);
  EXPECT_TRUE(covered(drain_all(subscription.get()), u(p), u(p) + length, InvalidationKind::Unmap));
  // Tests that price against the round trip set it; clearing it reports the measurement again.
  const uint64_t measured = Monitor::round_trip_ticks();
  testing::set_round_trip_ticks(measured + 12345);
  EXPECT_EQ(Monitor::round_trip_ticks(), measured + 12345);
  testing::set_round_trip_ticks(0);
  EXPECT_EQ(Monitor::round_trip_ticks(), measured);
}

TEST(Lifecycle, ModesCanBeForced) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  for (const char *mode : {"wp-async", "wp", "missing"}) {
    ScopedEnv env("MRC_MONITOR", mode);
    ScopedSubscription subscription;
    const mrc_monitor_info_t info = monitor_info();
    if (subscription->mode() == MRC_MONITOR_UNCACHED) {
      EXPECT_NE(std::string(info.reason).find(std::string("MRC_MONITOR=") + mode),
                std::string::npos)
          << info.reason;
      continue;
    }
    EXPECT_STREQ(info.mode_name, mode);
    EXPECT_NE(std::string(info.reason).find(std::string("MRC_MONITOR=") + mode), std::string::npos)
        << info.reason;
  }
  ScopedEnv env("MRC_MONITOR", "sideways");
  ScopedSubscription subscription;
  EXPECT_NE(subscription->mode(), MRC_MONITOR_UNCACHED);
  EXPECT_NE(std::string(monitor_info().reason).find("not understood"), std::string::npos);
}

// A process out of threads: the mode was negotiated, but the monitor thread cannot be created,
// so caching is off. The reason says that and why; it must not describe the negotiated mode
// (watches, probes) as if it ran.
TEST(Lifecycle, AMonitorThreadThatCannotStartMeansUncachedAndTheReasonSaysWhy) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  testing::fail_monitor_thread_start(EAGAIN);
  struct Restore {
    ~Restore() { testing::fail_monitor_thread_start(0); }
  } restore;
  ScopedSubscription subscription;
  EXPECT_EQ(subscription->mode(), MRC_MONITOR_UNCACHED);
  const mrc_monitor_info_t info = monitor_info();
  EXPECT_EQ(info.mode, MRC_MONITOR_UNCACHED);
  EXPECT_EQ(info.running, 0);
  const std::string reason = info.reason;
  EXPECT_EQ(reason.rfind("the monitor thread could not start (EAGAIN)", 0), 0u) << reason;
  EXPECT_NE(reason.find("every get registers"), std::string::npos) << reason;
  EXPECT_EQ(reason.find("exact gets"), std::string::npos) << reason;
  EXPECT_EQ(reason.find("registration watches"), std::string::npos) << reason;
  char why[256] = "";
  char *p = map_anonymous(page_size());
  EXPECT_EQ(uffd::watch(u(p), page_size(), why, sizeof(why)), WatchResult::NotMonitorable);
  EXPECT_TRUE(subscription->quiescent());
  munmap(p, page_size());
}

TEST(Lifecycle, InfoWithoutSubscribersProbesTheMode) {
  const mrc_monitor_info_t info = monitor_info();
  EXPECT_EQ(info.running, 0);
  EXPECT_NE(info.reason[0], '\0');
  ScopedEnv env("MRC_MONITOR", "off");
  EXPECT_EQ(monitor_info().mode, MRC_MONITOR_UNCACHED);
}

// A subscription that falls a whole queue behind is told to purge, never silently skips records;
// and the watch table, which lost records too, registers again.
TEST(Lifecycle, QueueOverflowMeansPurge) {
  testing::set_queue_capacity(8);
  struct Restore {
    ~Restore() { testing::set_queue_capacity(0); }
  } restore;
  ScopedSubscription subscription;
  if (subscription->mode() == MRC_MONITOR_UNCACHED) GTEST_SKIP() << monitor_info().reason;
  const size_t page = page_size();
  char *p = map_aligned(64 * page, kWatchBlock);
  ASSERT_EQ(uffd::watch(u(p), 64 * page), WatchResult::Watched);
  for (int i = 0; i < 20; ++i) ASSERT_EQ(munmap(p + 2 * i * page, page), 0);
  std::vector<Invalidation> seen;
  EXPECT_EQ(subscription->drain([&seen](const Invalidation &r) { seen.push_back(r); }),
            DrainResult::Overflow);
  EXPECT_FALSE(subscription->quiescent());  // stays untrusted until the purge is done
  EXPECT_EQ(subscription->drain([](const Invalidation &) {}), DrainResult::Ok);
  EXPECT_TRUE(subscription->quiescent());
  ASSERT_EQ(munmap(p + 41 * page, page), 0);
  const auto records = drain_all(subscription.get());
  EXPECT_TRUE(covered(records, u(p + 41 * page), u(p + 42 * page), InvalidationKind::Unmap))
      << describe(records);
  // The watch table overflowed as well: it may no longer trust that anything is registered.
  const uint64_t before = testing::registrations();
  ASSERT_EQ(uffd::watch(u(p + 50 * page), page), WatchResult::Watched);
  EXPECT_GT(testing::registrations(), before);
  munmap(p, 64 * page);
}

// Test-only: MRC_TEST_DROP_EVENTS=1 reads events but publishes nothing (the stress harness
// uses it to prove that its oracle catches a cache that misses invalidations).
TEST(Lifecycle, DropEventsSwitchPublishesNothing) {
  ScopedEnv drop("MRC_TEST_DROP_EVENTS", "1");
  ScopedSubscription subscription;
  if (subscription->mode() == MRC_MONITOR_UNCACHED) GTEST_SKIP() << monitor_info().reason;
  const size_t length = 4 * page_size();
  char *p = map_anonymous(length);
  ASSERT_EQ(uffd::watch(u(p), length), WatchResult::Watched);
  munmap(p, length);
  EXPECT_TRUE(drain_all(subscription.get()).empty());
  EXPECT_GE(monitor_info().events, 1u);
}

TEST(Lifecycle, PollLoopFallbackDeliversEvents) {
  testing::force_poll_loop(true);
  struct Restore {
    ~Restore() { testing::force_poll_loop(false); }
  } restore;
  ScopedSubscription subscription;
  if (subscription->mode() == MRC_MONITOR_UNCACHED) GTEST_SKIP() << monitor_info().reason;
  EXPECT_STREQ(testing::monitor_loop(), "poll");
  const size_t length = 4 * page_size();
  for (int i = 0; i < 100; ++i) {
    char *p = map_anonymous(length);
    ASSERT_EQ(uffd::watch(u(p), length), WatchResult::Watched);
    munmap(p, length);
    ASSERT_TRUE(
        covered(drain_all(subscription.get()), u(p), u(p) + length, InvalidationKind::Unmap));
    uffd::unwatch(u(p), length);
  }
}

// MISSING mode: a thread that touches an untouched page of a watched mapping waits until the
// monitor resolves its fault. Stopping the monitor must release it, whatever the monitor was
// doing: the monitor thread closes the userfaultfd as it leaves, which drops every registration
// and wakes every fault, and the kernel then maps the page itself. Here the fault waits for a
// paused monitor when the last subscriber leaves.
TEST(Lifecycle, StoppingReleasesAThreadWaitingForItsFault) {
  ScopedEnv missing("MRC_MONITOR", "missing");
  Subscription *subscription = nullptr;
  ASSERT_EQ(uffd::subscribe(&subscription), MRC_OK);
  if (subscription->mode() != MRC_MONITOR_MISSING) {
    uffd::unsubscribe(subscription);
    GTEST_SKIP() << "MISSING mode is not available here: " << monitor_info().reason;
  }
  const size_t page = page_size();
  // A mapping of its own (PROT_NONE guards): nothing else of this process merges into it.
  char *raw = map_anonymous(18 * page, PROT_NONE);
  char *p = raw + page;
  ASSERT_EQ(mprotect(p, 16 * page, PROT_READ | PROT_WRITE), 0);
  ASSERT_EQ(uffd::watch(u(p), page), WatchResult::Watched);
  testing::pause_monitor(true);
  struct Resume {
    ~Resume() { testing::pause_monitor(false); }
  } resume;
  std::atomic<bool> touched{false};
  std::thread toucher([&] {
    EXPECT_EQ(*static_cast<volatile char *>(p + 8 * page), 0);
    touched.store(true);
  });
  usleep(50000);
  EXPECT_FALSE(touched.load()) << "the fault did not wait for the monitor";
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    uffd::unsubscribe(subscription);
    stopped.store(true);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(stopped.load() && touched.load()) && std::chrono::steady_clock::now() < deadline) {
    usleep(1000);
  }
  const bool stopped_in_time = stopped.load();
  const bool released_in_time = touched.load();
  testing::pause_monitor(false);  // a stop that hangs on the paused monitor ends now
  stopper.join();
  toucher.join();
  EXPECT_TRUE(stopped_in_time) << "the stop waited for the paused monitor";
  EXPECT_TRUE(released_in_time) << "the faulting thread was not released by the stop";
  EXPECT_EQ(monitor_info().running, 0);
  munmap(raw, 18 * page);
}

// ---- fork ----

TEST(Fork, ChildForgetsAndReArmsWhileTheParentCarriesOn) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  ScopedSubscription subscription;
  const size_t length = 16 * page_size();
  char *shared_before = map_anonymous(length);
  char *parent_only = map_anonymous(length);
  ASSERT_EQ(uffd::watch(u(shared_before), length), WatchResult::Watched);
  ASSERT_EQ(uffd::watch(u(parent_only), length), WatchResult::Watched);
  ASSERT_TRUE(subscription->quiescent());

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: its VMAs lost their registration, it has no monitor thread.
    CHILD_CHECK(!subscription->quiescent());
    CHILD_CHECK(subscription->drain([](const Invalidation &) {}) == DrainResult::Forked);
    CHILD_CHECK(!subscription->quiescent());  // until the cache has forgotten and drains again
    CHILD_CHECK(subscription->drain([](const Invalidation &) {}) == DrainResult::Ok);
    CHILD_CHECK(subscription->quiescent());
    // Parent-era unwatches are harmless; new watches re-arm on a fresh monitor.
    uffd::unwatch(u(parent_only), length);
    CHILD_CHECK(uffd::watch(u(shared_before), length) == WatchResult::Watched);
    mrc_monitor_info_t info;
    mrc_monitor_info(&info);
    CHILD_CHECK(info.running == 1);
    CHILD_CHECK(munmap(shared_before, length) == 0);
    bool seen = false;
    CHILD_CHECK(subscription->drain([&](const Invalidation &r) {
      seen = seen || (r.start <= u(shared_before) && r.end >= u(shared_before) + length);
    }) == DrainResult::Ok);
    CHILD_CHECK(seen);
    uffd::unsubscribe(subscription.get());
    _exit(0);
  }
  // The parent is unaffected: no Forked, its registrations intact.
  EXPECT_EQ(wait_child(pid), 0);
  ASSERT_EQ(munmap(parent_only, length), 0);
  std::vector<Invalidation> records;
  EXPECT_EQ(subscription->drain([&](const Invalidation &r) { records.push_back(r); }),
            DrainResult::Ok);
  EXPECT_TRUE(covered(records, u(parent_only), u(parent_only) + length, InvalidationKind::Unmap))
      << describe(records);
  EXPECT_FALSE(touches(records, u(shared_before), u(shared_before) + length))
      << "the child's munmap is the child's business\n"
      << describe(records);
  munmap(shared_before, length);
}

// Descriptors of /proc/self/maps open in this process.
size_t open_maps_descriptors() {
  char own[64];
  snprintf(own, sizeof(own), "/proc/%d/maps", static_cast<int>(getpid()));
  size_t n = 0;
  DIR *dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (dirent *entry = readdir(dir)) {
    char path[PATH_MAX];
    char link[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%s", entry->d_name);
    const ssize_t length = readlink(path, link, sizeof(link) - 1);
    if (length <= 0) continue;
    link[length] = '\0';
    if (strcmp(link, own) == 0) ++n;
  }
  closedir(dir);
  return n;
}

// The /proc/self/maps descriptors that mapping queries keep open are closed when the last
// subscriber leaves. In a forked child, which starts with none open (the fork handler closed the
// inherited ones), whatever earlier tests of this process queried.
TEST(Fork, LastUnsubscribeClosesTheMapsDescriptors) {
  if (!have_userfaultfd()) GTEST_SKIP() << monitor_info().reason;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    CHILD_CHECK(open_maps_descriptors() == 0);
    const size_t fds = count_dir("/proc/self/fd");
    for (int round = 0; round < 3; ++round) {
      Subscription *first = nullptr;
      Subscription *second = nullptr;
      CHILD_CHECK(uffd::subscribe(&first) == MRC_OK);
      CHILD_CHECK(uffd::subscribe(&second) == MRC_OK);
      const size_t length = 4 * page_size();
      char *p = static_cast<char *>(
          mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      CHILD_CHECK(uffd::watch(u(p), length) == WatchResult::Watched);
      CHILD_CHECK(open_maps_descriptors() >= 1);  // the watch queried the mapping
      uffd::unwatch(u(p), length);
      uffd::unsubscribe(first);
      CHILD_CHECK(open_maps_descriptors() >= 1);  // a subscriber is left: kept for it
      uffd::unsubscribe(second);
      CHILD_CHECK(open_maps_descriptors() == 0);
      CHILD_CHECK(count_dir("/proc/self/fd") == fds);
      munmap(p, length);
    }
    _exit(0);
  }
  EXPECT_EQ(wait_child(pid), 0);
}

// ---- seccomp ----

int install_filter_denying_userfaultfd() {
#if defined(__x86_64__)
  constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
  return -1;
#endif
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_userfaultfd, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 0, 3),
      // The low half of the ioctl request (little-endian): USERFAULTFD_IOC_NEW on
      // /dev/userfaultfd is the other way to get one.
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args) + sizeof(uint64_t)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, USERFAULTFD_IOC_NEW, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program);
}

TEST(Seccomp, DeniedUserfaultfdMeansUncachedSaidOnce) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipe_fds[0]);
    dup2(pipe_fds[1], STDERR_FILENO);
    CHILD_CHECK(install_filter_denying_userfaultfd() == 0);
    for (int i = 0; i < 3; ++i) {
      Subscription *subscription = nullptr;
      CHILD_CHECK(uffd::subscribe(&subscription) == MRC_OK);
      CHILD_CHECK(subscription->mode() == MRC_MONITOR_UNCACHED);
      char why[256];
      char *p = static_cast<char *>(
          mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      CHILD_CHECK(uffd::watch(u(p), 4096, why, sizeof(why)) == WatchResult::NotMonitorable);
      CHILD_CHECK(subscription->quiescent());
      mrc_monitor_info_t info;
      mrc_monitor_info(&info);
      CHILD_CHECK(strstr(info.reason, "EPERM") != nullptr);
      CHILD_CHECK(info.running == 0);
      uffd::unsubscribe(subscription);
      munmap(p, 4096);
    }
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string output;
  char buffer[512];
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) output.append(buffer, n);
  close(pipe_fds[0]);
  EXPECT_EQ(wait_child(pid), 0) << output;
  size_t said = 0;
  for (size_t at = output.find("mrcache: caching is off"); at != std::string::npos;
       at = output.find("mrcache: caching is off", at + 1)) {
    ++said;
  }
  EXPECT_EQ(said, 1u) << output;
  EXPECT_NE(output.find("EPERM"), std::string::npos) << output;
}

}  // namespace
}  // namespace mrc::uffd::test
