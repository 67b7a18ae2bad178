// SPDX-License-Identifier: BSD-3-Clause
// MRC_MONITOR=bpf: where the programs cannot run, the monitor falls back to userfaultfd and says
// why; where they run (the soft-RoCE guests' stock kernel, as root), every change reaches the
// subscriptions without a watch, a subscription is quiescent only once it applied them, and a
// forked child never trusts its parent's ring. MRC_BPF_REQUIRED=1 makes a fallback a failure.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "bpf/server.h"
#include "tests/uffd/helpers.h"

namespace mrc::uffd::test {
namespace {

bool bpf_required() {
  const char *value = getenv("MRC_BPF_REQUIRED");
  return value != nullptr && strcmp(value, "1") == 0;
}

uintptr_t u(const void *p) { return reinterpret_cast<uintptr_t>(p); }

char *map_touched(size_t length) {
  void *p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  memset(p, 1, length);
  return static_cast<char *>(p);
}

TEST(BpfMode, FallsBackToUserfaultfdAndSaysWhyWhereTheProgramsCannotRun) {
  ScopedEnv bpf("MRC_MONITOR", "bpf");
  const mrc_monitor_info_t before = monitor_info();  // what a start would choose, nothing runs
  ScopedSubscription subscription;
  const mrc_monitor_info_t running = monitor_info();
  if (subscription->mode() == MRC_MONITOR_BPF) {
    EXPECT_EQ(before.mode, MRC_MONITOR_BPF) << before.reason;
    EXPECT_STREQ(running.mode_name, "bpf");
    EXPECT_NE(std::string(running.reason).find("eBPF programs at"), std::string::npos)
        << running.reason;
    GTEST_SKIP() << "the programs run here: " << running.reason;
  }
  EXPECT_FALSE(bpf_required()) << "MRC_BPF_REQUIRED=1, but: " << running.reason;
  for (const mrc_monitor_info_t &info : {before, running}) {
    EXPECT_NE(info.mode, MRC_MONITOR_BPF);
    EXPECT_EQ(std::string(info.reason).rfind("MRC_MONITOR=bpf unavailable: ", 0), 0U)
        << info.reason;
    EXPECT_NE(std::string(info.reason).find("userfaultfd instead: "), std::string::npos)
        << info.reason;
  }
}

TEST(BpfMode, AutoTakesTheDaemonsRingWhereOneServes) {
  char directory[] = "/tmp/mrc-bpfd-auto-XXXXXX";
  ASSERT_NE(mkdtemp(directory), nullptr);
  const std::string socket_path = std::string(directory) + "/bpfd.sock";
  bpf::Server *server = nullptr;
  if (bpf::Server::start(socket_path.c_str(), bpf::ServerLimits{}, &server) != MRC_OK) {
    const std::string why = mrc_last_error();
    rmdir(directory);
    if (bpf_required()) FAIL() << "MRC_BPF_REQUIRED=1 but the daemon could not start: " << why;
    GTEST_SKIP() << "the daemon cannot run here: " << why;
  }
  std::atomic<bool> stop{false};
  std::thread serving([&] { server->serve(stop); });
  {
    ScopedEnv automatic("MRC_MONITOR", nullptr);
    ScopedEnv daemon("MRC_BPFD_SOCKET", socket_path.c_str());
    ScopedSubscription subscription;
    EXPECT_EQ(subscription->mode(), MRC_MONITOR_BPF) << monitor_info().reason;
    EXPECT_NE(std::string(monitor_info().reason).find("from mrcache-bpfd"), std::string::npos)
        << monitor_info().reason;
  }
  stop.store(true);
  serving.join();
  server->close();
  rmdir(directory);
}

class BpfModeRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    subscription_ = std::make_unique<ScopedSubscription>();
    if ((*subscription_)->mode() != MRC_MONITOR_BPF) {
      const std::string why = monitor_info().reason;
      if (bpf_required()) FAIL() << "MRC_BPF_REQUIRED=1, but: " << why;
      GTEST_SKIP() << "bpf mode cannot run here: " << why;
    }
  }
  Subscription *subscription() { return subscription_->get(); }

  ScopedEnv bpf_{"MRC_MONITOR", "bpf"};
  std::unique_ptr<ScopedSubscription> subscription_;
};

TEST_F(BpfModeRuns, EveryChangeReachesTheSubscriptionWithoutAWatch) {
  const size_t page = page_size();
  char *unmapped = map_touched(2 * page);
  char *advised = map_touched(2 * page);
  char *moved = map_touched(2 * page);
  char *target = map_touched(2 * page);
  drain_all(subscription());
  EXPECT_TRUE(subscription()->quiescent());
  // No probe either: nothing is in flight, nothing asks the kernel.
  EXPECT_EQ(subscription()->probe_unmaps(), Subscription::Unmaps::Read);
  EXPECT_EQ(uffd::watch(u(unmapped), 2 * page), WatchResult::Watched);

  ASSERT_EQ(munmap(unmapped, 2 * page), 0);
  EXPECT_FALSE(subscription()->quiescent()) << "a change in the ring, not yet applied";
  ASSERT_EQ(madvise(advised, page, MADV_DONTNEED), 0);
  ASSERT_NE(mremap(moved, 2 * page, 2 * page, MREMAP_MAYMOVE | MREMAP_FIXED, target), MAP_FAILED);
  const std::vector<Invalidation> records = drain_all(subscription());
  EXPECT_TRUE(covered(records, u(unmapped), u(unmapped) + 2 * page, InvalidationKind::Unmap))
      << describe(records);
  EXPECT_TRUE(covered(records, u(advised), u(advised) + page, InvalidationKind::Remove))
      << describe(records);
  EXPECT_TRUE(covered(records, u(moved), u(moved) + 2 * page, InvalidationKind::Remap))
      << describe(records);
  EXPECT_TRUE(subscription()->quiescent());
  uffd::unwatch(u(unmapped), 2 * page);
  munmap(advised, 2 * page);
  munmap(target, 2 * page);
}

TEST_F(BpfModeRuns, AForkedChildForgetsItsParentsRingAndStartsItsOwn) {
  const size_t page = page_size();
  char *p = map_touched(page);
  drain_all(subscription());
  const pid_t child = fork();
  if (child == 0) {
    // The parent's ring sees none of the child's changes: the first drain says Forked, and the
    // next one comes from a monitor of the child's own.
    if (subscription()->drain([](const Invalidation &) {}) != DrainResult::Forked) _exit(2);
    if (uffd::watch(u(p), page) != WatchResult::Watched) _exit(3);  // starts the child's monitor
    if (subscription()->mode() != MRC_MONITOR_BPF) _exit(4);
    munmap(p, page);
    bool seen = false;
    const DrainResult drained = subscription()->drain(
        [&](const Invalidation &r) { seen = seen || (r.start <= u(p) && r.end >= u(p) + page); });
    if (drained != DrainResult::Ok) _exit(5);
    _exit(seen ? 0 : 6);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // 2: no Forked drain, 3: no watch, 4: not bpf mode, 5: no Ok drain, 6: the munmap unseen.
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child exited with " << WEXITSTATUS(status);
  EXPECT_TRUE(subscription()->quiescent()) << "the child's munmap is not the parent's";
  munmap(p, page);
}

}  // namespace
}  // namespace mrc::uffd::test
