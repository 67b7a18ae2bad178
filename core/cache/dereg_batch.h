// SPDX-License-Identifier: BSD-3-Clause
// Deregistrations that wait for a batch (max_unreleased): the last put of a registered region
// leaves it here instead of deregistering it, until more than the limit's bytes wait; then one
// thread takes the whole batch and deregisters it (docs/DESIGN.md, "The end of a region's life").
//
// 1. No lock: add() and take_all() from any thread (RegionStack's rules).
// 2. limit() is set once, before the cache is shared; 0 turns batching off.
// 3. A region's bytes are counted before it is pushed and uncounted when it is taken, so the
//    count never goes below what the stack holds; it may lag a push in flight, which only moves
//    the batch's end by one region.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/cache/region.h"
#include "core/cache/region_stack.h"

namespace mrc {

class DeregBatch {
 public:
  void set_limit(size_t bytes) noexcept { limit_ = bytes; }
  size_t limit() const noexcept { return limit_; }

  // True when the batch now holds more than the limit: the caller takes it (take_all) and
  // deregisters what it took.
  [[nodiscard]] bool add(Region *region) noexcept {
    const uint64_t bytes = region->length();
    const uint64_t waiting = bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    regions_.push(region);
    return waiting > limit_;
  }
  // Every region waiting, chained through gc_next.
  Region *take_all() noexcept {
    Region *taken = regions_.take_all();
    uint64_t bytes = 0;
    for_each_in_chain(taken, [&bytes](Region *region) { bytes += region->length(); });
    if (bytes != 0) bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    return taken;
  }

 private:
  RegionStack regions_;
  std::atomic<uint64_t> bytes_{0};
  size_t limit_ = 0;
};

}  // namespace mrc
