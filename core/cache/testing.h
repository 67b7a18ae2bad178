// SPDX-License-Identifier: BSD-3-Clause
// Test-only controls of the cache (tests only; the library never includes this, only
// core/cache/testing.cc defines it).
#pragma once

#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc {
struct Region;
}  // namespace mrc

namespace mrc::cache::testing {

// Widens both sides of the moment when a put parks into a line that a reclaimer is emptying: a
// put that replaces a slot of its full parking line spins this many iterations between reading
// the line and choosing what to replace, and reclaim_parked_locked as many after its wait for
// readers, before it empties the marked lines (0 = none, the default). A test or a soak run then
// meets that interleaving within seconds instead of by chance.
void set_park_window_spins(uint32_t spins);

// The region the cache's page table holds at `address` (nullptr: none, or the cache's lock could
// not be taken from here), read under that lock: the only way to a region the API never hands
// out (a remembered failure, Region::kFailed). Valid while nothing removes it.
const Region *table_entry(mrc_cache_t *cache, uintptr_t address);

}  // namespace mrc::cache::testing
