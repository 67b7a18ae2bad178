// SPDX-License-Identifier: BSD-3-Clause
// The cached regions in a ring through Region::lru_prev/lru_next, with the CLOCK hand that
// eviction turns (core/cache/evict.cc).
//
// 1. Every member function runs under the cache's mutex_ (the cache holds the ring
//    MRC_GUARDED_BY(mutex_)); the hit path never touches it (its CLOCK bit is on the region).
// 2. A region is in the ring exactly while it is in the page table (Failed, Cached, Parkable).
// 3. insert() puts a region just behind the hand: the last one a turn from the hand reaches.
#pragma once

#include "core/cache/region.h"

namespace mrc {

class ClockRing {
 public:
  Region *hand() const noexcept { return hand_; }
  // Moves the hand past the region it points at, and returns that region.
  Region *advance() noexcept {
    Region *passed = hand_;
    hand_ = passed->lru_next;
    return passed;
  }
  void insert(Region *region) noexcept {
    if (hand_ == nullptr) {
      region->lru_prev = region->lru_next = region;
      hand_ = region;
      return;
    }
    region->lru_next = hand_;
    region->lru_prev = hand_->lru_prev;
    hand_->lru_prev->lru_next = region;
    hand_->lru_prev = region;
  }
  void remove(Region *region) noexcept {
    if (region->lru_next == region) {
      hand_ = nullptr;
    } else {
      region->lru_prev->lru_next = region->lru_next;
      region->lru_next->lru_prev = region->lru_prev;
      if (hand_ == region) hand_ = region->lru_next;
    }
    region->lru_prev = region->lru_next = nullptr;
  }

 private:
  Region *hand_ = nullptr;
};

}  // namespace mrc
