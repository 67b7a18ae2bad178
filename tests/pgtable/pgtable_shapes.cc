// SPDX-License-Identifier: BSD-3-Clause
// The shapes of the radix page table the tests compare besides PageTable's (which the library
// instantiates): instantiated here from the definitions in pgtable/definitions.h, once for every
// test.
#include "pgtable/definitions.h"

namespace mrc::detail {

template class RadixPageTable<2, 2>;
template class RadixPageTable<4, 4>;
template class RadixPageTable<6, 6>;
template class RadixPageTable<8, 8>;
template class RadixPageTable<6, 4>;
template class RadixPageTable<8, 5>;

}  // namespace mrc::detail
