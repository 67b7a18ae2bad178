// SPDX-License-Identifier: BSD-3-Clause
// The definitions of RadixPageTable's writer side (pgtable.h declares them, and defines the
// readers inline), for the files that instantiate a shape: pgtable.cc, the library's one shape
// (PageTable's); the tests and the benchmark instantiate the others they use themselves:
//
//   #include "pgtable/definitions.h"
//   template class mrc::detail::RadixPageTable<6, 4>;
//
// Private: not for other layers, which use PageTable through pgtable.h. One part per mechanism:
#pragma once

#include "pgtable/internal/nodes.h"  // node allocation, the slot stores, placing (every part uses them)

#include "pgtable/internal/flat_nodes.h"  // flat nodes: a level-1 node and its leaves as one array
#include "pgtable/internal/insert.h"      // insert()
#include "pgtable/internal/kept_nodes.h"  // the hysteresis: nodes a removal leaves in place, settle()
#include "pgtable/internal/remove.h"      // remove()
#include "pgtable/internal/verify.h"      // check_invariants(), for tests
#include "pgtable/internal/windows.h"     // windows: level-1 slots laid out as one array

#undef MRC_TABLE
#undef MRC_SELF
