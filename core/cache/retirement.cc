// SPDX-License-Identifier: BSD-3-Clause
// The end of a region's life under the cache's lock: the live list, the deferred stack and the
// retiring batch (retirement.h).
#include "core/cache/retirement.h"

#include <atomic>

#include "base/epoch.h"
#include "core/cache/region_stack.h"
#include "uffd/uffd.h"

namespace mrc {

void Retirement::track(Region *region) noexcept {
  region->live_prev = nullptr;
  region->live_next = live_head_;
  if (live_head_ != nullptr) live_head_->live_prev = region;
  live_head_ = region;
}

void Retirement::unlink(Region *region) noexcept {
  if (region->live_prev != nullptr) {
    region->live_prev->live_next = region->live_next;
  } else if (live_head_ == region) {
    live_head_ = region->live_next;
  }
  if (region->live_next != nullptr) region->live_next->live_prev = region->live_prev;
  region->live_prev = region->live_next = nullptr;
}

void Retirement::defer(Region *region) noexcept {
  // Uncached: a put from inside reg (Cache::release_last). Batched: a fork child's first drain.
  region->expect({RegionState::Invalidated, RegionState::Uncached, RegionState::Batched});
  region->enter(RegionState::Deferred);
  region->gc_next = deferred_;
  deferred_ = region;
}

void Retirement::reap(Region *finished, Recycle recycle) noexcept {
  for_each_in_chain(finished, [this, recycle](Region *region) {
    region->expect({RegionState::Finished});
    region->enter(RegionState::Retiring);
    unlink(region);
    if (retiring_count_ == kBatch) retire_batch(recycle);
    retiring_[retiring_count_++] = region;
  });
}

// Unwatching waits for the batch too: a watch left a little longer costs nothing (the range stays
// registered), and a batch's last watches of mappings take the monitor's registry lock once.
void Retirement::retire_batch(Recycle recycle) noexcept {
  if (retiring_count_ == 0) return;
  uffd::WatchRange watched[kBatch];
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
  epoch_domain().retire(chain, recycle);
  retiring_count_ = 0;
}

}  // namespace mrc
