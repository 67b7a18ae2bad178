// SPDX-License-Identifier: BSD-3-Clause
// The mutex_ side of parked references: promotion (a region earns kParkable and an owner), and
// taking parked references back when kParkable is cleared (unpark, reclaim). Parking and
// taking back on the hit path are in fast_path.cc.
//
// SYNCHRONIZATION: see cache.h and parking_lines.h
#include "core/cache/cache.h"

#include <atomic>
#include <cstdint>

#include "base/check.h"
#include "base/thread_slot.h"

namespace mrc {

// The caller holds a reference, so the region is alive; it must still be cached. The caller's
// slot is exclusive (it has a line). A second thread's promotion makes every thread an owner.
void Cache::promote(Region *region) noexcept {
  const unsigned me = this_thread_slot().index;
  Lock lock(*this);
  if (!lock.acquire()) return;  // promoted at a later streak
  const uint32_t flags = region->flags.load(std::memory_order_relaxed);
  if ((flags & (Region::kInTable | Region::kInvalid | Region::kFailed)) != Region::kInTable) return;
  if ((flags & Region::kParkable) == 0) {
    MRC_DASSERT((flags & Region::kOwnerMask) == 0);  // cleared with kParkable
    region->expect({RegionState::Cached});
    region->change_flags(Region::kParkable | (me << Region::kOwnerShift));
    region->expect({RegionState::Parkable});
  } else if (!Region::parks_for(flags, me)) {
    region->change_flags(Region::kOwnerMask);  // all ones: kAnyOwner
  }
}

void Cache::unpark_locked(Region *region) noexcept {
  const uint32_t flags = region->flags.load(std::memory_order_relaxed);
  const unsigned owner = Region::owner_of(flags);
  region->expect({RegionState::Parkable});
  region->change_flags(0, Region::kParkable | Region::kOwnerMask);
  region->expect({RegionState::Cached});
  const ThreadSlot &thread = this_thread_slot();
  if (owner == Region::kAnyOwner) {
    reclaim_marks_.mark_all();
  } else if (!thread.exclusive || thread.index != owner) {
    reclaim_marks_.mark(owner);
  } else {
    // Our own line: only this thread stores to it, and no other thread takes from it without
    // mutex_, which we hold.
    parking_.drop_own(owner, region, [this](Region *last) {
      assert_held();  // called back on this thread, under mutex_
      retirement_.defer(last);
    });
  }
}

void Cache::reclaim_parked_locked() noexcept {
  parking_.reclaim(reclaim_marks_, [this](Region *last) {
    assert_held();  // called back on this thread, under mutex_
    retirement_.defer(last);
  });
}

bool Cache::unpark_all_locked() noexcept {
  bool any = false;
  Region *region = ring_.hand();
  for (size_t budget = table_entries_; region != nullptr && budget-- != 0;
       region = region->lru_next) {
    if (region->has(Region::kParkable)) {
      unpark_locked(region);
      any = true;
    }
  }
  reclaim_parked_locked();
  return any;
}

}  // namespace mrc
