// SPDX-License-Identifier: BSD-3-Clause
// The monitor thread runs none of the program's code: a libc function that the program
// interposes (an I/O profiler or a socket accelerator preloaded into an application; here the
// test program's own read and ioctl) never runs on it. In MISSING mode a fault such code took on
// an untouched page of a watched mapping would wait for the monitor itself, and the process would
// hang (docs/DESIGN.md, "Watching"). A program of its own: the interposers are process-wide.
#undef _FORTIFY_SOURCE  // read() must be an ordinary declaration here
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

#include "tests/common/fork_child.h"
#include "tests/uffd/helpers.h"

namespace {

// A page of a watched mapping that nothing has touched; the interposers touch it when they run
// on the monitor thread.
std::atomic<char *> g_trap{nullptr};
std::atomic<int> g_calls_on_monitor{0};

void on_interposed_call() noexcept {
  char name[16] = "";
  (void)prctl(PR_GET_NAME, name, 0, 0, 0);
  if (strcmp(name, "mrc-monitor") != 0) return;
  g_calls_on_monitor.fetch_add(1);
  if (char *trap = g_trap.load()) (void)*static_cast<volatile char *>(trap);
}

}  // namespace

extern "C" ssize_t read(int fd, void *buffer, size_t length) {
  on_interposed_call();
  return syscall(SYS_read, fd, buffer, length);
}

extern "C" int ioctl(int fd, unsigned long request, ...) noexcept {
  va_list arguments;
  va_start(arguments, request);
  void *argument = va_arg(arguments, void *);
  va_end(arguments);
  on_interposed_call();
  return static_cast<int>(syscall(SYS_ioctl, fd, request, argument));
}

namespace mrc::uffd::test {
namespace {

constexpr int kSkipped = 77;

// In a forked child, whose alarm turns a hang into a failure: the monitor reads an unmap's event
// and answers a fault with the trap set.
TEST(Interposed, TheMonitorThreadRunsNoInterposedCode) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(10);
    setenv("MRC_MONITOR", "missing", 1);
    Subscription *subscription = nullptr;
    CHILD_CHECK(uffd::subscribe(&subscription) == MRC_OK);
    if (subscription->mode() != MRC_MONITOR_MISSING) _exit(kSkipped);
    const size_t page = page_size();
    char *raw = map_anonymous(18 * page, PROT_NONE);  // guards: a mapping of its own
    char *p = raw + page;
    CHILD_CHECK(mprotect(p, 16 * page, PROT_READ | PROT_WRITE) == 0);
    p[0] = 1;
    CHILD_CHECK(uffd::watch(u(p), page) == WatchResult::Watched);
    g_trap.store(p + 8 * page);
    CHILD_CHECK(munmap(p + 15 * page, page) == 0);  // returns once the monitor read the event
    CHILD_CHECK(p[4 * page] == 0);                  // once it answered the fault
    CHILD_CHECK(g_calls_on_monitor.load() == 0);
    uffd::unwatch(u(p), page);
    uffd::unsubscribe(subscription);
    _exit(0);
  }
  const int status = wait_child(pid);
  if (status == kSkipped) GTEST_SKIP() << "MISSING mode is not available here";
  EXPECT_EQ(status, 0) << (status == 1000 + SIGALRM ? "the monitor hung on its own fault" : "");
}

}  // namespace
}  // namespace mrc::uffd::test
