// SPDX-License-Identifier: BSD-3-Clause
// A lock-free stack of regions chained through Region::gc_next: how a region ended without the
// cache's lock reaches the next thread that deals with it (finished regions waiting to be
// retired, deregistrations waiting for a batch, storage the epoch domain hands back).
//
// 1. push(), push_chain() and take_all() from any thread, under any lock or none.
// 2. A push is the pusher's last write to the regions it pushes (a release CAS); take_all() (an
//    acquire exchange) sees every write made before each push it returns.
// 3. empty() is a relaxed hint: what it says may already be stale; a caller that skips work on
//    an empty stack does it at its next call.
#pragma once

#include <atomic>

#include "core/cache/region.h"

namespace mrc {

class RegionStack {
 public:
  void push(Region *region) noexcept { push_chain(region, region); }
  // first..last, already chained through gc_next.
  void push_chain(Region *first, Region *last) noexcept {
    Region *head = head_.load(std::memory_order_relaxed);
    do {
      last->gc_next = head;
    } while (!head_.compare_exchange_weak(head, first, std::memory_order_release,
                                          std::memory_order_relaxed));
  }
  // The whole stack, newest first, chained through gc_next (for_each_in_chain).
  Region *take_all() noexcept {
    if (empty()) return nullptr;
    return head_.exchange(nullptr, std::memory_order_acquire);
  }
  bool empty() const noexcept { return head_.load(std::memory_order_relaxed) == nullptr; }

 private:
  std::atomic<Region *> head_{nullptr};
};

// Calls fn on each region of a chain through gc_next; fn may relink or free the region.
template <typename Fn>
void for_each_in_chain(Region *chain, Fn &&fn) noexcept {
  while (chain != nullptr) {
    Region *next = chain->gc_next;
    fn(chain);
    chain = next;
  }
}

}  // namespace mrc
