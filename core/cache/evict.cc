// SPDX-License-Identifier: BSD-3-Clause
// Eviction: the bound (max_regions, max_bytes), the CLOCK hand over the LRU ring of cached
// regions, the trim a put runs when the cache is over its bound, and evicting every unused
// region when the backend runs out of registration resources.
//
// SYNCHRONIZATION: see cache.h; docs/DESIGN.md, "Over the bound"
#include "core/cache/cache.h"

#include <atomic>

#include "core/cache/log.h"

namespace mrc {

// Skipped when mutex_ cannot be taken here (a put from inside a reg): the next miss or trim
// evicts instead (docs/DESIGN.md, "Over the bound").
void Cache::trim() noexcept {
  log::DeferScope defer_messages;  // until the put is done with the cache (log.h)
  Region *deferred = nullptr;
  {
    Lock lock(*this);
    if (!lock.acquire()) return;
    evict_locked();
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
}

bool Cache::over_bound_locked() const noexcept {
  return (max_regions_ != 0 && table_entries_ > max_regions_) ||
         (max_bytes_ != 0 && cached_bytes_ > max_bytes_);
}

void Cache::evict_locked() noexcept {
  // CLOCK: two passes clear every reference bit, a third finds any unused region left. A region
  // that only parked references hold is not in use: when such regions are in the way, their
  // references are reclaimed and the hand goes round once more.
  bool skipped_parkable = false;
  for (int round = 0; round < 2 && over_bound_locked(); ++round) {
    if (round == 1 && !(skipped_parkable && unpark_all_locked())) break;
    size_t budget = 3 * table_entries_;
    while (over_bound_locked() && ring_.hand() != nullptr && budget-- != 0) {
      Region *region = ring_.advance();
      if (region->refcount.load(std::memory_order_acquire) != 1) {  // in use: never
        skipped_parkable = skipped_parkable || region->has(Region::kParkable);
        continue;
      }
      if (region->referenced.load(std::memory_order_relaxed) && !region->has(Region::kFailed)) {
        region->referenced.store(false, std::memory_order_relaxed);
        continue;
      }
      ++slow_.evictions;
      remove_locked(region);
    }
  }
  // Still past the bound: every region left is in use, and the put that frees one trims.
  if (over_bound_locked() && !over_bound_.load(std::memory_order_relaxed)) {
    over_bound_.store(true, std::memory_order_relaxed);
  }
}

// Evicts every cached region no one holds; returns how many. They go on the deferred stack like any
// removal: deregistered after the lock (no dereg runs under mutex_), before the caller retries
// the registration that needs the resources (get_slow).
size_t Cache::evict_unused_locked() noexcept {
  unpark_all_locked();  // out of resources: what is only parked is not in use
  size_t evicted = 0;
  Region *region = ring_.hand();
  // Each step visits a different entry of the ring as it was: removals keep the others' order.
  for (size_t budget = table_entries_; region != nullptr && budget-- != 0;) {
    Region *next = region->lru_next;
    if (region->refcount.load(std::memory_order_acquire) == 1 && !region->has(Region::kFailed)) {
      ++slow_.evictions;
      remove_locked(region);
      ++evicted;
    }
    region = ring_.hand() != nullptr ? next : nullptr;
  }
  return evicted;
}

}  // namespace mrc
