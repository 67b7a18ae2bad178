// SPDX-License-Identifier: BSD-3-Clause
// The page size and the power-of-two rule that a cache's alignment (mrc_cache_params_t) and a
// get's alignment argument both obey.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pgtable/pgtable.h"

namespace mrc {

inline constexpr uintptr_t kPageSize = uintptr_t{1} << PageTable::kPageShift;

constexpr bool is_power_of_two(size_t value) { return value != 0 && (value & (value - 1)) == 0; }

}  // namespace mrc
