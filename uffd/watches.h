// SPDX-License-Identifier: BSD-3-Clause
// Watches: which address ranges the monitor watches for the caches. Process-wide: every cache
// watches and unwatches through these functions, on the monitor's one watch table
// (internal/watch_table.h, private), so the calls need no subscription of their own; while none
// exists the monitor does not run and every watch answers NotMonitorable.
//
// SYNCHRONIZATION
//   watch(), unwatch(), unwatch_many()  any thread. Fast path, no lock: a watch of memory inside
//                   a registered mapping whose piece already counts a watch, and an unwatch that
//                   leaves its piece a watch, are one CAS on that piece's count under an
//                   EpochGuard (internal/watch_table.h). Every other call (a first watch, a last
//                   unwatch, registration, eviction) takes the monitor's registry mutex
//                   (internal/monitor_state.h), which guards the table; the monitor thread never
//                   takes it. The mutex is held across fork (pthread_atfork).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mrc::uffd {

enum class WatchResult {
  Watched,
  NotMonitorable,  // do not cache: uncached mode, SysV shm, another userfaultfd owns the range
                   // (EBUSY), a mapping the kernel or the mode refuses, not mapped, VMA budget
};

// Makes the kernel report unmaps, moves and madvise(DONTNEED/FREE/REMOVE) of
// [start, start+length): registers every whole mapping (VMA) the range touches, so that the
// application's VMAs are never split (in every mode; in the brk heap exactly the pages asked
// for). Call before
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
// Subscription::probe_unmaps() or settle_unmaps() after the memory was mapped is outside that
// window. On NotMonitorable, `why` (if given) receives a human-readable reason.
[[nodiscard]] WatchResult watch(uintptr_t start, size_t length, char *why = nullptr,
                                size_t why_len = 0);
// Drops one watch taken by a successful watch() with the same arguments. No lock unless it is
// the last watch its piece of the mapping counts.
void unwatch(uintptr_t start, size_t length);
// unwatch() of ranges[0, count); those that need the registry lock (last watches) take it once
// per 64 ranges.
struct WatchRange {
  uintptr_t start;
  size_t length;
};
void unwatch_many(const WatchRange *ranges, size_t count);

}  // namespace mrc::uffd
