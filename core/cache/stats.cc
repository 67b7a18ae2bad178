// SPDX-License-Identifier: BSD-3-Clause
// mrc_cache_stats and mrc_cache_stats_json: a reading of the cache's statistics (statistics.h)
// that is true when taken.
#include "core/cache/cache.h"

#include "core/cache/log.h"

namespace mrc {

mrc_status_t Cache::read_stats(StatsReading *reading) noexcept {
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
  reading->slow = slow_;
  reading->regions = cached_regions_;
  reading->read_hot(hot_);  // under the lock too (statistics.h, rule 2)
  return MRC_OK;
}

mrc_status_t Cache::stats(mrc_stats_t *out) noexcept {
  log::DeferScope defer_messages;  // until the call is done with the cache (log.h)
  StatsReading reading;
  if (const mrc_status_t status = read_stats(&reading); status != MRC_OK) return status;
  *out = reading.totals();
  return MRC_OK;
}

int Cache::stats_json(char *buffer, size_t length) noexcept {
  log::DeferScope defer_messages;  // until the call is done with the cache (log.h)
  StatsReading reading;
  if (const mrc_status_t status = read_stats(&reading); status != MRC_OK) return status;
  return reading.json(name_, backend_.name != nullptr ? backend_.name : "", exact_, buffer, length);
}

}  // namespace mrc
