// SPDX-License-Identifier: BSD-3-Clause
// The heap inside a MRC_SEG_HEAP segment: first fit over one free list, usable from every process
// that maps the segment (at any address: it stores offsets from the data start, never pointers).
//
// SYNCHRONIZATION: every field of HeapHeader and every block header is read and written only
// under HeapHeader::lock (robust, process-shared). Callers: any thread of any process with the
// segment mapped. Blocking: alloc and free wait for the lock (bounded by a deadline; a live
// owner is never forced out). No lock-free reads.
//
// CRASH CONSISTENCY: a block is [size|used:8][prev_units:4][check:4][payload]. The chain of
// `size|used` words from offset 0 is the only authoritative state: each change to it is one
// aligned 8-byte store, and compiler fences keep the stores in program order, so at any
// instruction where a process can die the chain still tiles the heap exactly (a split first
// writes the tail's header inside the block, then shrinks the block in one store; a merge grows
// the surviving block in one store). Free-list links, prev_units and the counters are derived:
// the next locker after EOWNERDEAD rebuilds them by walking the chain, merging free
// neighbours. Blocks a dead process had allocated stay allocated (other processes may hold
// pointers to them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/segment/layout.h"
#include "mrcache/mrcache.h"

namespace mrc::seg {

// The block format (heap.cc; validate.cc checks headers against it).
inline constexpr uint64_t kHeapNil = ~uint64_t{0};  // no block (an empty free list)
inline constexpr uint64_t kHeapGrain = 16;          // offsets and sizes are multiples of this
inline constexpr uint64_t kHeapMinBlock = 32;       // header + the two free-list links

class SharedHeap {
 public:
  // The largest heap: prev_units is 32 bits of 16-byte units.
  static constexpr uint64_t kMaxHeapSize = (uint64_t{1} << 36) - 16;

  // data_size: the usable bytes as this process mapped them (never read from the header): no
  // access of the heap goes past them, whatever the shared header says.
  SharedHeap(HeapHeader *header, char *data, uint64_t data_size) noexcept
      : header_(header), data_(data), data_size_(data_size) {}

  // REQUIRES: nobody else can see `header` yet (the segment is being created).
  [[nodiscard]] static mrc_status_t init(HeapHeader *header, char *data,
                                         uint64_t data_size) noexcept;

  void *alloc(size_t size, size_t align) noexcept;
  // false (and the reason in the last error) when ptr is not a live block of this heap.
  bool free(void *ptr) noexcept;
  // Lock (recovering a dead owner's lock), verify, fill stats (may be NULL). Every value of the
  // shared header and of the blocks is checked before use (internal/validate.h): a bad one is
  // MRC_ERR_IO and nothing outside [data, data + data_size) is read or written.
  [[nodiscard]] mrc_status_t check(mrc_seg_heap_stats_t *stats) noexcept;
  // Lock and unlock only: recovers the lock if its owner died. true when a repair ran.
  [[nodiscard]] mrc_status_t recover(bool *repaired) noexcept;

  // For tests: the lock held, no change made (so a test can die holding it).
  [[nodiscard]] mrc_status_t lock_for_test() noexcept { return lock(nullptr); }
  void unlock_for_test() noexcept { unlock(); }

 private:
  [[nodiscard]] mrc_status_t lock(bool *repaired) noexcept;
  void unlock() noexcept;
  void repair_locked() noexcept;
  mrc_status_t verify_locked(mrc_seg_heap_stats_t *stats) noexcept;

  HeapHeader *header_;
  char *data_;
  uint64_t data_size_;
};

}  // namespace mrc::seg
