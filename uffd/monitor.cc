// SPDX-License-Identifier: BSD-3-Clause
// The monitor's lifecycle: start (negotiate, allocate, spawn the thread) and stop, keeping the
// watch table in step with the queue, the fork handlers, and mrc_monitor_info().
//
// SYNCHRONIZATION: see internal/monitor_state.h.
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "base/futex.h"
#include "base/mutex.h"
#include "base/proc_maps.h"
#include "base/sized.h"
#include "base/ticks.h"
#include "bpf/protocol.h"
#include "uffd/internal/kernel.h"
#include "uffd/internal/monitor_state.h"
#include "uffd/internal/negotiation.h"
#include "uffd/internal/plumbing.h"
#include "uffd/modes.h"
#include "uffd/uffd.h"

namespace mrc::uffd::detail {

constinit MonitorState g_monitor;
constinit std::atomic<int> g_probe_fd{kProbeNoMonitor};
constinit std::atomic<bpf::RingConsumer *> g_bpf_ring{nullptr};
constinit std::atomic<bool (*)()> g_drop_events{nullptr};

namespace {

constexpr size_t kDefaultQueueCapacity = size_t{1} << 15;  // 1 MiB of records
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(MRC_TSAN)
constexpr size_t kStackBytes = size_t{1} << 20;
#else
constexpr size_t kStackBytes = size_t{128} << 10;
#endif

std::atomic<bool> g_said_uncached{false};
pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

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

// ---- lifecycle (REQUIRES: g_monitor.mutex) ----

void close_run_locked(bool in_forked_child = false) noexcept MRC_REQUIRES(g_monitor.mutex) {
  // Drops every registration and releases any waiting thread. The monitor thread closed it
  // itself if it ran (and the number may belong to someone else by now).
  g_probe_fd.store(kProbeNoMonitor, std::memory_order_relaxed);
  g_bpf_ring.store(nullptr, std::memory_order_relaxed);
  if (g_monitor.bpf_ring != nullptr) {
    // A forked child's changes reach no ring: it forgets its copy of its parent's, which ends
    // nothing of the parent's registration.
    if (in_forked_child) {
      g_monitor.bpf_ring->forget();
    } else {
      g_monitor.bpf_ring->close();
    }
    g_monitor.bpf_ring = nullptr;
  }
  if (g_monitor.uffd >= 0 && !g_monitor.run.closed_uffd) close(g_monitor.uffd);
  g_monitor.uffd = -1;
  g_monitor.run.closed_uffd = false;
  if (g_monitor.ring_ready) io_uring_queue_exit(&g_monitor.ring);
  g_monitor.ring_ready = false;
  if (g_monitor.control >= 0) close(g_monitor.control);
  g_monitor.control = -1;
#if defined(__SANITIZE_THREAD__) || defined(MRC_TSAN)
  // ThreadSanitizer keeps the parent's threads registered in a forked child: a new monitor
  // stack at the same address would give the child's monitor the dead one's thread id.
  if (in_forked_child) g_monitor.stack = nullptr;
#endif
  if (g_monitor.stack != nullptr) munmap(g_monitor.stack, g_monitor.stack_bytes);
  g_monitor.stack = nullptr;
  g_monitor.stack_bytes = 0;
  g_monitor.queue.release();
  g_monitor.watches.reset(detail::WatchConfig{});
  g_monitor.running = false;
}

void become_uncached_locked(bool unavailable) noexcept MRC_REQUIRES(g_monitor.mutex) {
  close_run_locked();
  g_monitor.mode.store(MRC_MONITOR_UNCACHED, std::memory_order_relaxed);
  g_monitor.features = 0;
  if (unavailable) say_uncached_once(g_monitor.reason);
}

// The mode was negotiated, but its run could not start: caching is off. The reason says so and
// why; negotiation's text described the mode as if it ran, so only the mode's name is kept.
void fail_start_locked(mrc_monitor_mode_t negotiated, const char *what,
                       const char *error_name = nullptr) noexcept MRC_REQUIRES(g_monitor.mutex) {
  Text why{g_monitor.reason, sizeof(g_monitor.reason)};
  why.add("%s", what);
  if (error_name != nullptr) why.add(" (%s)", error_name);
  why.add("; every get registers, the last put deregisters (%s mode was negotiated)",
          mode_name(negotiated));
  become_uncached_locked(true);
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

// What an application's unmap of watched memory waits for the monitor: the median of three
// unmaps of a watched scratch page less the median of three plain ones, on this thread (the
// application's first watching thread, bound as the application binds it). 0 when it cannot be
// measured (no memory, the registration refused, a test has paused the monitor). The churn
// learner weighs it against what caching saves (docs/DESIGN.md, "Churn"); about a tenth of a
// millisecond once per monitor start.
uint64_t measure_round_trip() noexcept MRC_REQUIRES(g_monitor.mutex) {
  if (g_paused.load(std::memory_order_relaxed)) return 0;
  const size_t page = g_monitor.run.page_size;
  constexpr int kSamples = 3;
  uint64_t watched[kSamples];
  uint64_t plain[kSamples];
  for (int i = 0; i < kSamples; ++i) {
    void *scratch = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (scratch == MAP_FAILED) return 0;
    uffdio_register request{};
    request.range.start = reinterpret_cast<uintptr_t>(scratch);
    request.range.len = page;
    request.mode = g_monitor.register_mode;
    if (ioctl(g_monitor.uffd, UFFDIO_REGISTER, &request) != 0) {
      munmap(scratch, page);
      return 0;
    }
    g_monitor.run.scratch.store(request.range.start, std::memory_order_release);
    uint64_t begin = os::ticks();
    munmap(scratch, page);
    watched[i] = os::ticks() - begin;
    // The monitor clears it right after its read, which let the munmap return.
    for (int spins = 0; g_monitor.run.scratch.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins == 10000) {
        g_monitor.run.scratch.store(0, std::memory_order_release);  // published then: harmless
        break;
      }
      sched_yield();
    }
    void *other = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (other == MAP_FAILED) return 0;
    begin = os::ticks();
    munmap(other, page);
    plain[i] = os::ticks() - begin;
  }
  std::sort(watched, watched + kSamples);
  std::sort(plain, plain + kSamples);
  return watched[kSamples / 2] > plain[kSamples / 2] ? watched[kSamples / 2] - plain[kSamples / 2]
                                                     : 0;
}

// ---- start_locked's phases, in the order it runs them ----

// The monitor thread never allocates: all it touches must exist first. nullptr, or why not.
const char *allocate_queue_locked() noexcept MRC_REQUIRES(g_monitor.mutex) {
  const size_t capacity = g_monitor.queue_capacity.load(std::memory_order_relaxed);
  if (g_monitor.queue.allocate(capacity != 0 ? capacity : kDefaultQueueCapacity) != MRC_OK) {
    return "the monitor could not start: no memory for the invalidation queue";
  }
  return nullptr;
}

const char *allocate_run_locked() noexcept MRC_REQUIRES(g_monitor.mutex) {
  if (const char *failed = allocate_queue_locked()) return failed;
  g_monitor.control = eventfd(0, EFD_CLOEXEC);
  if (g_monitor.control < 0) return "the monitor could not start: eventfd failed";
  const size_t guard = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  g_monitor.stack_bytes = guard + kStackBytes + guard;
  // Our own, populated stack: in MISSING mode the monitor must never fault on watched memory,
  // and a recycled thread stack could have been watched by its previous owner.
  g_monitor.stack = mmap(nullptr, g_monitor.stack_bytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_POPULATE, -1, 0);
  if (g_monitor.stack == MAP_FAILED) {
    g_monitor.stack = nullptr;
    return "the monitor could not start: no memory for its thread's stack";
  }
  // Guard pages at both ends, and a VMA flag of its own: the kernel must never merge an
  // application's adjacent mapping into the stack's VMA (watch() refuses our own memory).
  // Not MADV_DONTFORK: glibc's thread list, walked in a forked child, lives on this stack.
  (void)mprotect(g_monitor.stack, guard, PROT_NONE);
  (void)mprotect(static_cast<char *>(g_monitor.stack) + guard + kStackBytes, guard, PROT_NONE);
  (void)madvise(static_cast<char *>(g_monitor.stack) + guard, kStackBytes, MADV_NOHUGEPAGE);
  return nullptr;
}

// Optional: io_uring shortens each round trip, but where it is refused poll(2) does the job.
void set_up_ring_locked() noexcept MRC_REQUIRES(g_monitor.mutex) {
  g_monitor.run.enable_ring = false;
  if (g_monitor.force_poll.load(std::memory_order_relaxed)) return;
  // Room for bursts of readiness completions; a multishot poll that cannot post ends and
  // is re-armed, so a full queue costs time, never an event.
  // Deferred task work: the uffd's wakeup queues the poll completion on the ring and wakes the
  // monitor straight from io_uring's wait, instead of going through the generic task-work
  // path on its way out of the kernel (measured: ~0.5 us off each round trip here). It
  // requires a single issuer; that must be the monitor thread, hence disabled until it starts.
  g_monitor.ring_ready =
      io_uring_queue_init(
          64, &g_monitor.ring,
          IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED) == 0;
  g_monitor.run.enable_ring = g_monitor.ring_ready;
  // Kernels before 6.1 refuse those flags.
  if (!g_monitor.ring_ready)
    g_monitor.ring_ready = io_uring_queue_init(64, &g_monitor.ring, 0) == 0;
  // Without io_uring (disabled by sysctl or seccomp) the poll(2) loop does the same job.
}

// The thread reads its MonitorRun without the lock: it must be complete before the thread exists.
void fill_run_locked() noexcept MRC_REQUIRES(g_monitor.mutex) {
  g_monitor.events.store(0, std::memory_order_relaxed);  // "events read since start"
  g_monitor.run.uffd = g_monitor.uffd;
  g_monitor.run.control = g_monitor.control;
  g_monitor.run.ring = g_monitor.ring_ready ? &g_monitor.ring : nullptr;
  g_monitor.run.queue = &g_monitor.queue;
  g_monitor.run.events = &g_monitor.events;
  g_monitor.run.stop.store(false, std::memory_order_relaxed);
  // The test switch exists only in programs that install it (uffd/testing_env.cc): the library
  // reads no variable for it. When on, mrc_monitor_info's reason says so.
  bool (*const drop_events)() = g_drop_events.load(std::memory_order_relaxed);
  g_monitor.run.drop_events = drop_events != nullptr && drop_events();
  if (g_monitor.run.drop_events) {
    Text why{g_monitor.reason, sizeof(g_monitor.reason)};
    why.used = strlen(g_monitor.reason);
    why.add("; TEST SWITCH ON: events are dropped, no cache sees any invalidation");
  }
  g_monitor.run.page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  g_monitor.run.loop.store(static_cast<uint32_t>(LoopKind::NotStarted), std::memory_order_relaxed);
}

// From its first instruction the thread must run only our code, on our stack. 0, or the error.
int start_thread_locked() noexcept MRC_REQUIRES(g_monitor.mutex) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  const size_t guard = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  pthread_attr_setstack(&attr, static_cast<char *>(g_monitor.stack) + guard, kStackBytes);
  // The thread inherits this mask: it blocks every signal from its first instruction, so that no
  // handler (which could allocate or take a lock) ever runs on it.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const int forced = g_monitor.thread_start_error.load(std::memory_order_relaxed);
  const int rc =
      forced != 0 ? forced : pthread_create(&g_monitor.thread, &attr, monitor_main, &g_monitor.run);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  pthread_attr_destroy(&attr);
  if (rc == 0) pthread_setname_np(g_monitor.thread, "mrc-monitor");
  return rc;
}

// The thread's start-up may hold the runtime's locks: neither a fork nor a watch may meet them.
void wait_until_running_locked() noexcept MRC_REQUIRES(g_monitor.mutex) {
  // Wait until the thread runs monitor_main. Before that it is inside the threading runtime's
  // start-up, which may take that runtime's locks (ASan's allocator: pthread_getattr_np frees).
  // A fork meanwhile (g_monitor.mutex no longer held) would hand the child those locks held by no
  // thread: the child's own monitor then blocks on them at its start, and the child's next munmap
  // of watched memory waits for it forever. And no range may be registered before the thread can
  // read events: its start-up could wait for a runtime lock held by a thread blocked in munmap.
  constexpr uint32_t kNotStarted = static_cast<uint32_t>(LoopKind::NotStarted);
  while (g_monitor.run.loop.load(std::memory_order_acquire) == kNotStarted) {
    os::futex_wait(&g_monitor.run.loop, kNotStarted);
  }
}

// Last, once the thread reads events: no watch may register a range, nor a get probe, before.
void mark_running_locked(const Negotiated &negotiated) noexcept MRC_REQUIRES(g_monitor.mutex) {
  g_monitor.running = true;
  g_monitor.mode.store(negotiated.mode, std::memory_order_relaxed);
  g_monitor.features = negotiated.features;
  g_probe_fd.store(negotiated.probe_ok ? g_monitor.uffd : kProbeRefused, std::memory_order_release);

  detail::WatchConfig config;
  config.uffd = g_monitor.uffd;
  config.register_mode = g_monitor.register_mode;
  config.mode = negotiated.mode;
  const uint64_t budget = g_monitor.vma_budget.load(std::memory_order_relaxed);
  config.vma_budget = budget != 0 ? budget : default_vma_budget();
  const int64_t idle = g_monitor.idle_vmas.load(std::memory_order_relaxed);
  config.idle_limit = idle >= 0 ? static_cast<uint64_t>(idle) : detail::kDefaultIdleLimit;
  config.own[0][0] = reinterpret_cast<uintptr_t>(g_monitor.stack);
  config.own[0][1] = config.own[0][0] + g_monitor.stack_bytes;
  config.own[1][0] = g_monitor.queue.storage_begin();
  config.own[1][1] = g_monitor.queue.storage_end();
  config.state[0][0] = reinterpret_cast<uintptr_t>(&g_monitor);
  config.state[0][1] = config.state[0][0] + sizeof(g_monitor);
  config.state[1][0] = reinterpret_cast<uintptr_t>(&g_paused);
  config.state[1][1] = config.state[1][0] + sizeof(g_paused);
  config.brk_heap_start = os::brk_heap_start();
  g_monitor.watches.reset(config);
  MonitorState::attach(&g_monitor.internal, g_monitor.queue.head());
  g_monitor.round_trip_ticks.store(measure_round_trip(), std::memory_order_relaxed);
}

// Puts `prefix` before the reason negotiation wrote (both cut to the reason's size).
void prefix_reason_locked(const char *prefix) noexcept MRC_REQUIRES(g_monitor.mutex) {
  char negotiated[sizeof(g_monitor.reason)];
  snprintf(negotiated, sizeof(negotiated), "%s", g_monitor.reason);
  Text why{g_monitor.reason, sizeof(g_monitor.reason)};
  why.add("%s%s", prefix, negotiated);
}

// The eBPF monitor's ring: from mrcache-bpfd when its socket exists, else (MRC_MONITOR=bpf
// only) from programs this process loads itself. False, with why in `refusal`, when neither
// works; for `auto` a missing socket is no refusal, only the absence of the mode.
bool open_bpf_ring(bool asked, Text *refusal, bpf::ProcessRing **out) noexcept {
  const char *socket_path = getenv("MRC_BPFD_SOCKET");  // NOLINT(concurrency-mt-unsafe)
  if (socket_path == nullptr || *socket_path == '\0') socket_path = bpf::kDefaultSocket;
  const bool daemon_here = access(socket_path, F_OK) == 0;
  if (daemon_here) {
    if (bpf::ProcessRing::open_from_daemon(socket_path, 0, out) == MRC_OK) return true;
    refusal->add("%s; ", mrc_last_error());
  }
  if (!asked) return false;
  if (bpf::ProcessRing::open_own(bpf::ProcessRing::kDefaultRingBytes, out) == MRC_OK) return true;
  if (!daemon_here) refusal->add("no daemon at %s; ", socket_path);
  refusal->add("%s; ", mrc_last_error());
  return false;
}

// The eBPF monitor instead of a userfaultfd and its thread: MRC_MONITOR=bpf, or auto where the
// daemon serves. False, with why in `refusal` (empty when auto found no daemon), otherwise.
bool start_bpf_locked(Text *refusal) noexcept MRC_REQUIRES(g_monitor.mutex) {
  const bool asked = bpf_wanted();
  if (!asked && !auto_wanted()) return false;
  char why_buf[sizeof(g_monitor.reason)] = "";
  Text why_not{why_buf, sizeof(why_buf)};
  bpf::ProcessRing *ring = nullptr;
  const bool opened = open_bpf_ring(asked, &why_not, &ring);
  const char *failed = opened ? allocate_queue_locked() : nullptr;
  if (!opened || failed != nullptr) {
    if (failed != nullptr) {
      ring->close();
      why_not.add("%s; ", failed);
    }
    if (why_not.used > 0) {
      refusal->add("%s unavailable: %suserfaultfd instead: ", asked ? "MRC_MONITOR=bpf" : "bpf",
                   why_not.buf);
    }
    return false;
  }
  const bpf::Hooks hooks = ring->hooks();
  Text why{g_monitor.reason, sizeof(g_monitor.reason)};
  why.add(
      "eBPF programs at %s, %s and %s report every change into this process's ring%s; "
      "exact gets compare its positions%s",
      hooks.unmap, hooks.remap, hooks.madvise,
      ring->from_daemon() ? " (from mrcache-bpfd)" : " (loaded by this process)",
      asked ? " (MRC_MONITOR=bpf)" : "");
  g_monitor.bpf_ring = ring;
  g_monitor.mode.store(MRC_MONITOR_BPF, std::memory_order_relaxed);
  g_monitor.features = 0;
  g_monitor.watches.reset(detail::WatchConfig{});
  MonitorState::attach(&g_monitor.internal, g_monitor.queue.head());
  g_bpf_ring.store(&ring->consumer(), std::memory_order_release);
  return true;
}

}  // namespace

void start_locked() noexcept {
  g_monitor.needs_start = false;
  char refusal_buf[sizeof(g_monitor.reason)] = "";
  Text refusal{refusal_buf, sizeof(refusal_buf)};
  if (start_bpf_locked(&refusal)) {
    g_monitor.negotiated = true;
    return;
  }
  Negotiated negotiated = negotiate(g_monitor.reason, sizeof(g_monitor.reason));
  g_monitor.negotiated = true;
  if (refusal.used > 0) prefix_reason_locked(refusal.buf);
  if (negotiated.fd < 0) {
    become_uncached_locked(negotiated.unavailable);
    return;
  }
  g_monitor.uffd = negotiated.fd;
  g_monitor.register_mode = negotiated.register_mode;
  if (const char *failed = allocate_run_locked()) {
    fail_start_locked(negotiated.mode, failed);
    return;
  }
  set_up_ring_locked();
  fill_run_locked();
  if (const int rc = start_thread_locked(); rc != 0) {
    fail_start_locked(negotiated.mode, "the monitor thread could not start", strerrorname_np(rc));
    return;
  }
  wait_until_running_locked();
  mark_running_locked(negotiated);
}

void stop_locked() noexcept {
  g_monitor.round_trip_ticks.store(0, std::memory_order_relaxed);
  if (g_monitor.running) {
    g_monitor.run.stop.store(true, std::memory_order_release);
    const uint64_t one = 1;
    ssize_t ignored = write(g_monitor.control, &one, sizeof(one));
    (void)ignored;
    pthread_join(g_monitor.thread, nullptr);
  }
  close_run_locked();
  g_monitor.needs_start = false;
  // The last cache left: no descriptor of ours stays open (a later query opens one again).
  os::close_maps_descriptors();
}

void sync_watches_locked() noexcept {
  if (!g_monitor.running) return;
  // Before the cursor moves past a record that cuts an entry, the fast path must stop trusting
  // the snapshot that shows it (docs/DESIGN.md, "The watch table's fast path"); the caller
  // publishes the table again when done.
  g_monitor.watches.withdraw();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const DrainResult result = g_monitor.internal.drain([](const Invalidation &record) {
      if (record.kind == InvalidationKind::Remove) return;
      g_monitor.watches.forget(record.start, record.end, record.kind == InvalidationKind::Unmap);
    });
    if (result == DrainResult::Ok) return;
    g_monitor.watches.forget_all();  // lapped: any registration may be gone; drain again to resync
  }
}

// Why only when nothing is in flight: the kernel removes a VMA first and queues its UNMAP event
// after dropping the mmap lock; until the monitor has read it, another thread may already have
// mapped new memory at the same addresses, and a watch entry still stands there. Watches accept
// that window (docs/DESIGN.md, "The watch table"); unregistering does not: it would act on someone
// else's mapping. Once the probe answers Clear, every such change begun before it has been read,
// hence (pending protocol) is visible to the drain below, which waits for `pending` to fall
// (docs/DESIGN.md, "Exact under concurrent unmaps").
// Why never wait: the caller holds the registry mutex, which every first watch of a get needs,
// and often its cache's mutex (a purge, the retirement of regions); an unmap stays in flight for
// as long as the monitor is kept from reading it. Idle entries cost only their round trips
// meanwhile, and the next locked call that finds them over the limit tries again
// (docs/DESIGN.md, "Watching").
bool evict_idle_watches_locked() noexcept {
  if (g_monitor.uffd < 0) return false;
  if (probe_mmap_changing(g_monitor.uffd) == ProbeAnswer::Changing) return false;
  sync_watches_locked();
  g_monitor.watches.evict_idle();
  return true;
}

// ---- fork ----

namespace {

// The handlers hand the mutex from prepare to parent or child: ACQUIRE and RELEASE say so.
void before_fork() noexcept MRC_ACQUIRE(g_monitor.mutex) { g_monitor.mutex.lock(); }

void after_fork_in_parent() noexcept MRC_RELEASE(g_monitor.mutex) { g_monitor.mutex.unlock(); }

// The child has no monitor thread, and its VMAs lost their registration (no EVENT_FORK). Drop
// the inherited descriptors (closing them here does not affect the parent's), forget the watch
// table and tell every subscription, through its next drain(), to forget its regions.
void after_fork_in_child() noexcept MRC_RELEASE(g_monitor.mutex) {
  close_run_locked(/*in_forked_child=*/true);
  g_monitor.queue.reset_after_fork();
  for (Subscription *subscription = g_monitor.subscriptions; subscription != nullptr;
       subscription = MonitorState::next_of(subscription)) {
    MonitorState::mark_forked(subscription);
  }
  MonitorState::attach(&g_monitor.internal, g_monitor.queue.head());
  g_monitor.events.store(0, std::memory_order_relaxed);
  g_monitor.needs_start = g_monitor.subscribers > 0;
  g_said_uncached.store(false, std::memory_order_relaxed);  // once per process: a new one
  g_monitor.mutex.unlock();
}

// The registry mutex is taken before the maps descriptors' locks (watch() queries mappings under
// it), so their handlers are registered first: prepare handlers run in reverse order.
void install_fork_handlers() noexcept {
  os::register_maps_fork_handlers();
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

}  // namespace

void ensure_fork_handlers() noexcept { pthread_once(&g_atfork_once, install_fork_handlers); }

}  // namespace mrc::uffd::detail

namespace mrc::uffd {

using detail::g_monitor;

uint64_t Monitor::round_trip_ticks() noexcept {
  const uint64_t forced = g_monitor.round_trip_override.load(std::memory_order_relaxed);
  return forced != 0 ? forced : g_monitor.round_trip_ticks.load(std::memory_order_relaxed);
}

// ---- Monitor::info ----

void Monitor::info(mrc_monitor_info_t *out) noexcept {
  if (out == nullptr) return;
  MutexLock hold(g_monitor.mutex);
  if (g_monitor.subscribers == 0) {
    // Nothing runs: report what a start would choose now (the eBPF monitor by starting and
    // stopping it: its self-test is part of the answer).
    char refusal_buf[sizeof(g_monitor.reason)] = "";
    detail::Text refusal{refusal_buf, sizeof(refusal_buf)};
    if (detail::start_bpf_locked(&refusal)) {
      detail::stop_locked();  // the mode and its reason stay
    } else {
      detail::Negotiated probe = detail::negotiate(g_monitor.reason, sizeof(g_monitor.reason));
      if (probe.fd >= 0) close(probe.fd);
      if (refusal.used > 0) detail::prefix_reason_locked(refusal.buf);
      g_monitor.mode.store(probe.mode, std::memory_order_relaxed);
      g_monitor.features = probe.features;
    }
    g_monitor.negotiated = true;
  }
  *out = mrc_monitor_info_t{};
  out->mode = static_cast<mrc_monitor_mode_t>(g_monitor.mode.load(std::memory_order_relaxed));
  out->mode_name = detail::mode_name(out->mode);
  snprintf(out->reason, sizeof(out->reason), "%s", g_monitor.reason);
  out->features = g_monitor.features;
  out->running = g_monitor.running || g_monitor.bpf_ring != nullptr ? 1 : 0;
  out->events = g_monitor.events.load(std::memory_order_relaxed);
  out->watched_bytes = g_monitor.watches.watched_bytes();
  out->vmas_added = g_monitor.watches.vmas_added();
  out->vma_budget = g_monitor.watches.vma_budget();
}

}  // namespace mrc::uffd

extern "C" MRC_API mrc_status_t mrc_monitor_info_sized(mrc_monitor_info_t *info, size_t size) {
  if (info == nullptr) {
    mrc::set_last_error("mrc_monitor_info: info is NULL");
    return MRC_ERR_INVALID;
  }
  if (!mrc::sized_output_fits(size, MRC_MONITOR_INFO_SIZE_0_1)) {
    mrc::set_last_error(
        "mrc_monitor_info: size %zu is not a mrc_monitor_info_t (at least the 0.1 layout's %zu, "
        "at most %zu)",
        size, static_cast<size_t>(MRC_MONITOR_INFO_SIZE_0_1), mrc::kMaxStructSize);
    return MRC_ERR_INVALID;
  }
  mrc_monitor_info_t all{};
  mrc::uffd::Monitor::info(&all);
  mrc::sized_output_copy(info, size, &all, sizeof all);  // the size rule of mrcache.h
  return MRC_OK;
}

// The 0.1 entry point (mrc_monitor_info@MRCACHE_0): the header now inlines mrc_monitor_info
// over mrc_monitor_info_sized, so only 0.1 programs reach this, with the 0.1 layout.
extern "C" MRC_API mrc_status_t mrc_monitor_info_v0(mrc_monitor_info_t *info);
__asm__(".symver mrc_monitor_info_v0, mrc_monitor_info@MRCACHE_0");
extern "C" mrc_status_t mrc_monitor_info_v0(mrc_monitor_info_t *info) {
  return mrc_monitor_info_sized(info, MRC_MONITOR_INFO_SIZE_0_1);
}
