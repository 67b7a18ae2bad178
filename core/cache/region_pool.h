// SPDX-License-Identifier: BSD-3-Clause
// Region memory: storage reused for regions only, so that a fast-path reader holding a stale
// pointer never touches memory reused for anything else (docs/DESIGN.md, "Reclamation").
//
// 1. allocate() and give_back() under the cache's mutex_ (the cache holds the pool
//    MRC_GUARDED_BY(mutex_)).
// 2. What the epoch domain hands back arrives on a RegionStack from any thread (recycled);
//    allocate() refills the pool from it in one exchange, only when the pool is empty.
// 3. Storage comes back Free and leaves reset(); past kMax free regions, it goes back to malloc.
#pragma once

#include <cstddef>

#include "core/cache/region.h"
#include "core/cache/region_stack.h"

namespace mrc {

class RegionPool {
 public:
  // nullptr when out of memory.
  Region *allocate(RegionStack &recycled) noexcept;
  void give_back(Region *region) noexcept;
  // Every free region, to delete (the cache's destroy, once no reader is left).
  Region *take_all() noexcept {
    Region *all = free_;
    free_ = nullptr;
    count_ = 0;
    return all;
  }

 private:
  static constexpr size_t kMax = 4096;
  Region *free_ = nullptr;  // through gc_next
  size_t count_ = 0;
};

}  // namespace mrc
