// SPDX-License-Identifier: BSD-3-Clause
// The bitmaps of the root: the page bitmap of the window (which 2 MiB pages belong to a
// segment; first fit) and the bitmap of client slots in each directory entry.
//
// SYNCHRONIZATION: see layout.h. Shared memory, read and written under the domain lock.
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"
#include "core/segment/internal/validate.h"

namespace mrc::seg {

bool page_used(const RootHeader *root, uint64_t i) {
  if (i >= kMaxVaPages) return false;
  return (root->va_bitmap[i / 64] >> (i % 64) & 1U) != 0;
}
void mark_pages(RootHeader *root, uint64_t window_pages, uint64_t first, uint64_t count,
                bool used) {
  if (window_pages > kMaxVaPages || first > window_pages || count > window_pages - first) return;
  for (uint64_t i = first; i < first + count; ++i) {
    if (used) {
      root->va_bitmap[i / 64] |= uint64_t{1} << (i % 64);
    } else {
      root->va_bitmap[i / 64] &= ~(uint64_t{1} << (i % 64));
    }
  }
}
uint64_t find_pages(const mrc_seg_domain *d, const RootHeader *root, uint64_t count) {
  const uint64_t window_pages = d->va_pages;
  if (window_pages > kMaxVaPages || count == 0) return ~uint64_t{0};
  std::vector<uint64_t> used(root->va_bitmap, root->va_bitmap + (window_pages + 63) / 64);
  const auto mark = [&](uint64_t first, uint64_t pages) {
    for (uint64_t i = first; i < first + pages && i < window_pages; ++i) {
      used[i / 64] |= uint64_t{1} << (i % 64);
    }
  };
  const WindowLimits window{window_pages, 0};
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    SegEntry e;
    std::memcpy(static_cast<void *>(&e), &root->segments[i], sizeof e);
    if (e.state == kEntryFree) continue;
    if (check_entry_range(e, i, window) == MRC_OK) {
      mark(e.va_offset / kVaPageSize, e.va_pages);
    } else {
      clear_error();  // an entry no one can map holds no pages; check reports it
    }
  }
  for (const MappedSegment *m = d->maps; m != nullptr; m = m->next) {
    const auto start = reinterpret_cast<uintptr_t>(m->start);
    if (start < d->base || m->va_len == 0) continue;  // a memfd segment lives outside the window
    mark((start - d->base) / kVaPageSize, (m->va_len + kVaPageSize - 1) / kVaPageSize);
  }
  uint64_t run = 0;
  for (uint64_t i = 0; i < window_pages; ++i) {
    if (i % 64 == 0 && used[i / 64] == ~uint64_t{0} && i + 64 <= window_pages) {
      run = 0;
      i += 63;
      continue;
    }
    if ((used[i / 64] >> (i % 64) & 1U) != 0) {
      run = 0;
    } else if (++run == count) {
      return i + 1 - count;
    }
  }
  return ~uint64_t{0};
}

bool has_clients(const SegEntry &e) {
  for (uint64_t word : e.clients) {
    if (word != 0) return true;
  }
  return false;
}
unsigned count_clients(const SegEntry &e) {
  unsigned n = 0;
  for (uint64_t word : e.clients) n += static_cast<unsigned>(__builtin_popcountll(word));
  return n;
}
bool client_bit(const SegEntry &e, unsigned slot) {
  return (e.clients[slot / 64] >> (slot % 64) & 1U) != 0;
}
void set_client_bit(SegEntry &e, unsigned slot, bool on) {
  if (on) {
    e.clients[slot / 64] |= uint64_t{1} << (slot % 64);
  } else {
    e.clients[slot / 64] &= ~(uint64_t{1} << (slot % 64));
  }
}

}  // namespace mrc::seg
