// SPDX-License-Identifier: BSD-3-Clause
// The mutex_ side of parked references: promotion (a region earns kParkable and an owner), and
// taking parked references back when kParkable is cleared (unpark, reclaim). Parking and
// taking back on the hit path are in fast_path.cc.
//
// SYNCHRONIZATION: see cache.h ("Parked references")
#include "core/cache/cache.h"

#include <atomic>
#include <bit>
#include <cstdint>
#include <utility>

#include "base/check.h"
#include "base/epoch.h"
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
    for (uint64_t &word : lines_to_reclaim_) word = ~uint64_t{0};
    return;
  }
  if (!thread.exclusive || thread.index != owner) {
    lines_to_reclaim_[owner / 64] |= uint64_t{1} << (owner % 64);
    return;
  }
  // Our own line: only this thread stores to it, and no other thread takes from it without
  // mutex_, which we hold.
  for (std::atomic<Region *> &slot : parking_[owner].parked) {
    if (slot.load(std::memory_order_relaxed) != region) continue;
    slot.store(nullptr, std::memory_order_relaxed);
    if (region->drop_reference()) defer_locked(region);
  }
}

void Cache::reclaim_parked_locked() noexcept {
  bool marked = false;
  for (uint64_t word : lines_to_reclaim_) marked = marked || word != 0;
  if (!marked) return;
  epoch_domain().wait_for_readers();
  if (const uint32_t spins = cache::testing::g_park_window_spins.load(std::memory_order_relaxed);
      __builtin_expect(spins != 0, 0)) {
    for (uint32_t i = 0; i < spins; ++i) asm volatile("" ::: "memory");
  }
  for (size_t word = 0; word < kLines / 64; ++word) {
    for (uint64_t bits = std::exchange(lines_to_reclaim_[word], 0); bits != 0; bits &= bits - 1) {
      for (std::atomic<Region *> &slot :
           parking_[word * 64 + static_cast<size_t>(std::countr_zero(bits))].parked) {
        // A parked region is this cache's and referenced: alive. One whose flag is clear can no
        // longer be taken back or parked by its owner (the wait above), only by this CAS.
        Region *region = slot.load(std::memory_order_acquire);
        if (region == nullptr || region->has(Region::kParkable)) continue;
        if (slot.compare_exchange_strong(region, nullptr, std::memory_order_acq_rel,
                                         std::memory_order_relaxed) &&
            region->drop_reference()) {
          defer_locked(region);
        }
      }
    }
  }
}

bool Cache::unpark_all_locked() noexcept {
  bool any = false;
  Region *region = lru_hand_;
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
