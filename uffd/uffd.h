// SPDX-License-Identifier: BSD-3-Clause
// uffd: the process-wide userfaultfd monitor, watched ranges and the invalidation queue. The
// monitor learns from the kernel that memory went away (munmap, mremap, madvise, brk, MAP_FIXED)
// for the ranges caches watch, and publishes one record per event into a preallocated broadcast
// queue (queue.h) that every subscribed cache reads at its own pace (docs/DESIGN.md, "Data flow").
//   1. This header is the component's face for the cache; each part has its own:
//      subscription.h (a cache's cursor into the queue: subscribe, quiescent, drain,
//      probe_unmaps), watches.h (the ranges watched, process-wide: watch, unwatch, unwatch_many),
//      Monitor::info below (the mode, why, and counters: mrc_monitor_info()).
//   2. SYNCHRONIZATION: subscription.h and watches.h for their calls, internal/monitor_state.h
//      for the monitor thread and the registry mutex (Monitor::info takes it).
//   3. MRC_MONITOR=auto|wp-async|wp|missing|off, read at each monitor start, forces a mode; off
//      means uncached.
//   4. Test-only controls are in testing.h, which the library never includes.
//      MRC_TEST_DROP_EVENTS=1 (events read and counted, none published: the stress harness proves
//      its oracle catches a cache that misses invalidations) is read only by programs that link
//      uffd/testing_env.cc (tests and tools, through mrcache_internal), so libmrcache never hands
//      out stale registrations because of a variable left set.
#pragma once

#include "mrcache/mrcache.h"
#include "uffd/queue.h"
#include "uffd/subscription.h"
#include "uffd/watches.h"

namespace mrc::uffd {

class Monitor {
 public:
  // The mode (negotiating it if the monitor never ran), why, and counters.
  static void info(mrc_monitor_info_t *out) noexcept;
  // What an application's unmap of watched memory waits for the monitor (os::ticks(), beyond a
  // plain unmap), measured when the monitor started; 0 if none runs or it could not be measured.
  static uint64_t round_trip_ticks() noexcept;
};

}  // namespace mrc::uffd
