// SPDX-License-Identifier: BSD-3-Clause
// Test-only controls of the base layer (tests and tools/bench; the library never includes this).
#pragma once

namespace mrc::os::testing {
// Use the /proc/self/maps parser even where PROCMAP_QUERY works.
void force_maps_fallback(bool on);
}  // namespace mrc::os::testing
