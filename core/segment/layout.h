// SPDX-License-Identifier: BSD-3-Clause
// The shared-memory layout of a segment domain: the root header (/dev/shm/<prefix>:root) and the
// header page at the start of every segment. Every process of the domain maps these, so they
// hold offsets and sizes, never pointers. Why the rules below hold: docs/DESIGN.md,
// "Locks and crash consistency".
//
// SYNCHRONIZATION (the contract every function in core/segment/ keeps)
//   1. RootHeader fields above `lock`: written once by the creator before it publishes `ready`
//      (store-release); joiners read them only after loading `ready` (load-acquire), never write.
//   2. Everything below `lock` (directory, client slots, page bitmap, counters) is read and
//      written only under `lock`, a robust process-shared mutex; mrc_seg_domain_describe alone
//      copies it without the lock, as a snapshot it only prints.
//   3. A client slot is alive while its OFD lock on byte kPresenceLockOffset + slot of the root
//      file is held, never judged by pid; the creator holds kCreatorLockOffset until `ready`.
//   4. SegHeader fields above `heap`: written by the creator under the domain lock before the
//      entry turns kEntryReady; joiners read them after finding the entry ready under that lock.
//   5. HeapHeader is guarded by HeapHeader::lock (heap.h).
//
// CRASH CONSISTENCY (any process may die at any instruction, also holding a lock)
//   1. The next locker gets EOWNERDEAD and repairs before pthread_mutex_consistent().
//   2. Every multi-step change of the domain first records its intent in the entry's `state`:
//      repair rolls kEntryCreating back and kEntryDeleting forward, and recomputes the page
//      bitmap and the counters from the directory.
//   3. A heap is repaired from its chain of block sizes (heap.h).
//   4. Repair is idempotent: a repairer that dies is repaired by the next locker.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mrc::seg {

inline constexpr uint64_t kRootMagic = 0x314e4d4f44435252ULL;  // "RRCDOMN1"
inline constexpr uint64_t kSegMagic = 0x3154474553435252ULL;   // "RRCSEGT1"
inline constexpr uint32_t kLayoutVersion = 2;                  // 2: SegEntry::file_tag
inline constexpr uint32_t kReadyWord = 0x59445259;             // "YRDY": the root is initialised

inline constexpr unsigned kMaxClients = 512;
inline constexpr unsigned kMaxSegments = 256;
inline constexpr size_t kNameMax = 63;        // segment names and prefixes
inline constexpr size_t kPathMax = 255;       // backing files
inline constexpr unsigned kVaPageShift = 21;  // the window's page bitmap works in 2 MiB pages
inline constexpr uint64_t kVaPageSize = uint64_t{1} << kVaPageShift;
inline constexpr uint64_t kMaxVaPages = uint64_t{1} << 18;  // a window of at most 512 GiB
inline constexpr size_t kSegHeaderSize = 4096;              // the header page of a segment

// Byte offsets of the OFD locks in the root file (beyond its end: locks need no data there).
inline constexpr off_t kCreatorLockOffset = off_t{1} << 30;
inline constexpr off_t kPresenceLockOffset = kCreatorLockOffset + 1;

enum : uint32_t { kDomainLive = 0, kDomainDead = 1 };
enum : uint32_t { kSlotFree = 0, kSlotActive = 1 };
enum : uint32_t { kEntryFree = 0, kEntryCreating = 1, kEntryReady = 2, kEntryDeleting = 3 };

struct ClientSlot {
  uint32_t state;  // kSlotFree / kSlotActive
  int32_t pid;     // for display only: liveness is the presence lock
  uint32_t uid;
  uint32_t reserved;
  uint64_t serial;          // domain-wide attach counter, for display
  uint64_t attach_time_ns;  // CLOCK_REALTIME
  char comm[16];
  uint8_t pad[16];
};
static_assert(sizeof(ClientSlot) == 64);

struct SegEntry {
  uint32_t state;       // kEntry*
  uint32_t flags;       // MRC_SEG_HEAP | MRC_SEG_NODATA | MRC_SEG_FILE
  uint64_t generation;  // names the file; never reused within the domain
  uint64_t va_offset;   // from the window base, a multiple of kVaPageSize
  uint64_t va_pages;
  uint64_t map_size;     // bytes of the /dev/shm file (header page + data, or header page only)
  uint64_t data_offset;  // from the segment's start address to the usable bytes
  uint64_t data_size;    // usable bytes
  int32_t numa_node;     // -1: none
  uint32_t creator_slot;
  uint64_t created_ns;
  uint64_t backing_dev, backing_ino;  // MRC_SEG_FILE: the identity joiners must find
  uint64_t file_tag;  // random (getrandom), part of the file name: no other user can guess it
  char name[kNameMax + 1];
  uint64_t clients[kMaxClients / 64];  // bit i: client slot i has the segment open
  char backing_path[kPathMax + 1];
};

struct RootHeader {
  // Immutable once `ready` is published.
  uint64_t magic;
  uint32_t layout_version;
  std::atomic<uint32_t> ready;  // kReadyWord: store-release by the creator, load-acquire by joiners
  uint64_t domain_id;           // random
  uint64_t base;                // the window
  uint64_t size;
  uint32_t va_page_shift;
  uint32_t va_pages;
  uint32_t uid, gid, mode;
  uint32_t root_size;
  uint64_t created_ns;
  char prefix[kNameMax + 1];

  alignas(64) pthread_mutex_t lock;  // robust, process-shared; never re-initialised

  // Guarded by `lock`.
  alignas(64) uint32_t state;  // kDomainLive / kDomainDead (torn down: joiners start over)
  uint32_t reserved;
  uint64_t next_generation;
  uint64_t next_serial;
  uint64_t repairs;
  uint64_t clients_reaped;
  uint64_t segments_reaped;
  ClientSlot clients[kMaxClients];
  SegEntry segments[kMaxSegments];
  uint64_t va_bitmap[kMaxVaPages / 64];
};
static_assert(std::is_standard_layout_v<RootHeader>);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// The size of the root file: fixed by the layout, so a joiner can tell a half-created root (size
// 0: the creator has not truncated it yet) from one of another layout (any other size).
inline constexpr size_t kRootSize = (sizeof(RootHeader) + 4095) & ~size_t{4095};

enum : uint32_t { kHeapOk = 0, kHeapCorrupt = 1 };

struct HeapHeader {
  alignas(64) pthread_mutex_t lock;  // robust, process-shared; never re-initialised
  // Guarded by `lock`. Offsets are from the first byte of the segment's data.
  uint64_t heap_size;  // bytes managed: the data rounded down to 16
  uint64_t free_head;  // first free block, kNil when none
  uint64_t bytes_used, used_blocks, free_blocks;
  uint64_t allocs, frees, repairs;
  uint32_t state;  // kHeapOk / kHeapCorrupt (a walk found a broken chain: refuse to allocate)
  uint32_t reserved;
};

struct SegHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t flags;
  uint64_t domain_id;  // 0 for memfd segments
  uint64_t generation;
  uint64_t base;      // the address the segment is mapped at in every process
  uint64_t map_size;  // bytes mapped
  uint64_t data_offset;
  uint64_t data_size;
  char name[kNameMax + 1];
  int32_t numa_node;
  uint32_t reserved;
  HeapHeader heap;
};
static_assert(sizeof(SegHeader) <= kSegHeaderSize);
static_assert(std::is_standard_layout_v<SegHeader>);

}  // namespace mrc::seg
