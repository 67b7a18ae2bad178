// Test-only controls of the cache (tests only; the library never includes this, only
// core/cache/testing.cc defines it).
#pragma once

#include <cstdint>

namespace mrc::cache::testing {

// A put that replaces a slot of its full parking line spins this many iterations between reading
// the line and choosing what to replace (0 = none, the default): it widens the window in which a
// reclaimer empties slots of the line, so that a test meets that interleaving in well under a
// second instead of by chance.
void set_park_window_spins(uint32_t spins);

}  // namespace mrc::cache::testing
