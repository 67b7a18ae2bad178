// SPDX-License-Identifier: BSD-3-Clause
// The kernel's facts about one mapping (VMA) of this process: PROCMAP_QUERY on an open
// /proc/self/maps (Linux 6.11+), else a parse of /proc/self/maps.
//
// SYNCHRONIZATION: any thread, any time; a few descriptors are kept open and shared (proc_maps.cc
// says how). Across fork they are guarded by atfork handlers that this file registers: a
// component whose own atfork handlers take a lock under which it queries mappings calls
// register_maps_fork_handlers() before it registers its own (docs/DESIGN.md, "Fork handlers").
#pragma once

#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::os {

struct Vma {
  uintptr_t start, end;
  unsigned prot;  // PROT_*
  bool shared;
  uint64_t inode;
  bool sysv_shm;
  // The page size of the mapping (huge for hugetlbfs; the base page size when only
  // /proc/self/maps could be read), and whether it is private anonymous memory.
  size_t page_size;
  bool anonymous;
};

// The mapping that contains `address`: MRC_OK, MRC_ERR_NOT_FOUND (not mapped) or MRC_ERR_IO.
[[nodiscard]] mrc_status_t query_vma(uintptr_t address, Vma *out) noexcept;
// The mapping that contains `address` or else the first one above it.
[[nodiscard]] mrc_status_t query_vma_from(uintptr_t address, Vma *out) noexcept;

// Where the process's brk heap starts (start_brk, /proc/self/stat), 0 when it cannot be read.
// The heap ends at the current break (brk(0)); it starts at start_brk and grows up from there.
[[nodiscard]] uintptr_t brk_heap_start() noexcept;

// Closes the kept descriptors (a later query opens one again): when the last user leaves.
void close_maps_descriptors() noexcept;
// Registers (once) the atfork handlers that hold the descriptors across fork and close them in
// the child, whose inherited /proc/self/maps would still describe the parent.
void register_maps_fork_handlers() noexcept;

}  // namespace mrc::os
