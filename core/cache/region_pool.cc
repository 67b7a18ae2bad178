// SPDX-License-Identifier: BSD-3-Clause
// Region memory (region_pool.h).
#include "core/cache/region_pool.h"

#include <new>

namespace mrc {

Region *RegionPool::allocate(RegionStack &recycled) noexcept {
  if (free_ == nullptr) {
    for_each_in_chain(recycled.take_all(), [this](Region *region) {
      region->expect({RegionState::Free});
      give_back(region);
    });
  }
  Region *region = free_;
  if (region == nullptr) return new (std::nothrow) Region();
  region->expect({RegionState::Free});
  free_ = region->gc_next;
  --count_;
  region->reset();  // Region is trivially destructible: its storage is reused as it is
  return region;
}

void RegionPool::give_back(Region *region) noexcept {
  if (count_ == kMax) {
    delete region;
    return;
  }
  region->enter(RegionState::Free);
  region->gc_next = free_;
  free_ = region;
  ++count_;
}

}  // namespace mrc
