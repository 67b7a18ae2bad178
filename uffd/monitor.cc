// The process-wide userfaultfd monitor: mode negotiation, the monitor thread, subscription,
// watches, fork handling and mrc_monitor_info().
//
// SYNCHRONIZATION
//   The monitor thread waits on the userfaultfd (readiness only) and on a control eventfd
//   through io_uring; raises the queue's `pending`, read()s a batch of uffd_msg, publishes
//   records, lowers `pending`. It never allocates, frees, logs, takes a lock, or calls a backend:
//   anything it freed could be registered memory whose munmap waits for the monitor itself.
//   g.mutex (the registry mutex) guards: the subscriber list and count, start/stop and every
//   field of the current run (fds, ring, thread, stack), the negotiated mode/features/reason,
//   the watch table (g.watches) and the internal subscription that keeps it in step with the
//   queue. subscribe, unsubscribe, Monitor::info, and the watch and unwatch calls that change
//   more than a count take it.
//   Not guarded: the watch table's fast path (watch/unwatch_many of memory whose piece already
//   counts a watch, watches.h), which reads the internal subscription's quiescent() and the
//   table's published snapshot inside an EpochGuard and changes only a piece's count
//   (watch_table.h).
//   Lock order: g.mutex, then the /proc/self/maps slot mutexes (base/proc_maps.cc). The fork
//   handlers take both before fork and release them after, so the child inherits them unlocked
//   and consistent.
//   The monitor thread takes no lock. It reads its MonitorRun (written before pthread_create,
//   unchanged until pthread_join) and writes only: the queue (producer side; see queue.h),
//   g.events (relaxed counter, read by info()), and the kernel's objects.
//   g.mode is an atomic read without the lock by Subscription::mode() (relaxed: a stale mode
//   only affects a report). g.probe_fd is read without the lock by
//   Subscription::probe_unmaps() (acquire, pairing with start_locked()'s release; see the field
//   for why it cannot change under a get).
//   Starting: the starter (holding g.mutex) waits on a futex until the monitor thread has stored
//   the loop it runs in run.loop (release; the starter's acquire load pairs with it):
//   start_locked() returns only once the thread is out of the threading runtime's start-up (see
//   there why). run.loop changes again (relaxed) only if the ring fails and the thread falls back
//   to poll(2); testing::monitor_loop() reads it.
//   The io_uring ring has one issuer, the monitor thread (IORING_SETUP_SINGLE_ISSUER: it enables
//   the ring itself); other threads only create it before and tear it down after the thread.
//   Stopping: the stopper sets run.stop (release) then writes the control eventfd; the monitor
//   loads run.stop (acquire) after each control wakeup and leaves; the stopper joins it.
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "base/check.h"
#include "base/epoch.h"
#include "base/futex.h"
#include "base/proc_maps.h"
#include "uffd/internal.h"
#include "uffd/kernel.h"
#include "uffd/modes.h"
#include "uffd/subscription.h"
#include "uffd/testing.h"
#include "uffd/uffd.h"
#include "uffd/watch_table.h"
#include "uffd/watches.h"

namespace mrc::uffd {

namespace detail {
void set_text(char *buf, size_t len, const char *text) noexcept {
  if (buf == nullptr || len == 0) return;
  snprintf(buf, len, "%s", text);
}
}  // namespace detail

namespace {

using detail::set_text;

constexpr size_t kDefaultQueueCapacity = size_t{1} << 15;  // 1 MiB of records
constexpr size_t kBatch = 64;                              // uffd_msg per read()
// How long settle_unmaps() waits for unmaps in flight. One lasts a monitor round trip (tens of
// microseconds here); only a storm of unmaps by threads that never get (a getting thread does
// not unmap while it waits), or a monitor kept off the CPU, holds the kernel's count up longer,
// and then the caller registers without the cache. 10 ms was outlasted on a loaded 2-CPU CI
// machine under ASan (the monitor waited that long for a CPU). Between probes it sleeps until
// the monitor's next batch, at most kSettleNapNs.
constexpr int64_t kSettleBudgetNs = 100'000'000;
constexpr int64_t kSettleNapNs = 50'000;
constexpr uint64_t kUffdReady = 1;
constexpr uint64_t kControlRead = 2;
constexpr uint64_t kRequiredEvents =
    UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_EVENT_REMOVE;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(MRC_TSAN)
constexpr size_t kStackBytes = size_t{1} << 20;
#else
constexpr size_t kStackBytes = size_t{128} << 10;
#endif

// How the monitor thread waits. 0 means it has not started yet.
enum class LoopKind : uint32_t { NotStarted, UringDeferred, Uring, Poll };

// Everything the monitor thread reads; written before pthread_create, constant until join
// (except `loop` and `closed_uffd`, written by the monitor thread).
struct MonitorRun {
  int uffd = -1;
  int control = -1;
  io_uring *ring = nullptr;  // nullptr: poll(2) loop
  InvalidationQueue *queue = nullptr;
  std::atomic<uint64_t> *events = nullptr;
  std::atomic<bool> stop{false};
  // The ring was created disabled, single-issuer, with deferred task work: the monitor thread
  // enables it and so becomes its only issuer (see start_locked()).
  bool enable_ring = false;
  bool drop_events = false;
  size_t page_size = 4096;
  bool closed_uffd = false;  // set by the monitor thread; read by the stopper after join
  // LoopKind: NotStarted until the monitor thread runs our code (its starter waits for that).
  std::atomic<uint32_t> loop{0};
};

}  // namespace

namespace detail {

struct MonitorState {
  std::mutex mutex;
  InvalidationQueue queue;
  Subscription internal{&queue};  // the watch table's own cursor
  Subscription *subscriptions = nullptr;
  size_t subscribers = 0;

  // The negotiated mode (of the current run, or of the last negotiation).
  std::atomic<int> mode{MRC_MONITOR_UNCACHED};
  uint64_t features = 0;
  char reason[256] = "";
  bool negotiated = false;

  // The current run.
  bool running = false;      // the monitor thread is up
  bool needs_start = false;  // subscribers exist but no monitor runs (a forked child)
  int uffd = -1;
  uint64_t register_mode = 0;
  int control = -1;
  io_uring ring{};
  bool ring_ready = false;
  pthread_t thread{};
  void *stack = nullptr;
  size_t stack_bytes = 0;
  MonitorRun run;
  std::atomic<uint64_t> events{0};
  // The descriptor gets probe for unmaps in flight (Subscription::probe_unmaps, any thread, no
  // lock): the running monitor's userfaultfd, kProbeNoMonitor, or kProbeRefused. Stored
  // (release) by start_locked() before any range is watched, kProbeNoMonitor before the
  // descriptor is closed; it changes only while no cache exists, or in a forked child.
  std::atomic<int> probe_fd{-1};

  // Test controls.
  std::atomic<size_t> queue_capacity{0};
  std::atomic<uint64_t> vma_budget{0};
  std::atomic<int64_t> idle_vmas{-1};
  std::atomic<bool> force_poll{false};

  detail::WatchTable watches;

  // Subscription internals (MonitorState is its friend).
  static void attach(Subscription *subscription, uint64_t head) noexcept {
    subscription->cursor_.store(head, std::memory_order_relaxed);
    subscription->resync_ = false;
    subscription->forked_.store(false, std::memory_order_relaxed);
  }
  static void mark_forked(Subscription *subscription) noexcept {
    subscription->forked_.store(true, std::memory_order_relaxed);
    subscription->cursor_.store(Subscription::kForkedCursor, std::memory_order_relaxed);
  }
  static Subscription *next_of(const Subscription *subscription) noexcept {
    return subscription->next_;
  }
};

}  // namespace detail

using detail::MonitorState;

namespace {

constexpr int kProbeNoMonitor = -1;
constexpr int kProbeRefused = -2;

constinit MonitorState g;
std::atomic<bool> g_paused{false};  // testing::pause_monitor
std::atomic<bool> g_said_uncached{false};
pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

// ---- negotiation ----

// Appends formatted text to a fixed buffer, truncating silently.
struct Text {
  char *buf;
  size_t len;
  size_t used = 0;
  // Drops a trailing "; " separator.
  const char *trimmed() noexcept {
    if (used >= 2 && buf[used - 2] == ';' && buf[used - 1] == ' ') buf[used -= 2] = '\0';
    return buf;
  }
  void add(const char *format, ...) noexcept __attribute__((format(printf, 2, 3))) {
    if (used + 1 >= len) return;
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(buf + used, len - used, format, args);
    va_end(args);
    if (n > 0) used = std::min(len - 1, used + static_cast<size_t>(n));
  }
};

struct Opened {
  int fd = -1;
  const char *how = "";
};

// The ways to get a userfaultfd, in order: user-mode-only (works unprivileged since 5.11),
// plain (root or vm.unprivileged_userfaultfd=1), /dev/userfaultfd (its file mode decides).
Opened open_uffd(bool allow_user_mode_only, Text *failures) noexcept {
  const int flags = O_CLOEXEC | O_NONBLOCK;
  Opened opened;
  if (allow_user_mode_only) {
    opened.fd = static_cast<int>(syscall(SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY));
    opened.how = "userfaultfd(UFFD_USER_MODE_ONLY)";
    if (opened.fd >= 0) return opened;
    failures->add("%s: %s; ", opened.how, strerrorname_np(errno));
  }
  opened.fd = static_cast<int>(syscall(SYS_userfaultfd, flags));
  opened.how = "userfaultfd()";
  if (opened.fd >= 0) return opened;
  failures->add("%s: %s; ", opened.how, strerrorname_np(errno));
  opened.how = "/dev/userfaultfd";
  const int device = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (device >= 0) {
    opened.fd = ioctl(device, USERFAULTFD_IOC_NEW, flags);
    const int error = errno;
    close(device);
    if (opened.fd >= 0) return opened;
    failures->add("%s: %s; ", opened.how, strerrorname_np(error));
  } else {
    failures->add("%s: %s; ", opened.how, strerrorname_np(errno));
  }
  opened.fd = -1;
  return opened;
}

// UFFDIO_API; on success *granted holds the features now enabled (or, for request 0, offered).
bool uffd_api(int fd, uint64_t request, uint64_t *granted) noexcept {
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = request;
  if (ioctl(fd, UFFDIO_API, &api) != 0) return false;
  *granted = api.features;
  return true;
}

// Registers and unregisters one scratch page: proves the mode works before we promise it.
bool probe_registration(int fd, uint64_t register_mode, int *error) noexcept {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void *scratch = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (scratch == MAP_FAILED) {
    *error = errno;
    return false;
  }
  uffdio_register request{};
  request.range.start = reinterpret_cast<uintptr_t>(scratch);
  request.range.len = page;
  request.mode = register_mode;
  const bool ok = ioctl(fd, UFFDIO_REGISTER, &request) == 0;
  *error = ok ? 0 : errno;
  if (ok) {
    // Unregister first: with the registration in place this munmap would wait for a reader.
    (void)ioctl(fd, UFFDIO_UNREGISTER, &request.range);
  }
  munmap(scratch, page);
  return ok;
}

// ---- the unmap probe ----

enum class ProbeAnswer { Clear, Changing, Refused };

// The kernel counts changes of watched memory in ctx->mmap_changing: raised inside the mmap
// lock before an unmap, a moving or shrinking mremap, or a madvise(DONTNEED/FREE/REMOVE) takes
// anything away, lowered by the changing thread once the monitor has read its event. Every
// UFFDIO_ZEROPAGE checks it first and fails with EAGAIN while it is raised; an empty range is
// refused (EINVAL) before any page-table work or lock. So this ioctl is a pure probe.
ProbeAnswer probe_mmap_changing(int uffd) noexcept {
  uffdio_zeropage probe{};
  if (ioctl(uffd, UFFDIO_ZEROPAGE, &probe) == 0) return ProbeAnswer::Refused;
  if (errno == EINVAL) return ProbeAnswer::Clear;
  return errno == EAGAIN ? ProbeAnswer::Changing : ProbeAnswer::Refused;
}

// What MRC_MONITOR asks for: the best mode that works (automatic), or one mode (uncached: "off").
struct Wanted {
  bool automatic = true;
  mrc_monitor_mode_t mode = MRC_MONITOR_UNCACHED;
  bool understood = true;  // false: a value the mode table does not know (then automatic)
};

struct Negotiated {
  mrc_monitor_mode_t mode = MRC_MONITOR_UNCACHED;
  int fd = -1;
  uint64_t features = 0;
  uint64_t register_mode = 0;
  bool unavailable = false;  // uncached because the kernel or the sandbox refused
  bool probe_ok = false;     // the unmap probe answers (exact gets can trust the table)
};

Wanted wanted_mode(const char *value) noexcept {
  Wanted wanted;
  if (value == nullptr || *value == '\0' || strcmp(value, detail::kAutoModeSetting) == 0)
    return wanted;
  wanted.automatic = !detail::parse_mode_setting(value, &wanted.mode);
  wanted.understood = !wanted.automatic;
  return wanted;
}

// Chooses the best mode allowed by MRC_MONITOR, the kernel and the sandbox; writes why.
Negotiated negotiate(char *reason, size_t reason_len) noexcept {
  Negotiated result;
  Text why{reason, reason_len};
  const char *env = getenv("MRC_MONITOR");  // NOLINT(concurrency-mt-unsafe): no setenv here
  const Wanted wanted = wanted_mode(env);
  if (!wanted.understood) {
    why.add("MRC_MONITOR=%s not understood (%s", env, detail::kAutoModeSetting);
    for (const detail::ModeSpelling &spelling : detail::kModeSpellings)
      why.add(", %s", spelling.setting);
    why.add("); ");
  }
  if (!wanted.automatic && wanted.mode == MRC_MONITOR_UNCACHED) {
    why.add("MRC_MONITOR=%s: no userfaultfd; every get registers, the last put deregisters", env);
    return result;
  }

  char failures_buf[192] = "";
  Text failures{failures_buf, sizeof(failures_buf)};
  Opened opened = open_uffd(true, &failures);
  uint64_t offered = 0;
  if (opened.fd >= 0 && !uffd_api(opened.fd, 0, &offered)) {
    failures.add("UFFDIO_API: %s; ", strerrorname_np(errno));
    close(opened.fd);
    opened.fd = -1;
  }
  if (opened.fd < 0) {
    result.unavailable = true;
    why.add(
        "userfaultfd unavailable (%s) (seccomp, vm.unprivileged_userfaultfd=0 or a kernel "
        "without it); every get registers, the last put deregisters",
        failures.trimmed());
    return result;
  }
  close(opened.fd);
  if ((offered & kRequiredEvents) != kRequiredEvents) {
    result.unavailable = true;
    why.add("the kernel's userfaultfd lacks UNMAP/REMAP/REMOVE events (features %#" PRIx64
            "); every get registers, the last put deregisters",
            offered);
    return result;
  }

  struct Candidate {
    mrc_monitor_mode_t mode;
    uint64_t needs;
    uint64_t register_mode;
  };
  const uint64_t wp_shmem = offered & UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
  const Candidate all[] = {
      {MRC_MONITOR_WP_ASYNC, UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_PAGEFAULT_FLAG_WP,
       UFFDIO_REGISTER_MODE_WP},
      {MRC_MONITOR_WP, UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFDIO_REGISTER_MODE_WP},
      {MRC_MONITOR_MISSING, 0, UFFDIO_REGISTER_MODE_MISSING},
  };
  failures.used = 0;
  failures_buf[0] = '\0';
  for (const Candidate &candidate : all) {
    if (!wanted.automatic && candidate.mode != wanted.mode) continue;
    const char *name = detail::mode_name(candidate.mode);
    if ((offered & candidate.needs) != candidate.needs) {
      failures.add("%s: kernel lacks %s; ", name,
                   candidate.mode == MRC_MONITOR_WP_ASYNC ? "UFFD_FEATURE_WP_ASYNC (6.7)"
                                                          : "write-protect support (5.7)");
      continue;
    }
    // MISSING mode needs the kernel's own accesses to fault through us too: with
    // UFFD_USER_MODE_ONLY a read(2) or an ibv_reg_mr on an untouched watched page would fail
    // with EFAULT instead of waiting for the zero page.
    const bool user_mode_only_ok = candidate.mode != MRC_MONITOR_MISSING;
    Opened fd = open_uffd(user_mode_only_ok, &failures);
    if (fd.fd < 0) continue;
    uint64_t request = kRequiredEvents;
    if (candidate.mode == MRC_MONITOR_WP_ASYNC) request |= UFFD_FEATURE_WP_ASYNC | wp_shmem;
    if (candidate.mode == MRC_MONITOR_WP) request |= wp_shmem;
    uint64_t granted = 0;
    int error = 0;
    if (!uffd_api(fd.fd, request, &granted)) {
      failures.add("%s: UFFDIO_API %s; ", name, strerrorname_np(errno));
      close(fd.fd);
      continue;
    }
    if (!probe_registration(fd.fd, candidate.register_mode, &error)) {
      failures.add("%s: UFFDIO_REGISTER %s; ", name, strerrorname_np(error));
      close(fd.fd);
      continue;
    }
    result.mode = candidate.mode;
    result.fd = fd.fd;
    result.features = granted;
    result.register_mode = candidate.register_mode;
    switch (candidate.mode) {
      case MRC_MONITOR_WP_ASYNC:
        why.add(
            "%s with UFFD_FEATURE_WP_ASYNC: write-protect-only registration watches any "
            "mapping and never faults",
            fd.how);
        break;
      case MRC_MONITOR_WP:
        why.add(
            "%s, write-protect-only registration: anonymous, shmem and hugetlbfs memory; "
            "file mappings need UFFD_FEATURE_WP_ASYNC (Linux 6.7)",
            fd.how);
        break;
      default:
        why.add(
            "%s, MISSING mode: the monitor resolves every fault with a zero page; private "
            "anonymous memory only (write-protect mode needs Linux 5.7)",
            fd.how);
        break;
    }
    if (!wanted.automatic) why.add(" (MRC_MONITOR=%s)", env);
    // Nothing is watched yet, so nothing can be in flight: any answer but Clear means the
    // kernel (or a sandbox) refuses the probe, and exact caches must not trust their tables.
    result.probe_ok = probe_mmap_changing(fd.fd) == ProbeAnswer::Clear;
    why.add(result.probe_ok ? "; exact gets: one unmap probe (UFFDIO_ZEROPAGE) each"
                            : "; the kernel refuses the unmap probe (UFFDIO_ZEROPAGE): exact "
                              "caches register every get anew");
    if (failures.used > 0) why.add("; tried first: %s", failures.trimmed());
    return result;
  }
  result.unavailable = true;
  if (!wanted.automatic) {
    why.add("MRC_MONITOR=%s cannot run here (%s); every get registers, the last put deregisters",
            env, failures.trimmed());
  } else {
    why.add("no userfaultfd mode works (%s); every get registers, the last put deregisters",
            failures.trimmed());
  }
  return result;
}

// Once per process, on the thread that subscribes (never the monitor thread).
void say_uncached_once(const char *reason) noexcept {
  if (g_said_uncached.exchange(true, std::memory_order_relaxed)) return;
  char line[384];
  const int n = snprintf(line, sizeof(line), "mrcache: caching is off: %s\n", reason);
  if (n > 0) {
    const size_t length = std::min(sizeof(line) - 1, static_cast<size_t>(n));
    ssize_t ignored = write(STDERR_FILENO, line, length);
    (void)ignored;
  }
}

// ---- the monitor thread ----

void publish(MonitorRun *run, InvalidationKind kind, uint64_t start, uint64_t end) noexcept {
  // MRC_TEST_DROP_EVENTS=1 (test-only): read and count events but publish nothing, so that the
  // stress harness can prove its oracle detects a cache that misses invalidations.
  if (run->drop_events) return;
  run->queue->append(
      Invalidation{static_cast<uintptr_t>(start), static_cast<uintptr_t>(end), kind});
}

void resolve_fault(const MonitorRun *run, uint64_t address, uint64_t flags) noexcept {
  const uint64_t page = run->page_size;
  const uint64_t start = address & ~(page - 1);
  if ((flags & UFFD_PAGEFAULT_FLAG_WP) != 0) {
    // We never write-protect; should a WP fault come anyway, lift the protection and wake.
    uffdio_writeprotect unprotect{};
    unprotect.range.start = start;
    unprotect.range.len = page;
    if (ioctl(run->uffd, UFFDIO_WRITEPROTECT, &unprotect) == 0) return;
  } else {
    uffdio_zeropage zero{};
    zero.range.start = start;
    zero.range.len = page;
    if (ioctl(run->uffd, UFFDIO_ZEROPAGE, &zero) == 0) return;
  }
  // EEXIST (populated meanwhile), EAGAIN (the address space is changing), ENOENT (gone): wake
  // the thread; it retries the access and faults again if the page is still missing.
  uffdio_range range{start, page};
  (void)ioctl(run->uffd, UFFDIO_WAKE, &range);
}

// Reads every queued message. The order is the protocol: raise pending, read, publish, lower
// pending; faults are resolved after lowering, so pending never covers anything that could wait.
void service(MonitorRun *run) noexcept {
  uffd_msg messages[kBatch];
  uint64_t fault_address[kBatch];
  uint64_t fault_flags[kBatch];
  while (g_paused.load(std::memory_order_relaxed)) {
    const timespec tick{0, 1000000};
    nanosleep(&tick, nullptr);
  }
  for (;;) {
    run->queue->begin_batch();
    ssize_t n;
    do {
      n = read(run->uffd, messages, sizeof(messages));
    } while (n < 0 && errno == EINTR);
    const size_t count = n > 0 ? static_cast<size_t>(n) / sizeof(uffd_msg) : 0;
    size_t faults = 0;
    uint64_t events = 0;
    for (size_t i = 0; i < count; ++i) {
      const uffd_msg &message = messages[i];
      switch (message.event) {
        case UFFD_EVENT_UNMAP:
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
    const int rc = poll(fds, 2, timeout_ms);
    if (rc > 0 && (fds[0].revents & POLLIN) != 0) service(run);
    if (run->stop.load(std::memory_order_acquire)) return;
    if (rc > 0 && (fds[1].revents & POLLIN) != 0) {
      uint64_t value;
      ssize_t ignored = read(run->control, &value, sizeof(value));
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
  close(run->uffd);
  run->closed_uffd = true;
  return nullptr;
}

// ---- lifecycle (REQUIRES: g.mutex) ----

void close_run_locked(bool in_forked_child = false) noexcept {
  // Drops every registration and releases any waiting thread. The monitor thread closed it
  // itself if it ran (and the number may belong to someone else by now).
  g.probe_fd.store(kProbeNoMonitor, std::memory_order_relaxed);
  if (g.uffd >= 0 && !g.run.closed_uffd) close(g.uffd);
  g.uffd = -1;
  g.run.closed_uffd = false;
  if (g.ring_ready) io_uring_queue_exit(&g.ring);
  g.ring_ready = false;
  if (g.control >= 0) close(g.control);
  g.control = -1;
#if defined(__SANITIZE_THREAD__) || defined(MRC_TSAN)
  // ThreadSanitizer keeps the parent's threads registered in a forked child: a new monitor
  // stack at the same address would give the child's monitor the dead one's thread id.
  if (in_forked_child) g.stack = nullptr;
#else
  (void)in_forked_child;
#endif
  if (g.stack != nullptr) munmap(g.stack, g.stack_bytes);
  g.stack = nullptr;
  g.stack_bytes = 0;
  g.queue.release();
  g.watches.reset(detail::WatchConfig{});
  g.running = false;
}

void become_uncached_locked(bool unavailable) noexcept {
  close_run_locked();
  g.mode.store(MRC_MONITOR_UNCACHED, std::memory_order_relaxed);
  g.features = 0;
  if (unavailable) say_uncached_once(g.reason);
}

uint64_t default_vma_budget() noexcept {
  uint64_t max_map_count = 65530;
  const int fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char text[32];
    const ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n > 0) {
      text[n] = '\0';
      const uint64_t parsed = strtoull(text, nullptr, 10);
      if (parsed > 0) max_map_count = parsed;
    }
  }
  // A quarter of the ceiling: the rest stays the application's.
  return max_map_count / 4;
}

void start_locked() noexcept {
  g.needs_start = false;
  Negotiated negotiated = negotiate(g.reason, sizeof(g.reason));
  g.negotiated = true;
  if (negotiated.fd < 0) {
    become_uncached_locked(negotiated.unavailable);
    return;
  }
  g.uffd = negotiated.fd;
  g.register_mode = negotiated.register_mode;

  const size_t capacity = g.queue_capacity.load(std::memory_order_relaxed);
  const char *failed = nullptr;
  if (g.queue.allocate(capacity != 0 ? capacity : kDefaultQueueCapacity) != MRC_OK) {
    failed = "cannot allocate the invalidation queue";
  }
  if (failed == nullptr) {
    g.control = eventfd(0, EFD_CLOEXEC);
    if (g.control < 0) failed = "eventfd failed";
  }
  if (failed == nullptr) {
    const size_t guard = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    g.stack_bytes = guard + kStackBytes + guard;
    // Our own, populated stack: in MISSING mode the monitor must never fault on watched memory,
    // and a recycled thread stack could have been watched by its previous owner.
    g.stack = mmap(nullptr, g.stack_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_POPULATE, -1, 0);
    if (g.stack == MAP_FAILED) {
      g.stack = nullptr;
      failed = "cannot allocate the monitor's stack";
    } else {
      // Guard pages at both ends, and a VMA flag of its own: the kernel must never merge an
      // application's adjacent mapping into the stack's VMA (watch() refuses our own memory).
      // Not MADV_DONTFORK: glibc's thread list, walked in a forked child, lives on this stack.
      (void)mprotect(g.stack, guard, PROT_NONE);
      (void)mprotect(static_cast<char *>(g.stack) + guard + kStackBytes, guard, PROT_NONE);
      (void)madvise(static_cast<char *>(g.stack) + guard, kStackBytes, MADV_NOHUGEPAGE);
    }
  }
  g.run.enable_ring = false;
  if (failed == nullptr && !g.force_poll.load(std::memory_order_relaxed)) {
    // Room for bursts of readiness completions; a multishot poll that cannot post ends and
    // is re-armed, so a full queue costs time, never an event.
    // Deferred task work: the uffd's wakeup queues the poll completion on the ring and wakes the
    // monitor straight from io_uring's wait, instead of going through the generic task-work
    // path on its way out of the kernel (measured: ~0.5 us off each round trip here). It
    // requires a single issuer; that must be the monitor thread, hence disabled until it starts.
    g.ring_ready = io_uring_queue_init(64, &g.ring,
                                       IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                                           IORING_SETUP_R_DISABLED) == 0;
    g.run.enable_ring = g.ring_ready;
    // Kernels before 6.1 refuse those flags.
    if (!g.ring_ready) g.ring_ready = io_uring_queue_init(64, &g.ring, 0) == 0;
    // Without io_uring (disabled by sysctl or seccomp) the poll(2) loop does the same job.
  }
  if (failed != nullptr) {
    Text why{g.reason, sizeof(g.reason)};
    why.used = strlen(g.reason);
    why.add("; but %s", failed);
    become_uncached_locked(true);
    return;
  }

  g.events.store(0, std::memory_order_relaxed);  // "events read since start"
  g.run.uffd = g.uffd;
  g.run.control = g.control;
  g.run.ring = g.ring_ready ? &g.ring : nullptr;
  g.run.queue = &g.queue;
  g.run.events = &g.events;
  g.run.stop.store(false, std::memory_order_relaxed);
  const char *drop =
      getenv("MRC_TEST_DROP_EVENTS");  // NOLINT(concurrency-mt-unsafe): no setenv here
  g.run.drop_events = drop != nullptr && strcmp(drop, "1") == 0;
  g.run.page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  g.run.loop.store(static_cast<uint32_t>(LoopKind::NotStarted), std::memory_order_relaxed);

  pthread_attr_t attr;
  pthread_attr_init(&attr);
  const size_t guard = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  pthread_attr_setstack(&attr, static_cast<char *>(g.stack) + guard, kStackBytes);
  // The thread inherits this mask: it blocks every signal from its first instruction, so that no
  // handler (which could allocate or take a lock) ever runs on it.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const int rc = pthread_create(&g.thread, &attr, monitor_main, &g.run);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    Text why{g.reason, sizeof(g.reason)};
    why.used = strlen(g.reason);
    why.add("; but the monitor thread could not start (%s)", strerrorname_np(rc));
    become_uncached_locked(true);
    return;
  }
  pthread_setname_np(g.thread, "mrc-monitor");
  // Wait until the thread runs monitor_main. Before that it is inside the threading runtime's
  // start-up, which may take that runtime's locks (ASan's allocator: pthread_getattr_np frees).
  // A fork meanwhile (g.mutex no longer held) would hand the child those locks held by no thread:
  // the child's own monitor then blocks on them at its start, and the child's next munmap of
  // watched memory waits for it forever. And no range may be registered before the thread can
  // read events: its start-up could wait for a runtime lock held by a thread blocked in munmap.
  constexpr uint32_t kNotStarted = static_cast<uint32_t>(LoopKind::NotStarted);
  while (g.run.loop.load(std::memory_order_acquire) == kNotStarted) {
    os::futex_wait(&g.run.loop, kNotStarted);
  }
  g.running = true;
  g.mode.store(negotiated.mode, std::memory_order_relaxed);
  g.features = negotiated.features;
  g.probe_fd.store(negotiated.probe_ok ? g.uffd : kProbeRefused, std::memory_order_release);

  detail::WatchConfig config;
  config.uffd = g.uffd;
  config.register_mode = g.register_mode;
  config.mode = negotiated.mode;
  const uint64_t budget = g.vma_budget.load(std::memory_order_relaxed);
  config.vma_budget = budget != 0 ? budget : default_vma_budget();
  const int64_t idle = g.idle_vmas.load(std::memory_order_relaxed);
  config.idle_limit = idle >= 0 ? static_cast<uint64_t>(idle) : detail::kDefaultIdleLimit;
  config.own[0][0] = reinterpret_cast<uintptr_t>(g.stack);
  config.own[0][1] = config.own[0][0] + g.stack_bytes;
  config.own[1][0] = g.queue.storage_begin();
  config.own[1][1] = g.queue.storage_end();
  g.watches.reset(config);
  MonitorState::attach(&g.internal, g.queue.head());
}

void stop_locked() noexcept {
  if (g.running) {
    g.run.stop.store(true, std::memory_order_release);
    const uint64_t one = 1;
    ssize_t ignored = write(g.control, &one, sizeof(one));
    (void)ignored;
    pthread_join(g.thread, nullptr);
  }
  close_run_locked();
  g.needs_start = false;
  // The last cache left: no descriptor of ours stays open (a later query opens one again).
  os::close_maps_descriptors();
}

// Returns once no unmap, remap or madvise of watched memory is in flight: one ioctl when
// nothing is.
//
// Why: the kernel removes the VMA first and queues the UNMAP event only after dropping the
// mmap lock; until the monitor reads it, another thread may already have mapped new memory at
// the same addresses, and a watch entry still stands there. Watches accept that window (see
// watch_table.h); unregistering does not: it would act on someone else's mapping. Once the probe
// answers Clear, every such operation that happened before this call has been read, hence
// (pending protocol) is visible to a drain that waits for `pending` to fall (docs/DESIGN.md,
// "Exact under concurrent unmaps").
void wait_for_unmaps_in_flight(int uffd) noexcept {
  if (uffd < 0) return;
  for (unsigned attempt = 0; probe_mmap_changing(uffd) == ProbeAnswer::Changing; ++attempt) {
    if (attempt >= 16) sched_yield();  // the monitor needs the CPU to read the event
  }
}

// Keeps the watch table in step with the kernel: UNMAP and REMAP took registrations away (a
// REMAP's record is the old range; the moved VMA keeps its registration at the new address,
// where the table records nothing: a watch there registers it again, a no-op for the kernel).
// `settle`: first wait for unmaps in flight (before unregistering anything). Nothing to follow
// while no monitor runs: the table is empty and the queue may be released (uncached mode).
void sync_watches_locked(bool settle) noexcept {
  if (!g.running) return;
  if (settle) wait_for_unmaps_in_flight(g.uffd);
  // Before the cursor moves past a record that cuts an entry, the fast path must stop trusting
  // the snapshot that shows it (watch_table.h); the caller publishes the table again when done.
  g.watches.withdraw();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const DrainResult result = g.internal.drain([](const Invalidation &record) {
      if (record.kind == InvalidationKind::Remove) return;
      g.watches.forget(record.start, record.end, record.kind == InvalidationKind::Unmap);
    });
    if (result == DrainResult::Ok) return;
    g.watches.forget_all();  // lapped: any registration may be gone; drain again to resync
  }
}

// Unregisters idle watch entries (past the limit, or to make room under the VMA budget).
void evict_idle_watches_locked() noexcept {
  sync_watches_locked(/*settle=*/true);
  g.watches.evict_idle();
}

// ---- fork ----

void before_fork() noexcept { g.mutex.lock(); }

void after_fork_in_parent() noexcept { g.mutex.unlock(); }

// The child has no monitor thread, and its VMAs lost their registration (no EVENT_FORK). Drop
// the inherited descriptors (closing them here does not affect the parent's), forget the watch
// table and tell every subscription, through its next drain(), to forget its regions.
void after_fork_in_child() noexcept {
  close_run_locked(/*in_forked_child=*/true);
  g.queue.reset_after_fork();
  for (Subscription *subscription = g.subscriptions; subscription != nullptr;
       subscription = MonitorState::next_of(subscription)) {
    MonitorState::mark_forked(subscription);
  }
  MonitorState::attach(&g.internal, g.queue.head());
  g.events.store(0, std::memory_order_relaxed);
  g.needs_start = g.subscribers > 0;
  g_said_uncached.store(false, std::memory_order_relaxed);  // once per process: a new one
  g.mutex.unlock();
}

// The registry mutex is taken before the maps descriptors' locks (watch() queries mappings under
// it), so their handlers are registered first: prepare handlers run in reverse order.
void install_fork_handlers() noexcept {
  os::register_maps_fork_handlers();
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

}  // namespace

namespace detail {
void ensure_fork_handlers() noexcept { pthread_once(&g_atfork_once, install_fork_handlers); }
}  // namespace detail

// ---- Monitor::info ----

void Monitor::info(mrc_monitor_info_t *out) noexcept {
  if (out == nullptr) return;
  std::lock_guard<std::mutex> hold(g.mutex);
  if (g.subscribers == 0) {
    // Nothing runs: report what a start would choose now.
    Negotiated probe = negotiate(g.reason, sizeof(g.reason));
    if (probe.fd >= 0) close(probe.fd);
    g.negotiated = true;
    g.mode.store(probe.mode, std::memory_order_relaxed);
    g.features = probe.features;
  }
  *out = mrc_monitor_info_t{};
  out->mode = static_cast<mrc_monitor_mode_t>(g.mode.load(std::memory_order_relaxed));
  out->mode_name = detail::mode_name(out->mode);
  snprintf(out->reason, sizeof(out->reason), "%s", g.reason);
  out->features = g.features;
  out->running = g.running ? 1 : 0;
  out->events = g.events.load(std::memory_order_relaxed);
  out->watched_bytes = g.watches.watched_bytes();
  out->vmas_added = g.watches.vmas_added();
  out->vma_budget = g.watches.vma_budget();
}

// ---- the subscription ----

DrainResult Subscription::begin_drain() noexcept {
  if (forked_.load(std::memory_order_relaxed)) {
    // The cursor stays poisoned (quiescent() false) until the cache has forgotten its regions
    // and drains again.
    forked_.store(false, std::memory_order_relaxed);
    resync_ = true;
    resync_to_ = queue_->head();
    return DrainResult::Forked;
  }
  if (resync_) {
    resync_ = false;
    cursor_.store(resync_to_, std::memory_order_release);
  }
  queue_->wait_until_idle();
  return DrainResult::Ok;
}

DrainResult Subscription::lapped(uint64_t head) noexcept {
  resync_ = true;
  resync_to_ = head;
  return DrainResult::Overflow;
}

mrc_monitor_mode_t Subscription::mode() const noexcept {
  return static_cast<mrc_monitor_mode_t>(g.mode.load(std::memory_order_relaxed));
}

Subscription::Unmaps Subscription::probe_unmaps() const noexcept {
  const int saved_errno = errno;  // a get that succeeds leaves the application's errno alone
  // Acquire: pairs with start_locked()'s release, so a descriptor seen here is the monitor's.
  const int fd = g.probe_fd.load(std::memory_order_acquire);
  Unmaps answer = Unmaps::Read;
  if (fd == kProbeRefused) {
    answer = Unmaps::Unprobeable;
  } else if (fd != kProbeNoMonitor) {
    switch (probe_mmap_changing(fd)) {
      case ProbeAnswer::Clear: break;
      case ProbeAnswer::Changing: answer = Unmaps::InFlight; break;
      case ProbeAnswer::Refused: answer = Unmaps::Unprobeable; break;
    }
  }
  // The kernel's read of mmap_changing comes before the caller's loads of `pending` and of the
  // queue (docs/DESIGN.md, "Exact under concurrent unmaps").
  std::atomic_thread_fence(std::memory_order_seq_cst);
  errno = saved_errno;
  return answer;
}

Subscription::Unmaps Subscription::settle_unmaps() const noexcept {
  timespec began{};
  clock_gettime(CLOCK_MONOTONIC, &began);
  for (unsigned attempt = 0;; ++attempt) {
    const Unmaps answer = probe_unmaps();
    if (answer != Unmaps::InFlight) return answer;
    if (attempt < 4) continue;  // the monitor reads within microseconds when it has a CPU
    // Then sleep until its next batch ends: spinning waiters would keep the monitor and the
    // unmapping threads (which lower the count after the read) off a shared CPU. Their wakeup
    // follows the batch's end by a little, hence the short timeout too.
    queue_->wait_for_batch(kSettleNapNs);
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const int64_t waited_ns =
        (now.tv_sec - began.tv_sec) * 1000000000 + (now.tv_nsec - began.tv_nsec);
    if (waited_ns >= kSettleBudgetNs) return Unmaps::InFlight;
  }
}

mrc_status_t subscribe(Subscription **out) {
  if (out == nullptr) return MRC_ERR_INVALID;
  detail::ensure_fork_handlers();
  Subscription *subscription = new (std::nothrow) Subscription(&g.queue);
  if (subscription == nullptr) return MRC_ERR_NO_MEMORY;
  std::lock_guard<std::mutex> hold(g.mutex);
  if (g.subscribers == 0 || g.needs_start) start_locked();
  subscription->cursor_.store(g.queue.head(), std::memory_order_relaxed);
  subscription->next_ = g.subscriptions;
  if (g.subscriptions != nullptr) g.subscriptions->prev_ = subscription;
  g.subscriptions = subscription;
  ++g.subscribers;
  *out = subscription;
  return MRC_OK;
}

void unsubscribe(Subscription *subscription) {
  if (subscription == nullptr) return;
  std::lock_guard<std::mutex> hold(g.mutex);
  if (subscription->prev_ != nullptr) {
    subscription->prev_->next_ = subscription->next_;
  } else {
    g.subscriptions = subscription->next_;
  }
  if (subscription->next_ != nullptr) subscription->next_->prev_ = subscription->prev_;
  delete subscription;
  MRC_CHECK(g.subscribers > 0);
  if (--g.subscribers == 0) stop_locked();
}

// ---- the watches ----

namespace {

bool page_range(uintptr_t start, size_t length, uintptr_t *lo, uintptr_t *hi, char *why,
                size_t why_len) noexcept {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  if (length == 0 || start + length < start || start + length > UINTPTR_MAX - page) {
    set_text(why, why_len, "empty or wrapping range");
    return false;
  }
  *lo = start & ~(page - 1);
  *hi = (start + length + page - 1) & ~(page - 1);
  return true;
}

}  // namespace

// The fast path: no lock, no syscall, when the range lies in a registered mapping and in a piece
// that already counts a watch (watch_table.h). The order is the protocol: the internal
// subscription's records are all applied (quiescent(): three acquire loads), then the snapshot is
// read. Else the registry mutex; the internal subscription is drained only when records are
// waiting.
WatchResult watch(uintptr_t start, size_t length, char *why, size_t why_len) {
  if (why != nullptr && why_len > 0) why[0] = '\0';
  uintptr_t lo;
  uintptr_t hi;
  if (!page_range(start, length, &lo, &hi, why, why_len)) return WatchResult::NotMonitorable;
  {
    EpochGuard guard;
    if (g.internal.quiescent() && g.watches.try_watch_fast(lo, hi)) return WatchResult::Watched;
  }
  std::lock_guard<std::mutex> hold(g.mutex);
  if (g.needs_start) start_locked();
  if (!g.internal.quiescent()) sync_watches_locked(/*settle=*/false);
  WatchResult result = g.watches.watch(lo, hi, why, why_len);
  if (result == WatchResult::NotMonitorable && g.watches.wants_room()) {
    // Over the VMA budget while idle entries hold some of it: give those back and try again.
    evict_idle_watches_locked();
    if (why != nullptr && why_len > 0) why[0] = '\0';
    result = g.watches.watch(lo, hi, why, why_len);
  }
  if (g.watches.wants_eviction()) evict_idle_watches_locked();
  g.watches.publish();
  return result;
}

void unwatch(uintptr_t start, size_t length) {
  const WatchRange range{start, length};
  unwatch_many(&range, 1);
}

// Lock-free for every range whose piece keeps a watch after it (a run of equal ranges in one
// step); the rest (last watches, which may leave a mapping idle) under one acquisition of the
// registry mutex per 64 ranges.
void unwatch_many(const WatchRange *ranges, size_t count) {
  constexpr size_t kChunk = 64;
  for (size_t base = 0; base < count; base += kChunk) {
    const size_t chunk = std::min(kChunk, count - base);
    uint64_t locked = 0;  // bit i: ranges[base + i] needs the mutex
    {
      EpochGuard guard;
      for (size_t i = 0; i < chunk;) {
        const WatchRange &range = ranges[base + i];
        size_t run = 1;
        while (i + run < chunk && ranges[base + i + run].start == range.start &&
               ranges[base + i + run].length == range.length) {
          ++run;
        }
        uintptr_t lo;
        uintptr_t hi;
        if (page_range(range.start, range.length, &lo, &hi, nullptr, 0)) {
          // The run's last ranges are the ones left for the mutex.
          for (size_t j = g.watches.try_unwatch_fast(lo, hi, run); j < run; ++j) {
            locked |= uint64_t{1} << (i + j);
          }
        }
        i += run;
      }
    }
    if (locked == 0) continue;
    std::lock_guard<std::mutex> hold(g.mutex);
    if (!g.internal.quiescent()) sync_watches_locked(/*settle=*/false);
    for (size_t i = 0; i < chunk; ++i) {
      if ((locked & (uint64_t{1} << i)) == 0) continue;
      uintptr_t lo;
      uintptr_t hi;
      if (page_range(ranges[base + i].start, ranges[base + i].length, &lo, &hi, nullptr, 0)) {
        g.watches.unwatch(lo, hi);
      }
    }
    if (g.watches.wants_eviction()) evict_idle_watches_locked();
    g.watches.publish();
  }
}

// ---- test controls ----

namespace testing {
void set_queue_capacity(size_t records) {
  g.queue_capacity.store(records, std::memory_order_relaxed);
}
void set_vma_budget(uint64_t vmas) { g.vma_budget.store(vmas, std::memory_order_relaxed); }
void set_idle_vmas(int64_t vmas) { g.idle_vmas.store(vmas, std::memory_order_relaxed); }
void force_poll_loop(bool on) { g.force_poll.store(on, std::memory_order_relaxed); }
void pause_monitor(bool on) { g_paused.store(on, std::memory_order_relaxed); }
uint64_t registrations() { return detail::g_registrations.load(std::memory_order_relaxed); }
void set_before_register_hook(void (*hook)(uintptr_t start, uintptr_t end)) {
  detail::g_before_register.store(hook, std::memory_order_relaxed);
}
void with_registry_locked(void (*fn)(void *arg), void *arg) {
  std::lock_guard<std::mutex> hold(g.mutex);
  fn(arg);
}
int monitor_fd() {
  std::lock_guard<std::mutex> hold(g.mutex);
  return g.running ? g.uffd : -1;
}
const char *monitor_loop() {
  std::lock_guard<std::mutex> hold(g.mutex);
  if (!g.running) return "none";
  switch (static_cast<LoopKind>(g.run.loop.load(std::memory_order_relaxed))) {
    case LoopKind::NotStarted: return "not started";
    case LoopKind::UringDeferred: return "io_uring+defer";
    case LoopKind::Uring: return "io_uring";
    case LoopKind::Poll: return "poll";
  }
  return "?";
}
}  // namespace testing

}  // namespace mrc::uffd

extern "C" MRC_API mrc_status_t mrc_monitor_info_sized(mrc_monitor_info_t *info, size_t size) {
  if (info == nullptr || size < MRC_MONITOR_INFO_SIZE_0_1) return MRC_ERR_INVALID;
  mrc_monitor_info_t all{};
  mrc::uffd::Monitor::info(&all);
  // The size rule of mrcache.h (base/sized.h has it for core/; uffd/ sits below core/).
  std::memcpy(info, &all, std::min(size, sizeof all));
  if (size > sizeof all) {
    std::memset(reinterpret_cast<unsigned char *>(info) + sizeof all, 0, size - sizeof all);
  }
  return MRC_OK;
}

// The 0.1 entry point (mrc_monitor_info@MRCACHE_0): the header now inlines mrc_monitor_info
// over mrc_monitor_info_sized, so only 0.1 programs reach this, with the 0.1 layout.
extern "C" MRC_API mrc_status_t mrc_monitor_info_v0(mrc_monitor_info_t *info);
__asm__(".symver mrc_monitor_info_v0, mrc_monitor_info@MRCACHE_0");
extern "C" mrc_status_t mrc_monitor_info_v0(mrc_monitor_info_t *info) {
  return mrc_monitor_info_sized(info, MRC_MONITOR_INFO_SIZE_0_1);
}
