// SPDX-License-Identifier: BSD-3-Clause
// Test-only controls of the cache (see testing.h).
//
// SYNCHRONIZATION: each control is one relaxed atomic, read where the library acts on it;
// table_entry reads the page table under the cache's mutex_.
#include "core/cache/testing.h"

#include <atomic>

#include "core/cache/cache.h"
#include "core/cache/parking_lines.h"

namespace mrc {

struct CacheTesting {
  static const Region *table_entry(Cache &cache, uintptr_t address) noexcept {
    Cache::Lock lock(cache);
    if (!lock.acquire()) return nullptr;
    return static_cast<const Region *>(cache.table_.lookup(address));
  }
};

}  // namespace mrc

namespace mrc::cache::testing {

std::atomic<uint32_t> g_park_window_spins{0};

void set_park_window_spins(uint32_t spins) {
  g_park_window_spins.store(spins, std::memory_order_relaxed);
}

const Region *table_entry(mrc_cache_t *cache, uintptr_t address) {
  // The object behind the C API's opaque handle (capi.cc).
  return CacheTesting::table_entry(*reinterpret_cast<Cache *>(cache), address);
}

}  // namespace mrc::cache::testing
