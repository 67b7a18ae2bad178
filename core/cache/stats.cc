// SPDX-License-Identifier: BSD-3-Clause
// Statistics: mrc_cache_stats (the sharded hot counters plus the slow path's under mutex_) and
// their JSON form.
//
// SYNCHRONIZATION: see cache.h ("Statistics")
#include "core/cache/cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "core/cache/log.h"

namespace mrc {

mrc_status_t Cache::stats(mrc_stats_t *out) noexcept {
  log::DeferScope defer_messages;  // until the call is done with the cache (log.h)
  SlowStats slow{};
  mrc_stats_t stats{};
  uint64_t ended_bytes = 0;
  uint64_t released_bytes = 0;
  uint64_t unreleased_uncached = 0;
  {
    Lock lock(*this);
    if (!lock.acquire()) return MRC_ERR_BUSY;
    // True when read: an unmap that returned before this call is applied and counted now (like
    // a slow path would), and what it released is deregistered before the figures are taken.
    drain_locked();
    if (Region *deferred = take_deferred_locked(); deferred != nullptr) {
      lock.release();  // deregistration never runs under mutex_
      finish_all(deferred);
      if (!lock.acquire()) return MRC_ERR_BUSY;
    }
    // The sharded sums under the lock too: what they subtract was then added before (under the
    // lock), so the differences never go below zero.
    slow = slow_;
    stats.regions = cached_regions_;
    ended_bytes = hot_.sum(Counter::EndedBytes);
    released_bytes = hot_.sum(Counter::ReleasedBytes);
    unreleased_uncached = hot_.sum(Counter::UnreleasedBytes);
  }
  stats.hits_fast = hot_.sum(Counter::HitsFast);
  stats.gets = stats.hits_fast + slow.gets_slow;
  stats.puts = hot_.sum(Counter::Puts);
  stats.hits_slow = slow.hits_slow;
  stats.misses = slow.misses;
  stats.merges = slow.merges;
  stats.unmap_events = slow.unmap_events;
  stats.invalidations = slow.invalidations;
  stats.registrations = slow.registrations;
  stats.deregistrations = hot_.sum(Counter::Deregistrations);
  stats.evictions = slow.evictions;
  stats.registered_bytes = slow.registered_bytes - ended_bytes;
  stats.registration_failures = slow.registration_failures;
  stats.uncacheable = slow.uncacheable;
  stats.pfn_mismatches = pfn_mismatches_.load(std::memory_order_relaxed);
  stats.purges = slow.purges;
  // Uncached regions count in and out outside the lock: a sum may see the out before the in.
  const uint64_t unreleased = slow.unreleased_bytes + unreleased_uncached;
  stats.unreleased_bytes = unreleased > released_bytes ? unreleased - released_bytes : 0;
  *out = stats;
  return MRC_OK;
}

int Cache::stats_json(char *buffer, size_t length) noexcept {
  log::DeferScope defer_messages;  // until the call is done with the cache (log.h)
  mrc_stats_t s{};
  if (const mrc_status_t status = stats(&s); status != MRC_OK) return status;
  uint64_t histogram[64];
  uint64_t churn_skips = 0;
  uint64_t churn_unprobed = 0;
  {
    Lock lock(*this);
    if (!lock.acquire()) return MRC_ERR_BUSY;
    std::memcpy(histogram, slow_.size_histogram, sizeof histogram);
    churn_skips = slow_.churn_skips;
    churn_unprobed = slow_.churn_unprobed;
  }
  fmt::memory_buffer text;
  auto out = std::back_inserter(text);
  fmt::format_to(out,
                 "{{\"name\":\"{}\",\"backend\":\"{}\",\"gets\":{},\"hits_fast\":{},"
                 "\"hits_slow\":{},\"misses\":{},\"merges\":{},\"unmap_events\":{},"
                 "\"invalidations\":{},\"puts\":{},\"registrations\":{},"
                 "\"deregistrations\":{},\"evictions\":{},\"regions\":{},"
                 "\"registered_bytes\":{},\"registration_failures\":{},\"uncacheable\":{},"
                 "\"pfn_mismatches\":{},\"purges\":{},\"unreleased_bytes\":{},"
                 "\"exact\":{},\"unmap_waits\":{},\"unmap_waits_outlasted\":{},"
                 "\"churn_skips\":{},\"churn_unprobed\":{},"
                 "\"size_histogram\":{{",
                 name_, backend_.name != nullptr ? backend_.name : "", s.gets, s.hits_fast,
                 s.hits_slow, s.misses, s.merges, s.unmap_events, s.invalidations, s.puts,
                 s.registrations, s.deregistrations, s.evictions, s.regions, s.registered_bytes,
                 s.registration_failures, s.uncacheable, s.pfn_mismatches, s.purges,
                 s.unreleased_bytes, exact_, hot_.sum(Counter::UnmapWaits),
                 hot_.sum(Counter::UnmapWaitsOutlasted), churn_skips, churn_unprobed);
  bool first = true;
  for (unsigned bucket = 0; bucket < 64; ++bucket) {
    const uint64_t count = histogram[bucket];
    if (count == 0) continue;
    fmt::format_to(out, "{}\"{}\":{}", first ? "" : ",", uint64_t{1} << bucket, count);
    first = false;
  }
  fmt::format_to(out, "}}}}");
  const size_t size = text.size();
  if (buffer != nullptr && length != 0) {
    const size_t copied = std::min(size, length - 1);
    std::memcpy(buffer, text.data(), copied);
    buffer[copied] = '\0';
  }
  return static_cast<int>(size);
}

}  // namespace mrc
