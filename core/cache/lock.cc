// SPDX-License-Identifier: BSD-3-Clause
// Cache::Lock: mutex_ with the re-entrancy frame (reentry.h) and the deferral of log messages
// (log.h).
//
// SYNCHRONIZATION: see cache.h and reentry.h
#include <sched.h>

#include <mutex>

#include "base/check.h"
#include "base/error.h"
#include "base/futex.h"
#include "core/cache/cache.h"
#include "core/cache/log.h"

namespace mrc {

constinit thread_local InsideFrame *tls_inside = nullptr;

bool Cache::Lock::acquire(bool wait) noexcept {
  MRC_DASSERT(!held_);
  if (inside(&cache_, Inside::Lock)) {  // mrc::Mutex is not recursive
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
  enter();
  return true;
}

bool Cache::Lock::acquire_unless_reg_runs() noexcept {
  MRC_DASSERT(!held_ && !inside(&cache_, Inside::Lock));
  while (!cache_.mutex_.try_lock()) {
    if (cache_.reg_state_.load(std::memory_order_seq_cst) != kRegIdle) return false;
    sched_yield();  // held for a short section that runs no user code
  }
  enter();
  return true;
}

void Cache::Lock::enter() noexcept {
  frame_ = {&cache_, Inside::Lock, tls_inside};
  tls_inside = &frame_;
  log::defer_begin();
  held_ = true;
}

mrc_status_t Cache::call_reg(uintptr_t start, uintptr_t end, unsigned prot, void **handle,
                             uint64_t *key) noexcept {
  reg_state_.store(kRegRunning, std::memory_order_seq_cst);
  const mrc_status_t status =
      backend_.reg(backend_ctx_, reinterpret_cast<void *>(start), end - start, prot, handle, key);
  // A fork that did not take mutex_ may be copying this cache: touch nothing until it is done.
  for (uint32_t running = kRegRunning;
       !reg_state_.compare_exchange_strong(running, kRegIdle, std::memory_order_seq_cst);
       running = kRegRunning) {
    os::futex_wait(&reg_state_, kRegForking);
  }
  return status;
}

bool Cache::lock_or_skip_for_fork() noexcept {
  for (;;) {
    if (mutex_.try_lock()) return true;
    uint32_t running = kRegRunning;
    if (reg_state_.compare_exchange_strong(running, kRegForking, std::memory_order_seq_cst)) {
      return false;
    }
    sched_yield();  // held for a short section that runs no user code, or about to run reg
  }
}

void Cache::Lock::release() noexcept {
  MRC_DASSERT(held_ && tls_inside == &frame_);
  held_ = false;
  tls_inside = frame_.prev;
  cache_.mutex_.unlock();
  log::defer_end();  // the handler runs now, after the unlock
}

}  // namespace mrc
