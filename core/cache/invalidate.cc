// SPDX-License-Identifier: BSD-3-Clause
// mrc_invalidate: a region leaves the table at once; its callback runs after its
// deregistration, at its last put (release.cc).
//
// SYNCHRONIZATION: see cache.h
#include "core/cache/cache.h"

#include <new>

#include "core/cache/log.h"

namespace mrc {

mrc_status_t Cache::invalidate(Region *region, void (*done)(void *), void *arg) noexcept {
  if (region == nullptr || region->cache != this || region->has(Region::kFailed)) {
    return MRC_ERR_INVALID;
  }
  log::DeferScope defer_messages;  // until the call is done with the cache (log.h)
  InvalidateCallback *callback = nullptr;
  Region *deferred = nullptr;
  if (done != nullptr) {
    callback = new (std::nothrow) InvalidateCallback{done, arg, nullptr};
    if (callback == nullptr) return MRC_ERR_NO_MEMORY;
  }
  {
    Lock lock(*this);
    if (!lock.acquire()) {
      delete callback;
      return MRC_ERR_BUSY;
    }
    // A region whose count ended is being finished (its callbacks may be running: this one would
    // never run) or is gone: no handle of the caller's.
    if ((region->refcount.load(std::memory_order_acquire) & Region::kDead) != 0) {
      delete callback;
      return MRC_ERR_INVALID;
    }
    if (callback != nullptr) {
      callback->next = region->callbacks;
      region->callbacks = callback;
    }
    if (region->has(Region::kInTable)) {
      ++slow_.invalidations;
      remove_locked(region);
    }
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
  return MRC_OK;
}

}  // namespace mrc
