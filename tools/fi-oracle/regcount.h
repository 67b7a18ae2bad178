// SPDX-License-Identifier: BSD-3-Clause
// How many memory registrations this process made: the oracle's own definitions of
// ibv_reg_mr and ibv_reg_mr_iova2 (exported from the executable, so they come first in the
// global scope where libfabric's verbs provider looks them up) count each call, then pass it on
// to libibverbs. A cache hit registers nothing: a message that took no registration was served
// by the cache, which is how the control scenario proves the cache is in use.
#pragma once

#include <cstdint>

namespace fi_oracle {

uint64_t registrations();

}  // namespace fi_oracle
