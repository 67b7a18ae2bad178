// SPDX-License-Identifier: BSD-3-Clause
// The library's one shape of the radix page table: PageTable's, the one the cache uses (pgtable.h
// declares it extern). The tests and the benchmark instantiate the other shapes they compare from
// the same definitions (definitions.h).
#include "pgtable/definitions.h"

namespace mrc::detail {

template class RadixPageTable<7, 4>;

}  // namespace mrc::detail
