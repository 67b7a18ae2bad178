// SPDX-License-Identifier: BSD-3-Clause
// The subscription: draining the queue, the unmap probe, subscribe and unsubscribe.
//
// SYNCHRONIZATION: see subscription.h (the cursor) and internal/monitor_state.h (the registry).
#include "uffd/subscription.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <new>

#include "base/check.h"
#include "base/mutex.h"
#include "uffd/internal/monitor_state.h"
#include "uffd/internal/negotiation.h"
#include "uffd/internal/plumbing.h"

namespace mrc::uffd {

namespace {

// How long settle_unmaps() waits for unmaps in flight. One lasts a monitor round trip (tens of
// microseconds here); only a storm of unmaps by threads that never get (a getting thread does
// not unmap while it waits), or a monitor kept off the CPU, holds the kernel's count up longer,
// and then the caller registers without the cache. 10 ms was outlasted on a loaded 2-CPU CI
// machine under ASan (the monitor waited that long for a CPU). Between probes it sleeps until
// the monitor's next batch, at most kSettleNapNs.
constexpr int64_t kSettleBudgetNs = 100'000'000;
constexpr int64_t kSettleNapNs = 50'000;
// The most unapplied records unapplied() reads.
constexpr uint64_t kUnappliedScanLimit = 256;

}  // namespace

using detail::g_monitor;

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
  // bpf mode: what the ring holds goes into the queue first, so that this drain applies it.
  if (detail::g_bpf_ring.load(std::memory_order_acquire) != nullptr) detail::feed_bpf_ring();
  queue_->wait_until_idle();
  return DrainResult::Ok;
}

DrainResult Subscription::lapped(uint64_t head) noexcept {
  resync_ = true;
  resync_to_ = head;
  return DrainResult::Overflow;
}

Subscription::Unapplied Subscription::unapplied(uintptr_t start, uintptr_t end) const noexcept {
  const bpf::RingConsumer *ring = detail::g_bpf_ring.load(std::memory_order_acquire);
  if (ring != nullptr && !ring->quiet()) return Unapplied::Unknown;  // not read yet
  if (queue_->pending() != 0) return Unapplied::Unknown;
  const uint64_t head = queue_->head();
  uint64_t at = cursor_.load(std::memory_order_acquire);
  if (at == head) return Unapplied::None;
  // A subscription far behind answers Unknown rather than scan: the answer stays bounded in
  // time (its caller may hold its own locks), at the price of a false "may concern".
  if (forked_.load(std::memory_order_relaxed) || at == kForkedCursor ||
      head - at > std::min<uint64_t>(queue_->capacity(), kUnappliedScanLimit)) {
    return Unapplied::Unknown;
  }
  Invalidation record;
  for (; at != head; ++at) {
    if (!queue_->read(at, &record)) return Unapplied::Unknown;  // lapped: the record is gone
    if (record.start < end && start < record.end) return Unapplied::Overlapping;
  }
  return Unapplied::None;
}

void Subscription::wait_for_records(int64_t timeout_ns) const noexcept {
  const uint32_t seen = queue_->batches();
  if (forked_.load(std::memory_order_relaxed) || queue_->pending() != 0 ||
      cursor_.load(std::memory_order_acquire) != queue_->head()) {
    return;
  }
  queue_->wait_for_batch_after(seen, timeout_ns);
}

mrc_monitor_mode_t Subscription::mode() const noexcept {
  return static_cast<mrc_monitor_mode_t>(g_monitor.mode.load(std::memory_order_relaxed));
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
  Subscription *subscription = new (std::nothrow) Subscription(&g_monitor.queue);
  if (subscription == nullptr) return MRC_ERR_NO_MEMORY;
  MutexLock hold(g_monitor.mutex);
  if (g_monitor.subscribers == 0 || g_monitor.needs_start) detail::start_locked();
  subscription->cursor_.store(g_monitor.queue.head(), std::memory_order_relaxed);
  subscription->next_ = g_monitor.subscriptions;
  if (g_monitor.subscriptions != nullptr) g_monitor.subscriptions->prev_ = subscription;
  g_monitor.subscriptions = subscription;
  ++g_monitor.subscribers;
  *out = subscription;
  return MRC_OK;
}

void unsubscribe(Subscription *subscription) {
  if (subscription == nullptr) return;
  MutexLock hold(g_monitor.mutex);
  if (subscription->prev_ != nullptr) {
    subscription->prev_->next_ = subscription->next_;
  } else {
    g_monitor.subscriptions = subscription->next_;
  }
  if (subscription->next_ != nullptr) subscription->next_->prev_ = subscription->prev_;
  delete subscription;
  MRC_CHECK(g_monitor.subscribers > 0);
  if (--g_monitor.subscribers == 0) detail::stop_locked();
}

}  // namespace mrc::uffd
