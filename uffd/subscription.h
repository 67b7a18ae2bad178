// SPDX-License-Identifier: BSD-3-Clause
// The subscription: one cache's cursor into the monitor's invalidation queue (queue.h), which the
// monitor fills with one record per event and every subscription reads at its own pace. It keeps
// gets ordered after an unmap (quiescent, drain) and gets racing one (probe_unmaps) exact; why:
// docs/DESIGN.md, "The pending protocol: unmaps ordered before the get" and
// "Exact under concurrent unmaps".
//
// SYNCHRONIZATION
//   1. subscribe() and unsubscribe(): any thread, under the monitor's registry mutex
//      (internal/monitor_state.h), which guards the subscriber list (prev_, next_) and the
//      monitor's start and stop. The first subscriber starts the monitor, the last one stops it.
//      The monitor thread never takes the mutex.
//   2. quiescent(): any thread, no lock; acquire loads of the eBPF ring's positions (bpf mode),
//      `pending`, the queue head and the cursor, paired with the monitor's lowering of
//      `pending` (after publishing) and with drain()'s release store of the cursor (after the
//      records were applied).
//   3. drain(): one thread at a time per subscription (the cache holds its own lock).
//   4. probe_unmaps(), settle_unmaps(), mode(): any thread, no lock; they read the monitor's probe
//      descriptor (acquire) and mode (relaxed), paired as internal/monitor_state.h says.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "bpf/ring.h"
#include "mrcache/mrcache.h"
#include "uffd/internal/probe.h"
#include "uffd/queue.h"

namespace mrc::uffd {

enum class DrainResult {
  Ok,
  Overflow,  // records were lost to this subscription: purge everything (deregistering it)
  Forked,    // in a forked child: forget every region WITHOUT deregistering (the parent owns
             // them); do not unwatch ranges watched before the fork (the child's table is empty)
};

class Subscription;
namespace detail {
struct MonitorState;
}  // namespace detail

// Process-wide and reference counted: the first subscriber starts the monitor (negotiating the
// mode), the last one to leave stops it. MRC_OK in uncached mode too (watch() then always
// answers NotMonitorable). MRC_ERR_NO_MEMORY if the subscription cannot be allocated.
[[nodiscard]] mrc_status_t subscribe(Subscription **out);
void unsubscribe(Subscription *subscription);

// One per cache: its cursor into the monitor's queue.
class Subscription {
 public:
  Subscription(const Subscription &) = delete;
  Subscription &operator=(const Subscription &) = delete;

  // Fast path, any thread, no lock, no syscall: nothing is pending in the monitor (in bpf mode:
  // nothing unread in the ring either) and every record published so far has been applied by
  // this subscription (docs/DESIGN.md, "The eBPF monitor's mode").
  bool quiescent() const noexcept {
    const bpf::RingConsumer *ring = detail::g_bpf_ring.load(std::memory_order_acquire);
    if (ring != nullptr && !ring->quiet()) return false;
    if (queue_->pending() != 0) return false;
    return cursor_.load(std::memory_order_acquire) == queue_->head();
  }

  // Slow path; one thread at a time. Waits (bounded) until `pending` falls, calls
  // apply(const Invalidation &) for every new record, then advances the cursor (release) once
  // apply has returned for all of them. On Overflow the cursor stays behind (quiescent() stays
  // false) until the next drain(), which first moves it past the lost records: purge before
  // draining again. On Forked the subscription is re-attached to the child's fresh monitor.
  template <class Apply>
  [[nodiscard]] DrainResult drain(Apply &&apply);

  mrc_monitor_mode_t mode() const noexcept;

  // For a subscriber that answers validity questions while another thread drains (the public
  // monitor, core/monitor/): whether a record this subscription has not applied yet may concern
  // [start, end). Unknown while a batch is being read (`pending`), when records were lost to it,
  // when more than a few hundred wait (it reads no more), and in a forked child until it drained.
  // Any thread, no lock: acquire loads of `pending`, the head, the cursor and the records (the
  // queue's seqlock), as for quiescent().
  enum class Unapplied : uint8_t { None, Overlapping, Unknown };
  Unapplied unapplied(uintptr_t start, uintptr_t end) const noexcept;
  // Returns when a record this subscription has not applied may be waiting, or after at most
  // `timeout_ns`. For a thread that drains for others; never misses a batch that ends meanwhile.
  void wait_for_records(int64_t timeout_ns) const noexcept;
  // Ends every wait_for_records() now (spuriously, for the waiter).
  void wake_record_waiters() const noexcept { queue_->wake_batch_waiters(); }

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
  // follows it, so the caller's quiescent() or drain() comes after the kernel's answer. Inline,
  // as the ioctl is (internal/probe.h).
  [[gnu::always_inline]] Unmaps probe_unmaps() const noexcept;
  // Probes until the answer is not InFlight, sleeping between tries until the monitor ends a
  // batch; InFlight when the changes in flight outlast a bounded wait (100 ms). Any thread, no
  // lock.
  Unmaps settle_unmaps() const noexcept;

 private:
  friend mrc_status_t subscribe(Subscription **out);
  friend void unsubscribe(Subscription *subscription);
  friend struct detail::MonitorState;
  constexpr explicit Subscription(InvalidationQueue *queue) noexcept : queue_(queue) {}
  ~Subscription() = default;

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
  Subscription *prev_ = nullptr;
  Subscription *next_ = nullptr;
};

// ---- inline ----

inline Subscription::Unmaps Subscription::probe_unmaps() const noexcept {
  // Acquire: pairs with start_locked()'s release, so a descriptor seen here is the monitor's.
  const int fd = detail::g_probe_fd.load(std::memory_order_acquire);
  // No userfaultfd (bpf mode, uncached): no kernel answer to order, so no fence either; bpf
  // mode's check is the ring's, in quiescent() (docs/DESIGN.md, "The eBPF monitor's mode").
  if (fd == detail::kProbeNoMonitor) return Unmaps::Read;
  const int saved_errno = errno;  // a get that succeeds leaves the application's errno alone
  Unmaps answer = Unmaps::Read;
  if (fd == detail::kProbeRefused) {
    answer = Unmaps::Unprobeable;
  } else {
    switch (detail::probe_mmap_changing(fd)) {
      case detail::ProbeAnswer::Clear: break;
      case detail::ProbeAnswer::Changing: answer = Unmaps::InFlight; break;
      case detail::ProbeAnswer::Refused: answer = Unmaps::Unprobeable; break;
    }
  }
  // The kernel's read of mmap_changing comes before the caller's loads of `pending` and of the
  // queue (docs/DESIGN.md, "Exact under concurrent unmaps").
  std::atomic_thread_fence(std::memory_order_seq_cst);
  errno = saved_errno;
  return answer;
}

template <class Apply>
DrainResult Subscription::drain(Apply &&apply) {
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
