// SPDX-License-Identifier: BSD-3-Clause
// The end of a region's life on the cache's side of the lock: the live list (every region not
// yet retired), the deferred stack (regions whose count ended under the lock, finished after
// it) and the retiring batch (finished regions on their way to the epoch domain). The states
// are core/cache/region.h's; why they are kept so: docs/DESIGN.md, "The end of a region's life".
//
// 1. Every member function runs under the cache's mutex_: the cache holds this object
//    MRC_GUARDED_BY(mutex_), so the compiler checks every call.
// 2. A region is tracked from its publication until reap() unlinks it; track() before anyone
//    else can reach it, so a region on no list is one that only its registering thread knows.
// 3. take_deferred() hands the caller regions whose count ended: it finishes them after the
//    unlock, never under mutex_ (deregistration may munmap).
// 4. retire_batch() unwatches and retires what reap() batched; a full batch goes at once.
#pragma once

#include <cstddef>

#include "core/cache/region.h"

namespace mrc {

class Retirement {
 public:
  // The epoch domain's reclaim callback for a chain of retired regions.
  using Recycle = void (*)(void *chain);

  // Onto the live list.
  void track(Region *region) noexcept;
  // The region's count ended under the lock (Invalidated, Uncached or Batched -> Deferred).
  void defer(Region *region) noexcept;
  Region *take_deferred() noexcept {
    Region *deferred = deferred_;
    deferred_ = nullptr;
    return deferred;
  }
  // Unlinks each finished region of the chain from the live list and batches it
  // (Finished -> Retiring); full batches are retired at once.
  void reap(Region *finished, Recycle recycle) noexcept;
  // Unwatches the batch's ranges (one call) and hands it to the epoch domain (-> Retired).
  void retire_batch(Recycle recycle) noexcept;

  Region *live_head() const noexcept { return live_head_; }
  // The fork child's handler marks these as its parent's (CacheRegistry::after_in_child).
  template <typename Fn>
  void for_each_retiring(Fn &&fn) const noexcept {
    for (size_t i = 0; i < retiring_count_; ++i) fn(retiring_[i]);
  }

 private:
  static constexpr size_t kBatch = 32;  // regions per object handed to the epoch domain
  void unlink(Region *region) noexcept;

  Region *live_head_ = nullptr;
  Region *deferred_ = nullptr;  // through gc_next
  Region *retiring_[kBatch] = {};
  size_t retiring_count_ = 0;
};

}  // namespace mrc
