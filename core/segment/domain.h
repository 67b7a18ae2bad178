// SPDX-License-Identifier: BSD-3-Clause
// Process-local objects behind the mrc_seg_* handles, and the internal calls between the files
// of core/segment/.
//
// SYNCHRONIZATION
//  - g_registry (registry.cc) lists the domains this process has joined, one per prefix; guarded
//    by a process-local mutex, which domain open/close hold throughout (so two threads never
//    race to reserve the same window) and which fork() holds (pthread_atfork), so a child
//    sees a consistent list and closes its copies of the presence descriptors. fork() holds
//    each listed domain's mu too (after the registry mutex: the lock order below), so that the
//    child can close the segments it inherited (registry.cc, close_inherited).
//  - mrc_seg_domain::mu (process-local) guards refs, open_segments and the mappings list, and
//    serialises this process's segment open/close (a close re-reserves the range before another
//    thread can map something there). Lock order: registry mutex, then mu, then the shared
//    domain lock (RootHeader::lock), then a heap lock. Nothing takes them in another order.
//  - mrc_seg::registration_mu guards the registration fields of one handle.
//  - Immutable after open: every other field of mrc_seg_domain, MappedSegment and mrc_seg.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "core/segment/layout.h"
#include "mrcache/mrcache.h"

struct mrc_seg_domain;

namespace mrc::seg {

// One segment as this process maps it; shared by every handle of this process on it. (Not the
// OS's view of a mapping: that is mrc::os::Vma in base/proc_maps.h.)
struct MappedSegment {
  MappedSegment *next = nullptr;
  int refs = 0;        // handles (guarded by the domain's mu; 1 for memfd segments)
  uint32_t entry = 0;  // directory index (named segments)
  uint64_t generation = 0;
  char name[kNameMax + 1] = {};
  char *start = nullptr;  // what the segment owns: [start, start + va_len)
  size_t va_len = 0;
  size_t map_size = 0;   // bytes mapped from the /dev/shm file or the memfd
  char *data = nullptr;  // the usable bytes
  size_t data_size = 0;
  unsigned flags = 0;
  int numa_node = -1;
  SegHeader *header = nullptr;  // nullptr for MRC_SEG_NODATA
  int memfd = -1;               // memfd segments only
};

}  // namespace mrc::seg

struct mrc_seg_domain {
  pthread_mutex_t mu;
  mrc_seg_domain *next = nullptr;  // registry link
  int refs = 0;
  int open_segments = 0;
  pid_t pid = 0;
  bool observer = false;
  bool created = false;
  bool forked = false;  // a fork() child's copy: unusable there
  int fd = -1;          // the root file (its OFD carries our presence lock)
  mrc::seg::RootHeader *root = nullptr;
  uintptr_t base = 0;  // the window, reserved in this process unless observer
  size_t size = 0;
  // The window's pages as validated at join (observers too): the bound of every page index,
  // never re-read from the root, where any member could change it.
  uint64_t va_pages = 0;
  int slot = -1;
  uint64_t domain_id = 0;
  char prefix[mrc::seg::kNameMax + 1] = {};
  char root_name[160] = {};
  uid_t uid = 0;
  gid_t gid = 0;
  unsigned mode = 0600;
  unsigned timeout_ms = 0;
  unsigned files_unlinked = 0;  // by this process (guarded by the domain lock)
  mrc::seg::MappedSegment *maps = nullptr;
};

struct mrc_seg {
  mrc_seg_domain *domain = nullptr;  // nullptr for memfd segments
  mrc::seg::MappedSegment *map = nullptr;
  bool created = false;
  pthread_mutex_t registration_mu = PTHREAD_MUTEX_INITIALIZER;
  mrc_cache_t *cache = nullptr;    // set by mrc_seg_register (register.cc)
  mrc_region_t *region = nullptr;  // the segment's own reference
  uint64_t key = 0;
  void (*release_registration)(mrc_seg *) = nullptr;  // register.cc's mrc_put, when registered
};

namespace mrc::seg {

// named.cc
[[nodiscard]] mrc_status_t segment_open(mrc_seg_domain *domain, const mrc_seg_params_t *params,
                                        mrc_seg **out) noexcept;
[[nodiscard]] mrc_status_t segment_close(mrc_seg *seg) noexcept;

// directory.cc: the shared domain lock, recovering it (repair) when its owner died.
[[nodiscard]] mrc_status_t lock_domain(mrc_seg_domain *domain, bool *repaired) noexcept;
void unlock_domain(mrc_seg_domain *domain) noexcept;

// registry.cc: false (and the last error set) for a NULL or closed handle, or one of the
// parent of this fork() child.
bool usable_here(const mrc_seg_domain *domain) noexcept;
// registry.cc: true for a domain handle this fork() child inherited from its parent.
bool inherited(const mrc_seg_domain *domain);
// registry.cc: mrc_seg_close of a segment this fork() child inherited: unmapped here (back to the
// inherited reservation), the directory untouched (the parent still has it open).
void close_inherited(mrc_seg *seg) noexcept;
// registry.cc, under domain->mu: the last reference to `map` is gone: its range goes back to the
// reservation (unmapped when the kernel has no VMA for that: a hole in the window is the lesser
// harm than old pages left mapped), it leaves domain->maps and is freed.
void unmap_segment_locked(mrc_seg_domain *domain, MappedSegment *map) noexcept;

// files.cc: re-reserves [start, start+len) as PROT_NONE in place of whatever this process mapped
// there (its own segment): the munmap the cache's monitor sees.
[[nodiscard]] bool reserve_again(void *start, size_t len) noexcept;

// numa.cc: binds [addr, addr+len) to `node` before anything touches it, then reads the policy
// back. MRC_ERR_UNSUPPORTED without NUMA, MRC_ERR_NOT_FOUND for a node that is not there.
[[nodiscard]] mrc_status_t numa_check_node(int node) noexcept;
[[nodiscard]] mrc_status_t numa_bind(void *addr, size_t len, int node) noexcept;

// memfd.cc
void memfd_close(MappedSegment *map) noexcept;

}  // namespace mrc::seg
