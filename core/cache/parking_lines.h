// SPDX-License-Identifier: BSD-3-Clause
// The threads' parked references in one cache: the hit path without a locked instruction. A
// line per thread slot holds references its owner's puts kept instead of dropping, which its
// next gets take back (docs/DESIGN.md, "Parked references").
//
// 1. A line belongs to the thread of its slot (an exclusive one; threads sharing slots do not
//    park). Only the owner fills slots, with plain stores, inside an EpochGuard, after reading
//    the region's kParkable and owner in that guard; it also owns hand, reused and the streak.
// 2. A mutex_ holder empties slots: its own line's directly (drop_own), another's only through
//    reclaim(), after EpochDomain::wait_for_readers(), with a CAS, and only of regions whose
//    kParkable is clear. So an owner that read its slots once decides from that read.
// 3. Which lines reclaim() visits is ReclaimMarks, which the cache holds MRC_GUARDED_BY(mutex_):
//    passing it checks the lock at the call.
// 4. A parked reference is a real one: the region stays alive, and counts as in use, until it
//    is taken back or reclaimed.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "base/epoch.h"
#include "base/thread_slot.h"
#include "core/cache/region.h"

namespace mrc {

namespace cache::testing {
// Set by set_park_window_spins (core/cache/testing.h); 0 outside tests.
extern std::atomic<uint32_t> g_park_window_spins;
// Widens the window a test wants to hit (a reclaim against a park), when a test set it.
inline void spin_in_park_window() noexcept {
  if (const uint32_t spins = g_park_window_spins.load(std::memory_order_relaxed);
      __builtin_expect(spins != 0, 0)) {
    for (uint32_t i = 0; i < spins; ++i) asm volatile("" ::: "memory");
  }
}
}  // namespace cache::testing

struct alignas(64) ParkingLine {
  static constexpr size_t kSlots = 4;
  std::atomic<Region *> parked[kSlots] = {};
  uint8_t reused[kSlots] = {};  // CLOCK bits: taken back since the hand last passed
  uint32_t hand = 0;
  const Region *streak_region = nullptr;  // identity only: the region hit last, unparked
  uint32_t streak = 0;                    // consecutive hits on it

  // The owner, inside the guard in which it read the region parkable for it: takes a parked
  // reference to region back, if the line holds one.
  bool take_back(const Region *region) noexcept {
    for (size_t i = 0; i < kSlots; ++i) {
      if (parked[i].load(std::memory_order_relaxed) == region) {
        parked[i].store(nullptr, std::memory_order_relaxed);
        reused[i] = 1;
        return true;
      }
    }
    return false;
  }
  // The owner: counts a hit on a region it does not park; true once `times` hits in a row
  // (then counting starts again, so a promotion that does not take is tried again later).
  bool streak_reached(const Region *region, uint32_t times) noexcept {
    if (streak_region != region) {
      streak_region = region;
      streak = 1;
      return false;
    }
    if (++streak < times) return false;
    streak = 0;
    return true;
  }
};

// The owners' lines reclaim() must visit (ParkingLines rule 3).
class ReclaimMarks {
 public:
  void mark(unsigned owner) noexcept { words_[owner / 64] |= uint64_t{1} << (owner % 64); }
  void mark_all() noexcept {
    for (uint64_t &word : words_) word = ~uint64_t{0};
  }
  bool any() const noexcept {
    for (uint64_t word : words_) {
      if (word != 0) return true;
    }
    return false;
  }
  // Clears the marks and calls fn(owner) for each.
  template <typename Fn>
  void take(Fn &&fn) noexcept {
    for (size_t word = 0; word < kWords; ++word) {
      for (uint64_t bits = std::exchange(words_[word], 0); bits != 0; bits &= bits - 1) {
        fn(static_cast<unsigned>(word * 64 + static_cast<size_t>(std::countr_zero(bits))));
      }
    }
  }

 private:
  static constexpr size_t kWords = kThreadSlots / 64;
  uint64_t words_[kWords] = {};
};

class ParkingLines {
 public:
  static constexpr size_t kLines = kThreadSlots;
  static_assert(kLines <= Region::kAnyOwner && kLines % 64 == 0);

  // The calling thread's line, or nullptr when its slot is shared (it does not park).
  ParkingLine *line_of(const ThreadSlot &thread) noexcept {
    return thread.exclusive ? &lines_[thread.index] : nullptr;
  }
  ParkingLine &line(unsigned owner) noexcept { return lines_[owner]; }

  // The mutex_ holder that owns `owner`'s line: drops every reference to region parked there;
  // on_last(region) when one was the last.
  template <typename OnLast>
  void drop_own(unsigned owner, Region *region, OnLast &&on_last) noexcept {
    for (std::atomic<Region *> &slot : lines_[owner].parked) {
      if (slot.load(std::memory_order_relaxed) != region) continue;
      slot.store(nullptr, std::memory_order_relaxed);
      if (region->drop_reference()) on_last(region);
    }
  }

  // The mutex_ holder: takes every parked reference to a region no longer kParkable out of the
  // marked lines, once every guard that could have read the flag set has ended; on_last(region)
  // for each whose count that ended.
  template <typename OnLast>
  void reclaim(ReclaimMarks &marks, OnLast &&on_last) noexcept {
    if (!marks.any()) return;
    epoch_domain().wait_for_readers();
    cache::testing::spin_in_park_window();
    marks.take([&](unsigned owner) {
      for (std::atomic<Region *> &slot : lines_[owner].parked) {
        // A parked region is this cache's and referenced: alive. One whose flag is clear can no
        // longer be taken back or parked by its owner (the wait above), only by this CAS.
        Region *region = slot.load(std::memory_order_acquire);
        if (region == nullptr || region->has(Region::kParkable)) continue;
        if (slot.compare_exchange_strong(region, nullptr, std::memory_order_acq_rel,
                                         std::memory_order_relaxed) &&
            region->drop_reference()) {
          on_last(region);
        }
      }
    });
  }

  bool all_empty() const noexcept {
    for (const ParkingLine &line : lines_) {
      for (const std::atomic<Region *> &slot : line.parked) {
        if (slot.load(std::memory_order_relaxed) != nullptr) return false;
      }
    }
    return true;
  }

 private:
  ParkingLine lines_[kLines];
};

}  // namespace mrc
