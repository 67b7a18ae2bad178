// SPDX-License-Identifier: BSD-3-Clause
// One thread's parked references in one cache: the hit path without a locked instruction.
//
// SYNCHRONIZATION: see cache.h ("Parked references")
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mrc {

struct Region;

// One thread's parked references in one cache (see SYNCHRONIZATION). `parked` is written by the
// owning thread with plain stores, inside a guard or (as the mutex_ holder) under mutex_, and by
// another mutex_ holder with a CAS; the rest only by the owner.
struct alignas(64) ParkingLine {
  static constexpr size_t kSlots = 4;
  std::atomic<Region *> parked[kSlots] = {};
  uint8_t reused[kSlots] = {};  // CLOCK bits: taken back since the hand last passed
  uint32_t hand = 0;
  const Region *streak_region = nullptr;  // identity only: the region hit last, unparked
  uint32_t streak = 0;                    // consecutive hits on it
};

namespace cache::testing {
// Set by set_park_window_spins (core/cache/testing.h); 0 outside tests.
extern std::atomic<uint32_t> g_park_window_spins;
}  // namespace cache::testing

}  // namespace mrc
