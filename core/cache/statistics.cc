// SPDX-License-Identifier: BSD-3-Clause
// A cache's statistics and their JSON form (statistics.h).
#include "core/cache/statistics.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

namespace mrc {

void StatsReading::read_hot(const ShardedCounters &counters) noexcept {
  for (unsigned counter = 0; counter < static_cast<unsigned>(Counter::Count); ++counter) {
    hot[counter] = counters.sum(static_cast<Counter>(counter));
  }
}

mrc_stats_t StatsReading::totals() const noexcept {
  mrc_stats_t stats{};
  stats.regions = regions;
  stats.hits_fast = hot_sum(Counter::HitsFast);
  stats.gets = stats.hits_fast + slow.gets_slow;
  stats.puts = hot_sum(Counter::Puts);
  stats.hits_slow = slow.hits_slow;
  stats.misses = slow.misses;
  stats.merges = slow.merges;
  stats.unmap_events = slow.unmap_events;
  stats.invalidations = slow.invalidations;
  stats.registrations = slow.registrations;
  stats.deregistrations = hot_sum(Counter::Deregistrations);
  stats.evictions = slow.evictions;
  stats.registered_bytes = slow.registered_bytes - hot_sum(Counter::EndedBytes);
  stats.registration_failures = slow.registration_failures;
  stats.uncacheable = slow.uncacheable;
  stats.pfn_mismatches = hot_sum(Counter::PfnMismatches);
  stats.purges = slow.purges;
  // Uncached regions count in and out outside the lock: a sum may see the out before the in.
  const uint64_t unreleased = slow.unreleased_bytes + hot_sum(Counter::UnreleasedBytes);
  const uint64_t released = hot_sum(Counter::ReleasedBytes);
  stats.unreleased_bytes = unreleased > released ? unreleased - released : 0;
  return stats;
}

int StatsReading::json(const char *name, const char *backend, bool exact, char *buffer,
                       size_t length) const noexcept {
  const mrc_stats_t s = totals();
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
                 name, backend, s.gets, s.hits_fast, s.hits_slow, s.misses, s.merges,
                 s.unmap_events, s.invalidations, s.puts, s.registrations, s.deregistrations,
                 s.evictions, s.regions, s.registered_bytes, s.registration_failures, s.uncacheable,
                 s.pfn_mismatches, s.purges, s.unreleased_bytes, exact,
                 hot_sum(Counter::UnmapWaits), hot_sum(Counter::UnmapWaitsOutlasted),
                 slow.churn_skips, slow.churn_unprobed);
  bool first = true;
  for (unsigned bucket = 0; bucket < 64; ++bucket) {
    const uint64_t count = slow.size_histogram[bucket];
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
