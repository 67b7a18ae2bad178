// SPDX-License-Identifier: BSD-3-Clause
// The shapes of the radix page table bench_pgtable.cc measures besides PageTable's (which the
// library instantiates): instantiated here from the definitions in pgtable/definitions.h.
#include "pgtable/definitions.h"

namespace mrc::detail {

template class RadixPageTable<4, 4>;
template class RadixPageTable<5, 5>;
template class RadixPageTable<6, 6>;
template class RadixPageTable<8, 8>;
template class RadixPageTable<5, 4>;
template class RadixPageTable<6, 4>;
template class RadixPageTable<6, 5>;
template class RadixPageTable<8, 5>;

}  // namespace mrc::detail
