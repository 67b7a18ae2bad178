// SPDX-License-Identifier: BSD-3-Clause
// Checks of the values read from shared memory: a directory entry, a client slot, a segment
// header, a heap header. Everything in /dev/shm (and every memfd a peer sends) is input that any
// process of the domain's uid, or a hostile peer, may have scribbled over at any time, so no
// value read from it is used before it passed one of these (docs/DESIGN.md, "Shared segments:
// shared memory is input").
//
// Pure functions: they read only their arguments (callers pass a copy taken from shared memory,
// so that the value checked is the value used), keep no state, and on a bad value return
// MRC_ERR_IO with the structure and the field named in the last error (sys.h). A fuzzer may call
// them on arbitrary bytes.
//
// SYNCHRONIZATION: none (no shared state). CRASH CONSISTENCY: not applicable (they change
// nothing).
#pragma once

#include <cstdint>

#include "core/segment/layout.h"
#include "mrcache/mrcache.h"

namespace mrc::seg {

// The window as this process validated it when it joined (process-local, never re-read).
struct WindowLimits {
  uint64_t pages;            // 2 MiB pages in the window, 1..kMaxVaPages
  uint64_t next_generation;  // generations below this one may exist; 0: do not check
};

// The geometry of an entry: va_offset aligned, [va_offset, +va_pages) inside the window, and
// va_pages exactly what data_offset + data_size need (no entry claims more than it maps).
[[nodiscard]] mrc_status_t check_entry_range(const SegEntry &e, unsigned index,
                                             const WindowLimits &w) noexcept;

// Everything a process maps or prints from a live (creating, ready or deleting) entry: its state,
// flags, name, generation, geometry (check_entry_range), map_size, data_offset and data_size as
// create_locked lays them out, numa_node, creator_slot and backing_path.
[[nodiscard]] mrc_status_t check_entry(const SegEntry &e, unsigned index,
                                       const WindowLimits &w) noexcept;

// A client slot: free (all zero state) or active; anything else is garbage that scan reaps.
[[nodiscard]] bool slot_state_known(uint32_t state) noexcept;
[[nodiscard]] mrc_status_t check_client_slot(const ClientSlot &c, unsigned slot) noexcept;

// The header page of a named segment mapped at `base`, against its (checked) entry.
[[nodiscard]] mrc_status_t check_segment_header(const SegHeader &h, const SegEntry &e,
                                                uint64_t domain_id, uint64_t base) noexcept;

// The header of a memfd segment of map_size bytes mapped at `base` whose header occupies
// header_size bytes (a page of the memfd's page size).
[[nodiscard]] mrc_status_t check_memfd_header(const SegHeader &h, uint64_t base, uint64_t map_size,
                                              uint64_t header_size) noexcept;

// The heap of a segment whose usable bytes are data_size (process-local, from the mapping):
// heap_size is the size init gives such a heap, free_head is none or a possible block inside it,
// state is known, the counters fit the heap.
[[nodiscard]] uint64_t heap_size_for(uint64_t data_size) noexcept;
[[nodiscard]] mrc_status_t check_heap_header(const HeapHeader &h, uint64_t data_size) noexcept;

}  // namespace mrc::seg
