// Cache::Lock: mutex_ with the re-entrancy frame (reentry.h) and the deferral of log messages
// (log.h).
//
// SYNCHRONIZATION: see cache.h and reentry.h
#include <mutex>

#include "base/check.h"
#include "core/cache/cache.h"
#include "core/cache/log.h"

namespace mrc {

constinit thread_local InsideFrame *tls_inside = nullptr;

bool Cache::Lock::acquire(bool wait) noexcept {
  MRC_DASSERT(!held_);
  if (inside(&cache_, Inside::Lock)) return false;  // std::mutex is not recursive
  if (!wait && inside_a_lock()) {
    if (!cache_.mutex_.try_lock()) return false;
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
