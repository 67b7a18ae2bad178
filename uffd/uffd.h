// uffd: the process-wide userfaultfd monitor, watched ranges and the invalidation queue.
//
// The monitor learns from the kernel that memory went away (munmap, mremap, madvise, brk,
// MAP_FIXED) for the ranges caches watch, and publishes one record per event into a
// preallocated broadcast queue that every subscribed cache (Consumer) reads at its own pace.
//
// SYNCHRONIZATION
//   Monitor thread  waits on the userfaultfd (readiness only) and on a control eventfd through
//                   io_uring; raises the queue's `pending`, read()s a batch of uffd_msg,
//                   publishes records, lowers `pending`. It never allocates, frees, logs, takes a
//                   lock, or calls a backend: anything it freed could be registered memory whose
//                   munmap waits for the monitor itself.
//   registry mutex  (monitor.cc) guards the subscriber list, start/stop, the negotiated mode and
//                   the watch table; subscribe, unsubscribe, info, and the watch and unwatch
//                   calls that change more than a count take it. The monitor thread never takes
//                   it.
//   watch/unwatch fast path  any thread, no lock: a watch of memory inside a registered mapping
//                   whose piece already counts a watch, and an unwatch that leaves its piece a
//                   watch, are one CAS on that piece's count under an EpochGuard (watch.h). It is
//                   held across fork (pthread_atfork).
//   Consumer::quiescent()  any thread, no lock: acquire loads of `pending`, of the queue head
//                   and of the consumer's cursor. Pairs with the monitor's lowering of `pending`
//                   (after publishing) and with drain()'s release store of the cursor (after the
//                   records were applied).
//   Consumer::drain()  one thread at a time per consumer (the cache holds its own lock).
//
// The invariant (docs/DESIGN.md): after munmap returns in thread A, a get started afterwards by A
// (or by a thread synchronised with A) never returns a region created for the old memory. The
// kernel releases A when the monitor's read() has consumed the event; `pending` was raised before
// that read, so A's later quiescent() sees it raised (slow path: wait, drain) or sees it lowered
// after the record was published (and then the cursor is behind the head until the record is
// applied). Gets concurrent with the unmap, in threads that never synchronised with A (the
// kernel handed them A's address), are exact through probe_unmaps() (Consumer, below).
//
// Environment (read at each monitor start):
//   MRC_MONITOR=auto|wp-async|wp|missing|off   forces a mode; off means uncached.
//   MRC_TEST_DROP_EVENTS=1                     TEST ONLY: the monitor reads and counts events
//                                              but publishes nothing, so that the stress
//                                              harness can prove that its oracle catches a
//                                              cache that misses invalidations. Never set it
//                                              in production: every unmap goes unnoticed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"
#include "uffd/queue.h"

namespace mrc::uffd {

enum class DrainResult {
  Ok,
  Overflow,  // records were lost to this consumer: purge everything (deregistering it)
  Forked,    // in a forked child: forget every region WITHOUT deregistering (the parent owns
             // them); do not unwatch ranges watched before the fork (the child's table is empty)
};

enum class WatchResult {
  Watched,
  NotMonitorable,  // do not cache: uncached mode, SysV shm, another userfaultfd owns the range
                   // (EBUSY), a mapping the kernel or the mode refuses, not mapped, VMA budget
};

class Monitor;

// One per cache: its cursor into the monitor's queue, and its door to watch/unwatch.
class Consumer {
 public:
  Consumer(const Consumer &) = delete;
  Consumer &operator=(const Consumer &) = delete;

  // Fast path, any thread, no lock, no syscall: nothing is pending in the monitor and every
  // record published so far has been applied by this consumer.
  bool quiescent() const noexcept {
    if (queue_->pending() != 0) return false;
    return cursor_.load(std::memory_order_acquire) == queue_->head();
  }

  // Slow path; one thread at a time. Waits (bounded) until `pending` falls, calls
  // apply(const Invalidation &) for every new record, then advances the cursor (release) once
  // apply has returned for all of them. On Overflow the cursor stays behind (quiescent() stays
  // false) until the next drain(), which first moves it past the lost records: purge before
  // draining again. On Forked the consumer is re-attached to the child's fresh monitor.
  template <class Apply>
  [[nodiscard]] DrainResult drain(Apply &&apply);

  // Makes the kernel report unmaps, moves and madvise(DONTNEED/FREE/REMOVE) of
  // [start, start+length): registers every whole mapping (VMA) the range touches, so that the
  // application's VMAs are never split (in MISSING mode exactly the pages asked for). Call before
  // registering with the backend: an unmap between a registration and a later watch would never
  // be seen. Watches are counted, so neighbours never unwatch each other; memory that is already
  // registered costs no syscall: no lock either when its mapping counts other watches (a CAS),
  // the registry mutex when its mapping's last watch left a short while ago (idle mappings stay
  // registered, a bounded number of them). The price
  // of whole mappings: every munmap/madvise anywhere in a watched mapping is reported (and makes
  // the calling thread wait for the monitor).
  // The window: if another thread unmapped this memory and the monitor has not read that event
  // yet, the answer may come from the old registration and new memory mapped at the address
  // stays unregistered until the record is drained. A caller that got Read from
  // probe_unmaps() or settle_unmaps() after the memory was mapped is outside that window.
  // On NotMonitorable, `why` (if given) receives a human-readable reason.
  [[nodiscard]] WatchResult watch(uintptr_t start, size_t length, char *why = nullptr,
                                  size_t why_len = 0);
  // Drops one watch taken by a successful watch() with the same arguments. No lock unless it is
  // the last watch its piece of the mapping counts.
  void unwatch(uintptr_t start, size_t length);
  // unwatch() of ranges[0, count) ({start, length} each); those that need the registry lock
  // (last watches) take it once per 64 ranges.
  struct Range {
    uintptr_t start;
    size_t length;
  };
  void unwatch_many(const Range *ranges, size_t count);

  mrc_monitor_mode_t mode() const noexcept;

  // Exactness under concurrent unmaps (docs/DESIGN.md, "Exact under concurrent unmaps"). The
  // kernel queues an UNMAP or REMAP event only after the VMA is gone, so another thread's mmap
  // may hand out the same address before the monitor has read it, while the old region still
  // stands in a cache's table. The kernel's count of such changes in flight closes that window:
  // a get that probes after it began and is answered Read, then finds the queue quiescent()
  // (or drains it), sees every unmap that freed its memory before it was mapped.
  enum class Unmaps : uint8_t {
    Read,         // every change of watched memory begun before the probe has been read
    InFlight,     // at least one has not: wait (settle_unmaps) before trusting any table
    Unprobeable,  // the monitor runs but the kernel refused the probe: trust no table
  };
  // One ioctl (none when no monitor runs), any thread, no lock; errno is kept. A seq_cst fence
  // follows it, so the caller's quiescent() or drain() comes after the kernel's answer.
  Unmaps probe_unmaps() const noexcept;
  // Probes until the answer is not InFlight, sleeping between tries until the monitor ends a
  // batch; InFlight when the changes in flight outlast a bounded wait (100 ms). Any thread, no
  // lock.
  Unmaps settle_unmaps() const noexcept;

 private:
  friend class Monitor;
  friend struct MonitorState;
  constexpr explicit Consumer(InvalidationQueue *queue) noexcept : queue_(queue) {}
  ~Consumer() = default;

  // Handles Forked and a pending resync, then waits for `pending` to fall. Ok: go on draining.
  DrainResult begin_drain() noexcept;
  DrainResult lapped(uint64_t head) noexcept;

  static constexpr uint64_t kForkedCursor = ~uint64_t{0};  // never equals a head

  InvalidationQueue *const queue_;
  // Written by the draining thread (release), read by every fast-path thread (acquire).
  alignas(64) std::atomic<uint64_t> cursor_{0};
  // Set only by the fork child handler (single-threaded child), read by drain().
  std::atomic<bool> forked_{false};
  // Drain-thread private.
  bool resync_ = false;
  uint64_t resync_to_ = 0;
  // Registry list, guarded by the registry mutex.
  Consumer *prev_ = nullptr;
  Consumer *next_ = nullptr;
  bool internal_ = false;
};

class Monitor {
 public:
  // Process-wide and reference counted: the first subscriber starts the monitor (negotiating
  // the mode), the last one to leave stops it. MRC_OK in uncached mode too (watch() then always
  // answers NotMonitorable). MRC_ERR_NO_MEMORY if the consumer cannot be allocated.
  [[nodiscard]] static mrc_status_t subscribe(Consumer **out);
  static void unsubscribe(Consumer *consumer);
  // The mode (negotiating it if the monitor never ran), why, and counters.
  static void info(mrc_monitor_info_t *out) noexcept;
};

// ---- test-only controls (tests/uffd and tools/bench; not for the cache) ----
namespace testing {
// Capacity (power of two) of the queue allocated by the next start; 0 = the default (32768).
void set_queue_capacity(size_t records);
// Ceiling on VMAs added by watching; 0 = the default (vm.max_map_count / 4).
void set_vma_budget(uint64_t vmas);
// Idle watched mappings kept registered, from the next start; negative = the default (32).
void set_idle_vmas(int64_t vmas);
// Run the monitor loop on poll(2) instead of io_uring (the fallback when io_uring fails).
void force_poll_loop(bool on);
// While on, the monitor leaves events unread (their unmappers stay blocked in the kernel).
void pause_monitor(bool on);
// UFFDIO_REGISTER calls made by watch() since the process started.
uint64_t registrations();
// Called (under the registry mutex) between watch()'s lookup of a mapping and its
// UFFDIO_REGISTER of [start, end), where the application may change the mapping; nullptr = none.
void set_before_register_hook(void (*hook)(uintptr_t start, uintptr_t end));
// Runs fn(arg) on the calling thread while it holds the registry mutex: tests show which watch
// and unwatch calls never take it (they finish while fn waits for them).
void with_registry_locked(void (*fn)(void *arg), void *arg);
// The userfaultfd of the running monitor, -1 if none (benchmarks compare raw ioctls).
int monitor_fd();
// How the running monitor thread waits: "io_uring+defer" (single issuer, deferred task work),
// "io_uring" (kernels before 6.1), "poll" (io_uring unavailable or failed, or forced), "none"
// when no monitor runs. A subscription returns once the thread has chosen ("not started" never
// shows then).
const char *monitor_loop();
}  // namespace testing

// ---- inline ----

template <class Apply>
DrainResult Consumer::drain(Apply &&apply) {
  const DrainResult started = begin_drain();
  if (started != DrainResult::Ok) return started;
  const uint64_t head = queue_->head();
  uint64_t at = cursor_.load(std::memory_order_relaxed);
  Invalidation record;
  for (; at != head; ++at) {
    if (!queue_->read(at, &record)) return lapped(head);
    apply(static_cast<const Invalidation &>(record));
  }
  cursor_.store(head, std::memory_order_release);
  return DrainResult::Ok;
}

}  // namespace mrc::uffd
