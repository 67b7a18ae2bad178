// SPDX-License-Identifier: BSD-3-Clause
// bpf mode's producer: the eBPF ring's records into the invalidation queue, read by every
// subscription as the monitor thread's are (docs/DESIGN.md, "The eBPF monitor's mode").
//
// SYNCHRONIZATION: g_monitor.feed_mutex makes the feeding thread the queue's one producer and the
// ring's one drainer; the queue's batch protocol (queue.h) orders the rest.
#include <sched.h>
#include <time.h>

#include <cstdint>

#include "bpf/ring.h"
#include "uffd/internal/monitor_state.h"

namespace mrc::uffd::detail {
namespace {

// The top of every address space, page-aligned: ~0 in a record means "to the top", and the
// caches round ends up to a page.
constexpr uintptr_t kTop = ~uintptr_t{0} & ~uintptr_t{0xfff};
// How long a record reserved but not committed may hold the feed up: a program commits within
// instructions of reserving, unless an interrupt or a preemption sits between.
constexpr int64_t kBusyWaitNs = 100'000'000;

int64_t now_ns() noexcept {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1'000'000'000LL + now.tv_nsec;
}

Invalidation invalidation_of(const bpf::ChangeRecord &record) noexcept {
  const auto kind = static_cast<bpf::ChangeKind>(record.kind);
  Invalidation out{static_cast<uintptr_t>(record.start),
                   record.end > kTop ? kTop : static_cast<uintptr_t>(record.end),
                   InvalidationKind::Unmap};
  if (kind == bpf::ChangeKind::Madvise) out.kind = InvalidationKind::Remove;
  if (kind == bpf::ChangeKind::Remap) out.kind = InvalidationKind::Remap;
  if (kind == bpf::ChangeKind::Purge) out.start = 0;
  return out;
}

}  // namespace

void feed_bpf_ring() noexcept {
  MutexLock hold(g_monitor.feed_mutex);
  bpf::RingConsumer *ring = g_bpf_ring.load(std::memory_order_acquire);
  if (ring == nullptr || ring->quiet()) return;
  InvalidationQueue &queue = g_monitor.queue;
  queue.begin_batch();
  uint64_t published = 0;
  const auto append = [&published](const bpf::ChangeRecord &record) {
    g_monitor.queue.append(invalidation_of(record));
    ++published;
  };
  bpf::RingConsumer::Drained drained = ring->drain(append);
  for (const int64_t deadline = now_ns() + kBusyWaitNs;
       drained == bpf::RingConsumer::Drained::Busy && now_ns() < deadline;) {
    sched_yield();
    drained = ring->drain(append);
  }
  if (drained != bpf::RingConsumer::Drained::Ok) {
    // Lost: records were dropped. Busy past the wait: a change is still in flight. Either way
    // nothing cached can be trusted; every subscription drops everything, and the ring stays
    // unquiet (Busy) or turns quiet only once this record is published (Lost).
    queue.append(Invalidation{0, kTop, InvalidationKind::Unmap});
    ++published;
  }
  queue.end_batch();
  if (drained == bpf::RingConsumer::Drained::Lost) ring->purged();
  g_monitor.events.fetch_add(published, std::memory_order_relaxed);
}

}  // namespace mrc::uffd::detail
