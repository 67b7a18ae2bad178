// SPDX-License-Identifier: BSD-3-Clause
// Test-only controls of the cache (see testing.h).
//
// SYNCHRONIZATION: each control is one relaxed atomic, read where the library acts on it.
#include "core/cache/testing.h"

#include <atomic>

#include "core/cache/parking_line.h"

namespace mrc::cache::testing {

std::atomic<uint32_t> g_park_window_spins{0};

void set_park_window_spins(uint32_t spins) {
  g_park_window_spins.store(spins, std::memory_order_relaxed);
}

}  // namespace mrc::cache::testing
