// SPDX-License-Identifier: BSD-3-Clause
// Watches: watch, unwatch and unwatch_many on the monitor's watch table (see watches.h).
//
// SYNCHRONIZATION: see watches.h (the calls), internal/watch_table.h (the fast path) and
// internal/monitor_state.h (the registry mutex).
#include "uffd/watches.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "base/epoch.h"
#include "base/mutex.h"
#include "uffd/internal/monitor_state.h"
#include "uffd/internal/plumbing.h"

namespace mrc::uffd {

using detail::evict_idle_watches_locked;
using detail::g_monitor;
using detail::start_locked;
using detail::sync_watches_locked;

namespace {

bool page_range(uintptr_t start, size_t length, uintptr_t *lo, uintptr_t *hi, char *why,
                size_t why_len) noexcept {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  if (length == 0 || start + length < start || start + length > UINTPTR_MAX - page) {
    detail::set_text(why, why_len, "empty or wrapping range");
    return false;
  }
  *lo = start & ~(page - 1);
  *hi = (start + length + page - 1) & ~(page - 1);
  return true;
}

// The ring, not the mode: a forked child keeps its parent's mode until its own start, but not
// the ring (and its start is what the mutex path below runs).
bool bpf_mode() noexcept { return detail::g_bpf_ring.load(std::memory_order_acquire) != nullptr; }

}  // namespace

// The fast path: no lock, no syscall, when the range lies in a registered mapping and in a piece
// that already counts a watch (docs/DESIGN.md, "The watch table's fast path"). The order is the
// protocol: the internal subscription's records are all applied (quiescent(): three acquire loads),
// then the snapshot is read. Else the registry mutex; the internal subscription is drained only
// when records are waiting.
WatchResult watch(uintptr_t start, size_t length, char *why, size_t why_len) {
  if (why != nullptr && why_len > 0) why[0] = '\0';
  uintptr_t lo;
  uintptr_t hi;
  if (!page_range(start, length, &lo, &hi, why, why_len)) return WatchResult::NotMonitorable;
  // bpf mode watches the whole address space already (docs/DESIGN.md, "The eBPF monitor's mode").
  if (bpf_mode()) return WatchResult::Watched;
  {
    EpochGuard guard;
    if (g_monitor.internal.quiescent() && g_monitor.watches.try_watch_fast(lo, hi))
      return WatchResult::Watched;
  }
  MutexLock hold(g_monitor.mutex);
  if (g_monitor.needs_start) start_locked();
  if (bpf_mode()) return WatchResult::Watched;
  if (!g_monitor.internal.quiescent()) sync_watches_locked();
  WatchResult result = g_monitor.watches.watch(lo, hi, why, why_len);
  if (result == WatchResult::NotMonitorable && g_monitor.watches.wants_room()) {
    // Over the VMA budget while idle entries hold some of it: give those back and try again,
    // unless an unmap in flight keeps them (the get then registers uncached).
    if (evict_idle_watches_locked()) {
      if (why != nullptr && why_len > 0) why[0] = '\0';
      result = g_monitor.watches.watch(lo, hi, why, why_len);
    } else if (why != nullptr && why_len > 0) {
      const size_t used = strlen(why);
      snprintf(why + used, why_len - used,
               "; idle mappings are let go only once no unmap of watched memory is in flight");
    }
  }
  if (g_monitor.watches.wants_eviction()) evict_idle_watches_locked();
  g_monitor.watches.publish();
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
  if (bpf_mode()) return;  // nothing was registered
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
          for (size_t j = g_monitor.watches.try_unwatch_fast(lo, hi, run); j < run; ++j) {
            locked |= uint64_t{1} << (i + j);
          }
        }
        i += run;
      }
    }
    if (locked == 0) continue;
    MutexLock hold(g_monitor.mutex);
    if (!g_monitor.internal.quiescent()) sync_watches_locked();
    for (size_t i = 0; i < chunk; ++i) {
      if ((locked & (uint64_t{1} << i)) == 0) continue;
      uintptr_t lo;
      uintptr_t hi;
      if (page_range(ranges[base + i].start, ranges[base + i].length, &lo, &hi, nullptr, 0)) {
        g_monitor.watches.unwatch(lo, hi);
      }
    }
    if (g_monitor.watches.wants_eviction()) evict_idle_watches_locked();
    g_monitor.watches.publish();
  }
}

}  // namespace mrc::uffd
