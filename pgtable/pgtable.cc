// The radix page table's writer side, instantiated for the shapes pgtable.h lists; the shape and
// the contract are in pgtable.h, the definitions in pgtable_impl.h (one part per mechanism).
#include "pgtable/pgtable_impl.h"

namespace mrc::detail {

#define MRC_PGTABLE_INSTANTIATE(inner, leaf) template class RadixPageTable<inner, leaf>;
MRC_PGTABLE_SHAPES(MRC_PGTABLE_INSTANTIATE)
#undef MRC_PGTABLE_INSTANTIATE

}  // namespace mrc::detail
