// SPDX-License-Identifier: BSD-3-Clause
// Releasing: dropping references, the batch of regions whose deregistration waits
// (max_unreleased), finishing a region whose count reached zero (deregistration, callbacks),
// and reaping finished regions off the live list into the epoch domain. The states a region
// goes through here are in region.h.
//
// SYNCHRONIZATION: see cache.h
#include "core/cache/cache.h"

#include <atomic>
#include <utility>

#include "base/check.h"

namespace mrc {

void Cache::release(Region *region) noexcept {
  if (region->drop_reference()) release_last(region);
}

void Cache::release_last(Region *region) noexcept {
  region->expect({RegionState::Invalidated, RegionState::Uncached});
  if (inside(this, Inside::Lock)) {
    // A put from inside a reg: the region is finished after the unlock by this thread, which
    // takes the deferred stack before it unlocks (get_slow), never under mutex_.
    assert_held();
    retirement_.defer(region);
    return;
  }
  const uint32_t flags = region->flags.load(std::memory_order_acquire);
  if (dereg_batch_.limit() != 0 && (flags & Region::kRegistered) != 0 &&
      (flags & Region::kForgotten) == 0) {
    // Deferred: deregistration is batched until max_unreleased bytes wait or the slow path runs.
    if ((flags & Region::kUnreleased) == 0) {  // uncached: never left a table, counted from now
      region->change_flags(Region::kUnreleased);
      hot_.add(Counter::UnreleasedBytes, region->length());
    }
    region->enter(RegionState::Batched);  // before the push: a finisher may take it at once
    if (dereg_batch_.add(region)) finish_dereg_batch();
    return;
  }
  finish(region);
}

void Cache::finish_dereg_batch() noexcept { finish_all(dereg_batch_.take_all()); }

Region *Cache::take_deferred_locked() noexcept {
  reclaim_parked_locked();
  return retirement_.take_deferred();
}

void Cache::finish_all(Region *list) noexcept {
  for_each_in_chain(list, [this](Region *region) { finish(region); });
}

// Deregisters (unless `deregister` is false: a fork child forgets what the parent owns). By the
// region's only owner, the finishing thread, never under mutex_.
void Cache::end_registration(Region *region, bool deregister) noexcept {
  if (deregister) {
    MRC_DASSERT(!inside(this, Inside::Lock));
    InsideScope scope(this, Inside::Callback);
    backend_.dereg(backend_ctx_, region->handle);
    hot_.add(Counter::Deregistrations);
  }
  hot_.add(Counter::EndedBytes, region->length());
  region->change_flags(0, Region::kRegistered);
}

// The end of a region: its count is zero and it is out of the table, so no one can add a
// callback any more. Never under mutex_ (the backend may munmap). No lock: a later holder of
// mutex_ takes it from finished_ and retires it (reap_finished_locked).
void Cache::finish(Region *region) noexcept {
  // Invalidated or Uncached: its last put (release_last), or destroy forcing it.
  region->expect({RegionState::Deferred, RegionState::Batched, RegionState::Invalidated,
                  RegionState::Uncached});
  const uint32_t flags = region->flags.load(std::memory_order_acquire);
  const bool forgotten = (flags & Region::kForgotten) != 0;
  if ((flags & Region::kUnreleased) != 0) hot_.add(Counter::ReleasedBytes, region->length());
  if ((flags & Region::kRegistered) != 0) end_registration(region, !forgotten);
  // Taken off the region first: nothing can add one now (invalidate refuses a region whose count
  // ended), and a callback that destroys the cache is refused (Inside::Callback).
  InvalidateCallback *callback = std::exchange(region->callbacks, nullptr);
  if (callback != nullptr) {
    MRC_DASSERT(!inside(this, Inside::Lock));
    InsideScope scope(this, Inside::Callback);
    while (callback != nullptr) {
      InvalidateCallback *next = callback->next;
      callback->done(callback->arg);
      delete callback;
      callback = next;
    }
  }
  delete[] region->pfns;
  region->pfns = nullptr;
  region->enter(RegionState::Finished);
  finished_.push(region);  // the last write: a reaper may retire it at once
}

// Every finished region leaves the live list and goes to the epoch domain (in batches), which
// recycles its memory once no fast-path reader can still hold it.
void Cache::reap_finished_locked() noexcept {
  retirement_.reap(finished_.take_all(), &Cache::recycle_regions);
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
  first->cache->recycled_.push_chain(first, last);
}

}  // namespace mrc
