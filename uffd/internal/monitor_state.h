// SPDX-License-Identifier: BSD-3-Clause
// The monitor's process-wide state, private to uffd/: the registry (g_monitor: subscribers, the
// negotiated mode, the current run, the watch table) and what the monitor thread reads
// (MonitorRun). Why the rules below hold: docs/DESIGN.md, "The monitor thread and its registry".
//
// SYNCHRONIZATION
//   1. The monitor thread waits on the userfaultfd (readiness only) and the control eventfd
//      (io_uring or poll(2)); raises the queue's pending, read()s a batch, publishes, lowers it.
//   2. It never allocates, frees, logs, takes a lock or calls a backend, and it enters the kernel
//      without libc's wrappers (monitor_thread.cc).
//   3. It reads its MonitorRun (written before pthread_create, unchanged until pthread_join) and
//      writes only the queue (producer, queue.h), g_monitor.events (relaxed) and kernel objects.
//   4. g_monitor.mutex, the registry mutex, guards the subscribers, start/stop and the whole run,
//      the negotiated mode/features/reason, the watch table and its internal subscription. Its
//      holder never waits for an unmap in flight (evict_idle_watches_locked).
//   5. Not guarded: the watch table's fast path (watches.h), which reads internal.quiescent() and
//      the table's snapshot inside an EpochGuard and changes only a piece's count.
//   6. Lock order: g_monitor.mutex, then the /proc/self/maps slot mutexes (base/proc_maps.cc); the
//      fork handlers take both before fork and release them after.
//   7. Read without the lock: mode (relaxed, by Subscription::mode()); g_probe_fd (probe.h;
//      acquire in probe_unmaps(), pairing with start_locked()'s release); the test controls
//      (queue_capacity ... thread_start_error: relaxed, read at the next start or call).
//   8. Starting: the starter, holding the mutex, waits on a futex until the thread stores its
//      LoopKind in run.loop (release; the starter's load is acquire). run.loop changes again
//      (relaxed) only on a fallback to poll(2); testing::monitor_loop() reads it.
//   9. The io_uring ring's one issuer is the monitor thread, which enables it; other threads only
//      create it before and tear it down after the thread.
//  10. Stopping: run.stop (release), then a write to the control eventfd; the thread loads run.stop
//      (acquire) after each control wakeup and leaves; the stopper joins it.
#pragma once

#include <liburing.h>
#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/mutex.h"
#include "bpf/process_ring.h"
#include "mrcache/mrcache.h"
#include "uffd/internal/watch_table.h"
#include "uffd/queue.h"
#include "uffd/subscription.h"

namespace mrc::uffd::detail {

// How the monitor thread waits. 0 means it has not started yet.
enum class LoopKind : uint32_t { NotStarted, UringDeferred, Uring, Poll };

// Everything the monitor thread reads; written before pthread_create, constant until join
// (except `loop` and `closed_uffd`, written by the monitor thread, and `scratch`).
struct MonitorRun {
  int uffd = -1;
  int control = -1;
  io_uring *ring = nullptr;  // nullptr: poll(2) loop
  InvalidationQueue *queue = nullptr;
  std::atomic<uint64_t> *events = nullptr;
  std::atomic<bool> stop{false};
  // The ring was created disabled, single-issuer, with deferred task work: the monitor thread
  // enables it and so becomes its only issuer (see set_up_ring_locked() in monitor.cc).
  bool enable_ring = false;
  bool drop_events = false;
  size_t page_size = 4096;
  bool closed_uffd = false;  // set by the monitor thread; read by the stopper after join
  // LoopKind: NotStarted until the monitor thread runs our code (its starter waits for that).
  std::atomic<uint32_t> loop{0};
  // The start of the one-page scratch mapping whose unmap measures the round trip
  // (measure_round_trip in monitor.cc), 0 when none: the monitor reads its event and clears this
  // (release), publishing and counting nothing; no cache ever watched or registered that page.
  std::atomic<uint64_t> scratch{0};
};

// The registry: one per process (g_monitor), guarded by its mutex (see SYNCHRONIZATION).
// Its plain fields are GUARDED_BY the mutex (docs/DESIGN.md, "Contracts the compiler checks");
// queue, internal and watches are not: the monitor thread and the watch fast path use them
// without it (their own headers say how).
struct MonitorState {
  Mutex mutex;
  InvalidationQueue queue;
  Subscription internal{&queue};  // the watch table's own cursor
  Subscription *subscriptions MRC_GUARDED_BY(mutex) = nullptr;
  size_t subscribers MRC_GUARDED_BY(mutex) = 0;

  // The negotiated mode (of the current run, or of the last negotiation).
  std::atomic<int> mode{MRC_MONITOR_UNCACHED};
  uint64_t features MRC_GUARDED_BY(mutex) = 0;
  char reason[256] MRC_GUARDED_BY(mutex) = "";
  bool negotiated MRC_GUARDED_BY(mutex) = false;

  // The current run.
  bool running MRC_GUARDED_BY(mutex) = false;  // the monitor thread is up
  // Subscribers exist but no monitor runs (a forked child).
  bool needs_start MRC_GUARDED_BY(mutex) = false;
  int uffd MRC_GUARDED_BY(mutex) = -1;
  uint64_t register_mode MRC_GUARDED_BY(mutex) = 0;
  int control MRC_GUARDED_BY(mutex) = -1;
  io_uring ring MRC_GUARDED_BY(mutex){};
  bool ring_ready MRC_GUARDED_BY(mutex) = false;
  pthread_t thread MRC_GUARDED_BY(mutex){};
  void *stack MRC_GUARDED_BY(mutex) = nullptr;
  size_t stack_bytes MRC_GUARDED_BY(mutex) = 0;
  // The monitor thread reads it through the pointer it was started with, without the lock.
  MonitorRun run MRC_GUARDED_BY(mutex);
  std::atomic<uint64_t> events{0};
  // What an unmap of watched memory costs the unmapping thread beyond a plain unmap (the
  // monitor's round trip), in os::ticks(): measured by start_locked(), 0 while unknown. Read
  // without the lock (relaxed) by Monitor::round_trip_ticks(): an estimate, never an order.
  std::atomic<uint64_t> round_trip_ticks{0};

  // Test controls.
  std::atomic<size_t> queue_capacity{0};
  std::atomic<uint64_t> vma_budget{0};
  std::atomic<int64_t> idle_vmas{-1};
  std::atomic<bool> force_poll{false};
  // Replaces the measured round trip in Monitor::round_trip_ticks() when not 0.
  std::atomic<uint64_t> round_trip_override{0};
  // Not 0: what start_locked() takes pthread_create to have returned.
  std::atomic<int> thread_start_error{0};

  WatchTable watches;

  // bpf mode: this process's ring (g_bpf_ring is its consumer), null in the other modes.
  bpf::ProcessRing *bpf_ring MRC_GUARDED_BY(mutex) = nullptr;
  // The queue's producer in bpf mode: whichever drain feeds the ring into it holds this
  // (feed_bpf_ring). Taken under a cache's mutex, never with the registry mutex held.
  Mutex feed_mutex;

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

// The one monitor of the process (monitor.cc).
extern MonitorState g_monitor;
// testing::pause_monitor (monitor_thread.cc).
extern std::atomic<bool> g_paused;
// Asked at each start whether the monitor drops every event (testing::set_drop_events; monitor.cc).
// nullptr in every program that did not install it, so libmrcache alone never drops anything.
// Constant-initialised: a test program installs it during static initialisation.
extern constinit std::atomic<bool (*)()> g_drop_events;

// bpf mode: moves every committed record of the ring into the queue, as the monitor thread
// publishes the userfaultfd's (bpf_feed.cc). Any thread; takes feed_mutex.
void feed_bpf_ring() noexcept;

// The monitor thread's body (monitor_thread.cc); arg: the MonitorRun.
void *monitor_main(void *arg);

// ---- lifecycle (monitor.cc; each REQUIRES g_monitor.mutex) ----

// Negotiates the mode and starts the monitor thread, or falls back to uncached mode.
void start_locked() noexcept MRC_REQUIRES(g_monitor.mutex);
// Stops the monitor thread and releases the run.
void stop_locked() noexcept MRC_REQUIRES(g_monitor.mutex);
// Keeps the watch table in step with the kernel: UNMAP and REMAP took registrations away (a
// REMAP's record is the old range; the moved VMA keeps its registration at the new address,
// where the table records nothing: a watch there registers it again, a no-op for the kernel).
// Nothing to follow while no monitor runs: the table is empty and the queue may be released
// (uncached mode).
void sync_watches_locked() noexcept MRC_REQUIRES(g_monitor.mutex);
// Unregisters idle watch entries (past the limit, or to make room under the VMA budget), after
// syncing the table, when no unmap of watched memory is in flight. Never waits for the monitor:
// with an unmap in flight it leaves them for a later call and returns false.
bool evict_idle_watches_locked() noexcept MRC_REQUIRES(g_monitor.mutex);

}  // namespace mrc::uffd::detail
