// SPDX-License-Identifier: BSD-3-Clause
// A cache's statistics: the slow path's counters (plain integers under mutex_), the hot path's
// (per-thread shards, counters.h), and how mrc_cache_stats and its JSON form combine them.
//
// 1. SlowCounters change only under the cache's mutex_ (the cache holds them
//    MRC_GUARDED_BY(mutex_)); ShardedCounters change from any thread without a lock.
// 2. A StatsReading is taken under mutex_, the sharded sums included: a total that is a locked
//    sum minus a sharded one (registered bytes, unreleased bytes) then never goes below zero.
// 3. The figures are exact for everything that happened before the reading's lock, once the
//    cache drained its invalidation queue (Cache::stats).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cache/counters.h"
#include "mrcache/mrcache.h"

namespace mrc {

struct SlowCounters {
  uint64_t gets_slow, hits_slow, misses, merges, unmap_events, invalidations, registrations,
      evictions, registration_failures, uncacheable, purges;
  uint64_t churn_skips;       // misses registered uncached because their range churns
  uint64_t churn_unprobed;    // of them, taken at the get's start: no probe, no lookup
  uint64_t registered_bytes;  // ever registered; minus Counter::EndedBytes = still registered
  uint64_t unreleased_bytes;  // ever left the table referenced; plus Counter::UnreleasedBytes
                              // minus Counter::ReleasedBytes = still waiting
  uint64_t size_histogram[64];
};

struct StatsReading {
  SlowCounters slow{};
  uint64_t hot[static_cast<unsigned>(Counter::Count)] = {};  // ShardedCounters::sum of each
  uint64_t regions = 0;                                      // registered regions in the table

  void read_hot(const ShardedCounters &counters) noexcept;
  uint64_t hot_sum(Counter counter) const noexcept { return hot[static_cast<unsigned>(counter)]; }
  mrc_stats_t totals() const noexcept;
  // mrc_cache_stats_json's text: snprintf's contract (the length it needed, NUL-terminated when
  // length != 0).
  int json(const char *name, const char *backend, bool exact, char *buffer,
           size_t length) const noexcept;
};

}  // namespace mrc
