// SPDX-License-Identifier: BSD-3-Clause
// The monitor thread: it waits until the userfaultfd is readable (io_uring, or poll(2) as the
// fallback), reads the events in batches and publishes them into the invalidation queue.
//
// SYNCHRONIZATION: see internal/monitor_state.h (the monitor thread) and queue.h (the producer
// side).
#include <liburing.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "base/check.h"
#include "base/futex.h"
#include "uffd/internal/kernel.h"
#include "uffd/internal/monitor_state.h"

namespace mrc::uffd::detail {

std::atomic<bool> g_paused{false};

namespace {

constexpr size_t kBatch = 64;  // uffd_msg per read()
constexpr uint64_t kUffdReady = 1;
constexpr uint64_t kControlRead = 2;

// This thread calls the kernel through syscall(), never through libc's read, ioctl, poll,
// nanosleep or close: a program may interpose those (an I/O profiler or a socket accelerator,
// preloaded), and their code, run here, could touch memory of a watched mapping that nothing
// touched before. In MISSING mode that fault would wait for this very thread, and the process
// would hang (docs/DESIGN.md, "Watching"). liburing enters the kernel by itself.
ssize_t sys_read(int fd, void *buffer, size_t length) noexcept {
  return syscall(SYS_read, fd, buffer, length);
}
int sys_ioctl(int fd, unsigned long request, void *argument) noexcept {
  return static_cast<int>(syscall(SYS_ioctl, fd, request, argument));
}
int sys_poll(pollfd *fds, nfds_t count, int timeout_ms) noexcept {
  timespec timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  return static_cast<int>(
      syscall(SYS_ppoll, fds, count, timeout_ms < 0 ? nullptr : &timeout, nullptr, 0));
}
void sys_nanosleep(const timespec &duration) noexcept {
  (void)syscall(SYS_nanosleep, &duration, nullptr);
}
void sys_close(int fd) noexcept { (void)syscall(SYS_close, fd); }

void publish(MonitorRun *run, InvalidationKind kind, uint64_t start, uint64_t end) noexcept {
  // The test switch (testing::set_drop_events; MRC_TEST_DROP_EVENTS=1 in test programs only):
  // read and count events but publish nothing, so that the stress harness can prove its oracle
  // detects a cache that misses invalidations.
  if (run->drop_events) return;
  run->queue->append(
      Invalidation{static_cast<uintptr_t>(start), static_cast<uintptr_t>(end), kind});
}

// The unmap of the round-trip measurement's own page (internal/monitor_state.h,
// MonitorRun::scratch): the one event matching it is neither published nor counted, and its owner
// learns that it was read.
bool is_scratch(MonitorRun *run, uint64_t start, uint64_t end) noexcept {
  const uint64_t scratch = run->scratch.load(std::memory_order_acquire);
  if (scratch == 0 || start != scratch || end != scratch + run->page_size) return false;
  run->scratch.store(0, std::memory_order_release);
  return true;
}

void resolve_fault(const MonitorRun *run, uint64_t address, uint64_t flags) noexcept {
  const uint64_t page = run->page_size;
  const uint64_t start = address & ~(page - 1);
  if ((flags & UFFD_PAGEFAULT_FLAG_WP) != 0) {
    // We never write-protect; should a WP fault come anyway, lift the protection and wake.
    uffdio_writeprotect unprotect{};
    unprotect.range.start = start;
    unprotect.range.len = page;
    if (sys_ioctl(run->uffd, UFFDIO_WRITEPROTECT, &unprotect) == 0) return;
  } else {
    uffdio_zeropage zero{};
    zero.range.start = start;
    zero.range.len = page;
    if (sys_ioctl(run->uffd, UFFDIO_ZEROPAGE, &zero) == 0) return;
  }
  // EEXIST (populated meanwhile), EAGAIN (the address space is changing), ENOENT (gone): wake
  // the thread; it retries the access and faults again if the page is still missing.
  uffdio_range range{start, page};
  (void)sys_ioctl(run->uffd, UFFDIO_WAKE, &range);
}

// Reads every queued message. The order is the protocol: raise pending, read, publish, lower
// pending; faults are resolved after lowering, so pending never covers anything that could wait.
void service(MonitorRun *run) noexcept {
  uffd_msg messages[kBatch];
  uint64_t fault_address[kBatch];
  uint64_t fault_flags[kBatch];
  while (g_paused.load(std::memory_order_relaxed)) {
    // A stop ends the pause: leaving closes the userfaultfd, which releases the threads whose
    // unmaps or (MISSING mode) faults wait here.
    if (run->stop.load(std::memory_order_acquire)) return;
    sys_nanosleep(timespec{0, 1000000});
  }
  for (;;) {
    run->queue->begin_batch();
    ssize_t n;
    do {
      n = sys_read(run->uffd, messages, sizeof(messages));
    } while (n < 0 && errno == EINTR);
    const size_t count = n > 0 ? static_cast<size_t>(n) / sizeof(uffd_msg) : 0;
    size_t faults = 0;
    uint64_t events = 0;
    for (size_t i = 0; i < count; ++i) {
      const uffd_msg &message = messages[i];
      switch (message.event) {
        case UFFD_EVENT_UNMAP:
          if (is_scratch(run, message.arg.remove.start, message.arg.remove.end)) break;
          publish(run, InvalidationKind::Unmap, message.arg.remove.start, message.arg.remove.end);
          ++events;
          break;
        case UFFD_EVENT_REMOVE:
          publish(run, InvalidationKind::Remove, message.arg.remove.start, message.arg.remove.end);
          ++events;
          break;
        case UFFD_EVENT_REMAP:
          publish(run, InvalidationKind::Remap, message.arg.remap.from,
                  message.arg.remap.from + message.arg.remap.len);
          ++events;
          break;
        case UFFD_EVENT_PAGEFAULT:
          fault_address[faults] = message.arg.pagefault.address;
          fault_flags[faults] = message.arg.pagefault.flags;
          ++faults;
          break;
        default: break;
      }
    }
    // Counted before pending falls: whoever waited for it sees the count too.
    if (events != 0) run->events->fetch_add(events, std::memory_order_relaxed);
    run->queue->end_batch();
    for (size_t i = 0; i < faults; ++i) resolve_fault(run, fault_address[i], fault_flags[i]);
    if (count < kBatch) return;
  }
}

// The fallback loop: poll(2) on the userfaultfd and the control eventfd. `timeout_ms` bounds the
// wait when an abandoned io_uring read may have swallowed the stop wakeup.
void poll_loop(MonitorRun *run, int timeout_ms) noexcept {
  for (;;) {
    pollfd fds[2] = {{run->uffd, POLLIN, 0}, {run->control, POLLIN, 0}};
    const int rc = sys_poll(fds, 2, timeout_ms);
    if (rc > 0 && (fds[0].revents & POLLIN) != 0) service(run);
    if (run->stop.load(std::memory_order_acquire)) return;
    if (rc > 0 && (fds[1].revents & POLLIN) != 0) {
      uint64_t value;
      ssize_t ignored = sys_read(run->control, &value, sizeof(value));
      (void)ignored;
    }
  }
}

// io_uring tells us only that the userfaultfd is readable (multishot POLL_ADD). Never
// IORING_OP_READ on it: the kernel would copy the message out, and so release the unmapping
// thread, inside io_uring before this thread could raise `pending` — the window the pending
// protocol exists to close. The read() happens in service(), after begin_batch().
class UringLoop {
 public:
  explicit UringLoop(MonitorRun *run) noexcept : run_(run), ring_(run->ring) {}

  // Returns true when asked to stop, false when the ring failed (the caller falls back).
  bool run() noexcept {
    for (;;) {
      if (!uffd_active_) {
        io_uring_sqe *sqe = io_uring_get_sqe(ring_);
        MRC_CHECK(sqe != nullptr);  // at most three requests in flight in a 64-entry ring
        io_uring_prep_poll_multishot(sqe, run_->uffd, POLLIN);
        io_uring_sqe_set_data64(sqe, kUffdReady);
        uffd_active_ = true;
      }
      if (!control_active_) {
        io_uring_sqe *sqe = io_uring_get_sqe(ring_);
        MRC_CHECK(sqe != nullptr);
        io_uring_prep_read(sqe, run_->control, &control_value_, sizeof(control_value_), 0);
        io_uring_sqe_set_data64(sqe, kControlRead);
        control_active_ = true;
      }
      if (!wait()) return false;
      bool readable = false;
      bool stop = false;
      bool broken = false;
      reap([&](const io_uring_cqe *cqe) {
        if (cqe->user_data == kUffdReady) {
          // A multishot request also ends (and is re-armed) when the completion queue
          // overflowed or it was cancelled; any other error means the ring cannot poll.
          if (cqe->res < 0 && cqe->res != -EOVERFLOW && cqe->res != -ECANCELED) {
            broken = true;
          } else {
            readable = true;
          }
        } else if (cqe->user_data == kControlRead) {
          stop = run_->stop.load(std::memory_order_acquire);
        }
      });
      if (readable) service(run_);
      if (stop) {
        retire();
        return true;
      }
      if (broken) {
        retire();
        return false;
      }
    }
  }

 private:
  bool wait() noexcept {
    for (;;) {
      const int rc = io_uring_submit_and_wait(ring_, 1);
      if (rc >= 0) return true;
      if (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) return false;
    }
  }

  template <class F>
  void reap(F &&on_completion) noexcept {
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe *cqe;
    io_uring_for_each_cqe(ring_, head, cqe) {
      ++seen;
      if (cqe->user_data == kUffdReady && (cqe->flags & IORING_CQE_F_MORE) == 0) {
        uffd_active_ = false;
      }
      if (cqe->user_data == kControlRead) control_active_ = false;
      on_completion(cqe);
    }
    io_uring_cq_advance(ring_, seen);
  }

  // Cancels our requests and waits for their last completions. A request in flight holds a
  // reference to its file, io_uring's teardown is asynchronous, and the kernel keeps every
  // registration of a userfaultfd (and a stale owner of those VMAs) until its last reference
  // goes: the next monitor's UFFDIO_REGISTER would meet EBUSY.
  void retire() noexcept {
    for (const uint64_t tag : {kUffdReady, kControlRead}) {
      const bool active = tag == kUffdReady ? uffd_active_ : control_active_;
      if (!active) continue;
      io_uring_sqe *sqe = io_uring_get_sqe(ring_);
      MRC_CHECK(sqe != nullptr);
      io_uring_prep_cancel64(sqe, tag, 0);
      io_uring_sqe_set_data64(sqe, kCancel);
    }
    while (uffd_active_ || control_active_) {
      if (!wait()) return;
      reap([](const io_uring_cqe *) {});
    }
  }

  static constexpr uint64_t kCancel = 3;
  MonitorRun *const run_;
  io_uring *const ring_;
  bool uffd_active_ = false;
  bool control_active_ = false;
  uint64_t control_value_ = 0;
};

// Called first thing on the monitor thread. IORING_REGISTER_ENABLE_RINGS from this thread makes
// it the ring's single issuer. (liburing 2.3 declares io_uring_enable_rings() but its library
// does not export it.)
LoopKind choose_loop(const MonitorRun *run) noexcept {
  if (run->ring == nullptr) return LoopKind::Poll;
  if (!run->enable_ring) return LoopKind::Uring;
  const long rc =
      syscall(__NR_io_uring_register, run->ring->ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0);
  return rc == 0 ? LoopKind::UringDeferred : LoopKind::Poll;
}

void run_loop(MonitorRun *run, LoopKind kind) noexcept {
  if (kind != LoopKind::Poll) {
    UringLoop loop(run);
    if (loop.run()) return;
    // The ring failed: the same work on poll(2). A read request we could not retire may swallow
    // the stop wakeup, hence the timeout.
    run->loop.store(static_cast<uint32_t>(LoopKind::Poll), std::memory_order_relaxed);
    service(run);
    poll_loop(run, 100);
    return;
  }
  poll_loop(run, -1);
}

}  // namespace

void *monitor_main(void *arg) {
  MonitorRun *run = static_cast<MonitorRun *>(arg);
  // The threading runtime's start-up (a sanitizer's, or glibc's) is over once this runs.
  const LoopKind kind = choose_loop(run);
  run->loop.store(static_cast<uint32_t>(kind), std::memory_order_release);
  os::futex_wake_all(&run->loop);
  run_loop(run, kind);
  // Close the userfaultfd here, before this thread exits: that drops every registration at
  // once. Thread exit may unmap memory on this thread (a sanitizer's or a preloaded runtime's
  // per-thread data, merged into a watched mapping); with the registrations still in place that
  // munmap would wait for an UNMAP reader, which is this very thread.
  sys_close(run->uffd);
  run->closed_uffd = true;
  return nullptr;
}

}  // namespace mrc::uffd::detail
