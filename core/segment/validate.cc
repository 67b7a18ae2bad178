// SPDX-License-Identifier: BSD-3-Clause
// Checks of values read from shared memory (internal/validate.h). SYNCHRONIZATION: none; pure
// functions.
#include "core/segment/internal/validate.h"

#include <cstring>

#include "core/segment/heap.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {

namespace {

constexpr uint64_t kPage = 4096;
constexpr unsigned kEntryKinds = MRC_SEG_HEAP | MRC_SEG_NODATA | MRC_SEG_FILE;

// A name field of `size` bytes: NUL-terminated inside the field, and a valid name.
bool name_field_ok(const char *field, size_t size) noexcept {
  return std::memchr(field, '\0', size) != nullptr && valid_name(field);
}

}  // namespace

mrc_status_t check_entry_range(const SegEntry &e, unsigned index, const WindowLimits &w) noexcept {
  if (e.va_offset % kVaPageSize != 0) {
    return fail(MRC_ERR_IO, "directory entry {}: va_offset {:#x} is not a multiple of 2 MiB", index,
                e.va_offset);
  }
  const uint64_t first = e.va_offset / kVaPageSize;
  if (e.va_pages == 0 || e.va_pages > w.pages || first > w.pages - e.va_pages) {
    return fail(MRC_ERR_IO,
                "directory entry {}: va_offset {:#x} and va_pages {} leave the window of {} pages",
                index, e.va_offset, e.va_pages, w.pages);
  }
  // Both below the window's size (at most 512 GiB): no overflow in the sum.
  const uint64_t limit = e.va_pages * kVaPageSize;
  if (e.data_offset > limit || e.data_size > limit - e.data_offset) {
    return fail(MRC_ERR_IO, "directory entry {}: data_offset {} + data_size {} exceed its {} pages",
                index, e.data_offset, e.data_size, e.va_pages);
  }
  const uint64_t need = (e.data_offset + e.data_size + kVaPageSize - 1) / kVaPageSize;
  if (e.va_pages != need) {
    return fail(MRC_ERR_IO, "directory entry {}: va_pages {}, its data needs {}", index, e.va_pages,
                need);
  }
  return MRC_OK;
}

mrc_status_t check_entry(const SegEntry &e, unsigned index, const WindowLimits &w) noexcept {
  if (e.state != kEntryCreating && e.state != kEntryReady && e.state != kEntryDeleting) {
    return fail(MRC_ERR_IO, "directory entry {}: unknown state {}", index, e.state);
  }
  if (!name_field_ok(e.name, sizeof e.name)) {
    return fail(MRC_ERR_IO, "directory entry {}: name is not a segment name", index);
  }
  if ((e.flags & ~kEntryKinds) != 0 ||
      ((e.flags & MRC_SEG_NODATA) != 0 && (e.flags & (MRC_SEG_HEAP | MRC_SEG_FILE)) != 0)) {
    return fail(MRC_ERR_IO, "directory entry {} ({}): flags {:#x} are not a segment kind", index,
                e.name, e.flags);
  }
  if (e.generation == 0 || (w.next_generation != 0 && e.generation >= w.next_generation)) {
    return fail(MRC_ERR_IO, "directory entry {} ({}): generation {} was never handed out", index,
                e.name, e.generation);
  }
  const mrc_status_t st = check_entry_range(e, index, w);
  if (st != MRC_OK) return st;
  // The layout create_locked (named.cc) gives each kind.
  bool layout_ok = e.data_size != 0 && e.data_size % kPage == 0;
  if ((e.flags & MRC_SEG_NODATA) != 0) {
    layout_ok = layout_ok && e.map_size == 0 && e.data_offset == 0;
  } else if ((e.flags & MRC_SEG_FILE) != 0) {
    layout_ok = layout_ok && e.map_size == kSegHeaderSize &&
                (e.data_offset == kSegHeaderSize || e.data_offset == kVaPageSize);
  } else {
    layout_ok =
        layout_ok && e.data_offset == kSegHeaderSize && e.map_size == kSegHeaderSize + e.data_size;
  }
  if (!layout_ok) {
    return fail(MRC_ERR_IO,
                "directory entry {} ({}): map_size {}, data_offset {}, data_size {} are not the "
                "layout of its kind",
                index, e.name, e.map_size, e.data_offset, e.data_size);
  }
  if ((e.flags & MRC_SEG_HEAP) != 0 && e.data_size > SharedHeap::kMaxHeapSize) {
    return fail(MRC_ERR_IO, "directory entry {} ({}): data_size {} exceeds any heap", index, e.name,
                e.data_size);
  }
  if (e.numa_node < -1) {
    return fail(MRC_ERR_IO, "directory entry {} ({}): numa_node {}", index, e.name, e.numa_node);
  }
  if (e.creator_slot >= kMaxClients) {
    return fail(MRC_ERR_IO, "directory entry {} ({}): creator_slot {}", index, e.name,
                e.creator_slot);
  }
  const bool path_terminated = std::memchr(e.backing_path, '\0', sizeof e.backing_path) != nullptr;
  const bool path_ok = (e.flags & MRC_SEG_FILE) != 0 ? path_terminated && e.backing_path[0] == '/'
                                                     : e.backing_path[0] == '\0';
  if (!path_ok) {
    return fail(MRC_ERR_IO, "directory entry {} ({}): backing_path is not {}", index, e.name,
                (e.flags & MRC_SEG_FILE) != 0 ? "an absolute path" : "empty");
  }
  return MRC_OK;
}

bool slot_state_known(uint32_t state) noexcept {
  return state == kSlotFree || state == kSlotActive;
}

mrc_status_t check_client_slot(const ClientSlot &c, unsigned slot) noexcept {
  if (!slot_state_known(c.state)) {
    return fail(MRC_ERR_IO, "client slot {}: state {} is neither free nor active", slot, c.state);
  }
  return MRC_OK;
}

mrc_status_t check_segment_header(const SegHeader &h, const SegEntry &e, uint64_t domain_id,
                                  uint64_t base) noexcept {
  const char *field = nullptr;
  if (h.magic != kSegMagic) {
    field = "magic";
  } else if (h.layout_version != kLayoutVersion) {
    field = "layout_version";
  } else if (h.flags != e.flags) {
    field = "flags";
  } else if (h.domain_id != domain_id) {
    field = "domain_id";
  } else if (h.generation != e.generation) {
    field = "generation";
  } else if (h.base != base) {
    field = "base";
  } else if (h.map_size != e.map_size) {
    field = "map_size";
  } else if (h.data_offset != e.data_offset) {
    field = "data_offset";
  } else if (h.data_size != e.data_size) {
    field = "data_size";
  } else if (std::strncmp(h.name, e.name, sizeof h.name) != 0) {
    field = "name";
  }
  if (field != nullptr) {
    return fail(MRC_ERR_IO, "segment {}: header field {} does not match its directory entry",
                e.name, field);
  }
  return MRC_OK;
}

mrc_status_t check_memfd_header(const SegHeader &h, uint64_t base, uint64_t map_size,
                                uint64_t header_size) noexcept {
  const char *field = nullptr;
  if (h.magic != kSegMagic) {
    field = "magic";
  } else if (h.layout_version != kLayoutVersion) {
    field = "layout_version";
  } else if (h.base != base) {
    field = "base";
  } else if (h.map_size != map_size) {
    field = "map_size";
  } else if (h.data_offset != header_size || map_size <= header_size) {
    field = "data_offset";
  } else if (h.data_size != map_size - header_size) {
    field = "data_size";
  } else if (!name_field_ok(h.name, sizeof h.name)) {
    field = "name";
  } else if ((h.flags & ~static_cast<unsigned>(MRC_SEG_HEAP | MRC_SEG_HUGETLB)) != 0) {
    field = "flags";
  } else if (h.numa_node < -1) {
    field = "numa_node";
  } else if ((h.flags & MRC_SEG_HEAP) != 0 && h.data_size > SharedHeap::kMaxHeapSize) {
    field = "data_size";
  }
  if (field != nullptr) {
    return fail(MRC_ERR_IO, "memfd segment header: field {} is not sane", field);
  }
  return MRC_OK;
}

uint64_t heap_size_for(uint64_t data_size) noexcept {
  const uint64_t size = data_size & ~(kHeapGrain - 1);
  return size > SharedHeap::kMaxHeapSize ? SharedHeap::kMaxHeapSize : size;
}

mrc_status_t check_heap_header(const HeapHeader &h, uint64_t data_size) noexcept {
  const uint64_t size = heap_size_for(data_size);
  if (h.heap_size != size || size < kHeapMinBlock) {
    return fail(MRC_ERR_IO, "heap header: heap_size {} (the segment's data holds {})", h.heap_size,
                size);
  }
  if (h.free_head != kHeapNil && (h.free_head % kHeapGrain != 0 || h.free_head >= size ||
                                  size - h.free_head < kHeapMinBlock)) {
    return fail(MRC_ERR_IO, "heap header: free_head {} is not a block of the heap", h.free_head);
  }
  if (h.state != kHeapOk && h.state != kHeapCorrupt) {
    return fail(MRC_ERR_IO, "heap header: unknown state {}", h.state);
  }
  const uint64_t max_blocks = size / kHeapMinBlock;
  if (h.used_blocks > max_blocks || h.free_blocks > max_blocks || h.bytes_used > size) {
    return fail(MRC_ERR_IO,
                "heap header: counters used_blocks {}, free_blocks {}, bytes_used {} exceed a "
                "heap of {} bytes",
                h.used_blocks, h.free_blocks, h.bytes_used, size);
  }
  return MRC_OK;
}

}  // namespace mrc::seg
