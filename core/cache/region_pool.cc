// SPDX-License-Identifier: BSD-3-Clause
// Region memory: a pool refilled from what the epoch domain hands back, so a fast-path reader
// holding a stale pointer never touches memory reused for anything but a region.
//
// SYNCHRONIZATION: see cache.h
#include "core/cache/cache.h"

#include <atomic>
#include <new>

namespace mrc {

Region *Cache::allocate_region_locked() noexcept {
  if (free_regions_ == nullptr && recycled_.load(std::memory_order_relaxed) != nullptr) {
    for (Region *region = recycled_.exchange(nullptr, std::memory_order_acquire);
         region != nullptr;) {
      Region *next = region->gc_next;
      region->expect({RegionState::Free});
      free_region_locked(region);
      region = next;
    }
  }
  Region *region = free_regions_;
  if (region == nullptr) return new (std::nothrow) Region();
  region->expect({RegionState::Free});
  free_regions_ = region->gc_next;
  --free_count_;
  region->reset();  // Region is trivially destructible: its storage is reused as it is
  return region;
}

void Cache::free_region_locked(Region *region) noexcept {
  if (free_count_ == kFreeRegionsMax) {
    delete region;
    return;
  }
  region->enter(RegionState::Free);
  region->gc_next = free_regions_;
  free_regions_ = region;
  ++free_count_;
}

// The epoch domain's reclaim callback for a chain of regions: no lock (it may run on any thread,
// under any lock).
void Cache::recycle_regions(void *chain) noexcept {
  auto *first = static_cast<Region *>(chain);
  Region *last = first;
  for (;; last = last->gc_next) {
    last->expect({RegionState::Retired});
    last->enter(RegionState::Free);
    if (last->gc_next == nullptr) break;
  }
  Cache *cache = first->cache;
  Region *head = cache->recycled_.load(std::memory_order_relaxed);
  do {
    last->gc_next = head;
  } while (!cache->recycled_.compare_exchange_weak(head, first, std::memory_order_release,
                                                   std::memory_order_relaxed));
}

}  // namespace mrc
