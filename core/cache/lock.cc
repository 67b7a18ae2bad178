// Cache::Lock: mutex_ with the re-entrancy frame (reentry.h) and the deferral of log messages
// (log.h).
//
// SYNCHRONIZATION: see cache.h and reentry.h
#include <mutex>

#include "base/check.h"
#include "base/error.h"
#include "core/cache/cache.h"
#include "core/cache/log.h"

namespace mrc {

constinit thread_local InsideFrame *tls_inside = nullptr;

bool Cache::Lock::acquire(bool wait) noexcept {
  MRC_DASSERT(!held_);
  if (inside(&cache_, Inside::Lock)) {  // std::mutex is not recursive
    set_last_error("cache %s: called back from its own backend's reg, which runs under its lock",
                   cache_.name_);
    return false;
  }
  if (!wait && inside_a_lock()) {
    if (!cache_.mutex_.try_lock()) {
      set_last_error(
          "cache %s: busy, and this thread holds another cache's lock (a reg calling "
          "into this cache): waiting could deadlock",
          cache_.name_);
      return false;
    }
  } else {
    cache_.mutex_.lock();
  }
  frame_ = {&cache_, Inside::Lock, tls_inside};
  tls_inside = &frame_;
  log::defer_begin();
  held_ = true;
  return true;
}

void Cache::Lock::release() noexcept {
  MRC_DASSERT(held_ && tls_inside == &frame_);
  held_ = false;
  tls_inside = frame_.prev;
  cache_.mutex_.unlock();
  log::defer_end();  // the handler runs now, after the unlock
}

}  // namespace mrc
