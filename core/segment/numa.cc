// SPDX-License-Identifier: BSD-3-Clause
// NUMA placement of segments: whether a node is there, and binding a range to it before
// anything touches its pages. No shared state.
#include <numa.h>
#include <numaif.h>

#include <cerrno>

#include "core/segment/domain.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {

mrc_status_t numa_check_node(int node) noexcept {
  if (numa_available() < 0) {
    return fail(MRC_ERR_UNSUPPORTED, "NUMA is not available here (libnuma: numa_available < 0)");
  }
  const int max_node = numa_max_node();
  if (node < 0 || node > max_node || node >= 1024 ||
      numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node)) == 0) {
    return fail(MRC_ERR_NOT_FOUND, "NUMA node {} is not there (nodes 0..{} on this machine)", node,
                max_node);
  }
  return MRC_OK;
}

mrc_status_t numa_bind(void *addr, size_t len, int node) noexcept {
  constexpr unsigned long kBits = 1024;
  unsigned long mask[kBits / 64] = {};
  mask[static_cast<unsigned>(node) / 64] = 1UL << (static_cast<unsigned>(node) % 64);
  // mbind reads maxnode - 1 bits (a historical off-by-one).
  if (mbind(addr, len, MPOL_BIND, mask, kBits + 1, 0) != 0) {
    return fail(MRC_ERR_IO, "mbind to NUMA node {}: {}", node, errno_text(errno));
  }
  int mode = -1;
  unsigned long got[kBits / 64] = {};
  if (get_mempolicy(&mode, got, kBits, addr, MPOL_F_ADDR) != 0) {
    return fail(MRC_ERR_IO, "get_mempolicy: {}", errno_text(errno));
  }
  for (unsigned i = 0; i < kBits / 64; ++i) {
    if (got[i] != mask[i] || mode != MPOL_BIND) {
      return fail(MRC_ERR_IO, "NUMA policy did not stick (mode {}): node {} refused", mode, node);
    }
  }
  return MRC_OK;
}

}  // namespace mrc::seg
