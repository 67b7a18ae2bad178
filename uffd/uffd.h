// SPDX-License-Identifier: BSD-3-Clause
// uffd: the process-wide userfaultfd monitor, watched ranges and the invalidation queue.
//
// The monitor learns from the kernel that memory went away (munmap, mremap, madvise, brk,
// MAP_FIXED) for the ranges caches watch, and publishes one record per event into a
// preallocated broadcast queue (queue.h) that every subscribed cache reads at its own pace.
// This header is the component's face for the cache; each part has its own:
//   subscription.h  a cache's cursor into the queue: subscribe, quiescent, drain, probe_unmaps
//   watches.h       the address ranges watched, process-wide: watch, unwatch, unwatch_many
//   Monitor::info   (below) the mode, why, and counters: mrc_monitor_info()
// Test-only controls are in testing.h, which the library never includes.
//
// SYNCHRONIZATION: see subscription.h and watches.h for their calls, internal/monitor_state.h for
// the monitor thread and the registry mutex (Monitor::info takes it).
//
// Environment (read at each monitor start):
//   MRC_MONITOR=auto|wp-async|wp|missing|off   forces a mode; off means uncached.
// MRC_TEST_DROP_EVENTS=1 (the monitor reads and counts events but publishes nothing, so that the
// stress harness can prove that its oracle catches a cache that misses invalidations) is not read
// by the library: only programs that link uffd/testing_env.cc (the tests and tools, through the
// build's mrcache_internal target) honour it, so libmrcache never hands out stale registrations
// because of a variable left set.
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
