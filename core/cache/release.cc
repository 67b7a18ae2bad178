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
#include "base/epoch.h"

namespace mrc {

void Cache::release(Region *region) noexcept {
  if (region->drop_reference()) release_last(region);
}

void Cache::release_last(Region *region) noexcept {
  region->expect({RegionState::Invalidated, RegionState::Uncached});
  if (inside(this, Inside::Lock)) {
    // A put from inside a reg: the region is finished after the unlock by this thread, which
    // takes deferred_ before it unlocks (get_slow), never under mutex_.
    assert_held();
    defer_locked(region);
    return;
  }
  const uint32_t flags = region->flags.load(std::memory_order_acquire);
  if (max_unreleased_ != 0 && (flags & Region::kRegistered) != 0 &&
      (flags & Region::kForgotten) == 0) {
    // Deferred: deregistration is batched until max_unreleased bytes wait or the slow path runs.
    if ((flags & Region::kUnreleased) == 0) {  // uncached: never left a table, counted from now
      region->change_flags(Region::kUnreleased);
      hot_.add(Counter::UnreleasedBytes, region->length());
    }
    region->enter(RegionState::Batched);  // before the push: a finisher may take it at once
    Region *head = dereg_batch_.load(std::memory_order_relaxed);
    do {
      region->gc_next = head;
    } while (!dereg_batch_.compare_exchange_weak(head, region, std::memory_order_release,
                                                 std::memory_order_relaxed));
    if (dereg_batch_bytes_.fetch_add(region->length(), std::memory_order_relaxed) +
            region->length() >
        max_unreleased_) {
      finish_dereg_batch();
    }
    return;
  }
  finish(region);
}

void Cache::finish_dereg_batch() noexcept {
  if (dereg_batch_.load(std::memory_order_relaxed) == nullptr) return;
  Region *batched = dereg_batch_.exchange(nullptr, std::memory_order_acquire);
  while (batched != nullptr) {
    Region *next = batched->gc_next;
    dereg_batch_bytes_.fetch_sub(batched->length(), std::memory_order_relaxed);
    finish(batched);
    batched = next;
  }
}

void Cache::unlink_live_locked(Region *region) noexcept {
  if (region->live_prev != nullptr) {
    region->live_prev->live_next = region->live_next;
  } else if (live_head_ == region) {
    live_head_ = region->live_next;
  }
  if (region->live_next != nullptr) region->live_next->live_prev = region->live_prev;
  region->live_prev = region->live_next = nullptr;
}

void Cache::defer_locked(Region *region) noexcept {
  // Uncached: a put from inside reg (release_last). Batched: a fork child's first drain.
  region->expect({RegionState::Invalidated, RegionState::Uncached, RegionState::Batched});
  region->enter(RegionState::Deferred);
  region->gc_next = deferred_;
  deferred_ = region;
}

Region *Cache::take_deferred_locked() noexcept {
  reclaim_parked_locked();
  Region *deferred = deferred_;
  deferred_ = nullptr;
  return deferred;
}

void Cache::finish_all(Region *list) noexcept {
  while (list != nullptr) {
    Region *next = list->gc_next;
    finish(list);
    list = next;
  }
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
  // The last write: a reaper may retire it once it is on the stack. Release: pairs with the
  // reaper's exchange (later pushes continue the release sequence).
  Region *head = finished_.load(std::memory_order_relaxed);
  do {
    region->gc_next = head;
  } while (!finished_.compare_exchange_weak(head, region, std::memory_order_release,
                                            std::memory_order_relaxed));
}

// Every finished region leaves the live list and goes to the epoch domain (in batches), which
// recycles its memory once no fast-path reader can still hold it.
void Cache::reap_finished_locked() noexcept {
  if (finished_.load(std::memory_order_relaxed) == nullptr) return;
  // Acquire: every finisher's writes to the regions it pushed are visible.
  Region *region = finished_.exchange(nullptr, std::memory_order_acquire);
  while (region != nullptr) {
    Region *next = region->gc_next;
    region->expect({RegionState::Finished});
    region->enter(RegionState::Retiring);
    unlink_live_locked(region);
    if (retiring_count_ == kRetireBatch) retire_batch_locked();
    retiring_[retiring_count_++] = region;
    region = next;
  }
}

// Unwatching waits for the batch too: a watch left a little longer costs nothing (the range stays
// registered), and a batch's last watches of mappings take the monitor's registry lock once.
void Cache::retire_batch_locked() noexcept {
  if (retiring_count_ == 0) return;
  uffd::WatchRange watched[kRetireBatch];
  size_t count = 0;
  for (size_t i = 0; i < retiring_count_; ++i) {
    const Region *region = retiring_[i];
    const uint32_t flags = region->flags.load(std::memory_order_relaxed);
    if ((flags & Region::kWatched) != 0 && (flags & Region::kForgotten) == 0) {
      watched[count++] = {region->start, region->length()};
    }
  }
  if (count != 0) uffd::unwatch_many(watched, count);
  // One object for the epoch domain: the batch chained through gc_next, recycled in one push.
  Region *chain = nullptr;
  for (size_t i = 0; i < retiring_count_; ++i) {
    retiring_[i]->expect({RegionState::Retiring});
    retiring_[i]->enter(RegionState::Retired);
    retiring_[i]->gc_next = chain;
    chain = retiring_[i];
  }
  epoch_domain().retire(chain, &Cache::recycle_regions);
  retiring_count_ = 0;
}

}  // namespace mrc
