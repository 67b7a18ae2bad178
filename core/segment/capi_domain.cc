// SPDX-License-Identifier: BSD-3-Clause
// The C API of domains: mrc_seg_domain_params_init, _open, _inspect and _remove (each as *_v2
// and, in the 0.1 layout of mrc_seg_domain_params_t, as *_v0), _close, _scan, _info, _check,
// _repair, and mrc_seg_remove.
//
// SYNCHRONIZATION: see domain.h and layout.h. Each call that reads or changes the root holds
// the shared domain lock (lock_domain) while it does.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <new>

#include "core/segment/heap.h"
#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"

using mrc::seg::fail;

namespace mrc::seg {

// mrc_seg_domain_params_t as 0.1 binaries lay it out: frozen, never edit.
struct DomainParamsV0 {
  const char *prefix;
  uintptr_t base;
  size_t size;
  unsigned mode;
  int uid, gid;
  unsigned join_timeout_ms;
};

namespace {

DomainParamsV0 to_v0(const mrc_seg_domain_params_t &in) {
  return DomainParamsV0{in.prefix, in.base, in.size, in.mode, in.uid, in.gid, in.join_timeout_ms};
}

mrc_seg_domain_params_t from_v0(const DomainParamsV0 &in) {
  mrc_seg_domain_params_t out;
  domain_defaults(&out);
  out.prefix = in.prefix;
  out.base = in.base;
  out.size = in.size;
  out.mode = in.mode;
  out.uid = in.uid;
  out.gid = in.gid;
  out.join_timeout_ms = in.join_timeout_ms;
  return out;
}

}  // namespace
}  // namespace mrc::seg

extern "C" {

// mrc_seg_domain_params_t gained struct_size in 0.2: the functions taking it exist as *_v2
// (name@@MRCACHE_0.2) and as *_v0 (name@MRCACHE_0, the 0.1 layout), as in core/cache/capi.cc.
MRC_API void mrc_seg_domain_params_init_v2(mrc_seg_domain_params_t *params);
MRC_API mrc_status_t mrc_seg_domain_open_v2(const mrc_seg_domain_params_t *params,
                                            mrc_seg_domain_t **out);
MRC_API mrc_status_t mrc_seg_domain_inspect_v2(const mrc_seg_domain_params_t *params,
                                               mrc_seg_domain_t **out);
MRC_API mrc_status_t mrc_seg_domain_remove_v2(const mrc_seg_domain_params_t *params,
                                              unsigned *removed);
MRC_API void mrc_seg_domain_params_init_v0(mrc::seg::DomainParamsV0 *params);
MRC_API mrc_status_t mrc_seg_domain_open_v0(const mrc::seg::DomainParamsV0 *params,
                                            mrc_seg_domain_t **out);
MRC_API mrc_status_t mrc_seg_domain_inspect_v0(const mrc::seg::DomainParamsV0 *params,
                                               mrc_seg_domain_t **out);
MRC_API mrc_status_t mrc_seg_domain_remove_v0(const mrc::seg::DomainParamsV0 *params,
                                              unsigned *removed);
__asm__(".symver mrc_seg_domain_params_init_v2, mrc_seg_domain_params_init@@MRCACHE_0.2");
__asm__(".symver mrc_seg_domain_open_v2, mrc_seg_domain_open@@MRCACHE_0.2");
__asm__(".symver mrc_seg_domain_inspect_v2, mrc_seg_domain_inspect@@MRCACHE_0.2");
__asm__(".symver mrc_seg_domain_remove_v2, mrc_seg_domain_remove@@MRCACHE_0.2");
__asm__(".symver mrc_seg_domain_params_init_v0, mrc_seg_domain_params_init@MRCACHE_0");
__asm__(".symver mrc_seg_domain_open_v0, mrc_seg_domain_open@MRCACHE_0");
__asm__(".symver mrc_seg_domain_inspect_v0, mrc_seg_domain_inspect@MRCACHE_0");
__asm__(".symver mrc_seg_domain_remove_v0, mrc_seg_domain_remove@MRCACHE_0");

void mrc_seg_domain_params_init_v2(mrc_seg_domain_params_t *params) {
  if (params == nullptr) return;
  mrc::seg::domain_defaults(params);
}

mrc_status_t mrc_seg_domain_open_v2(const mrc_seg_domain_params_t *params, mrc_seg_domain_t **out) {
  return mrc::seg::open_domain(params, false, out);
}

mrc_status_t mrc_seg_domain_inspect_v2(const mrc_seg_domain_params_t *params,
                                       mrc_seg_domain_t **out) {
  return mrc::seg::open_domain(params, true, out);
}

void mrc_seg_domain_params_init_v0(mrc::seg::DomainParamsV0 *params) {
  if (params == nullptr) return;
  mrc_seg_domain_params_t current;
  mrc::seg::domain_defaults(&current);
  *params = mrc::seg::to_v0(current);
}

mrc_status_t mrc_seg_domain_open_v0(const mrc::seg::DomainParamsV0 *params,
                                    mrc_seg_domain_t **out) {
  if (params == nullptr) return mrc::seg::open_domain(nullptr, false, out);
  const mrc_seg_domain_params_t current = mrc::seg::from_v0(*params);
  return mrc::seg::open_domain(&current, false, out);
}

mrc_status_t mrc_seg_domain_inspect_v0(const mrc::seg::DomainParamsV0 *params,
                                       mrc_seg_domain_t **out) {
  if (params == nullptr) return mrc::seg::open_domain(nullptr, true, out);
  const mrc_seg_domain_params_t current = mrc::seg::from_v0(*params);
  return mrc::seg::open_domain(&current, true, out);
}

mrc_status_t mrc_seg_domain_remove_v0(const mrc::seg::DomainParamsV0 *params, unsigned *removed) {
  if (params == nullptr) return mrc_seg_domain_remove_v2(nullptr, removed);
  const mrc_seg_domain_params_t current = mrc::seg::from_v0(*params);
  return mrc_seg_domain_remove_v2(&current, removed);
}

mrc_status_t mrc_seg_domain_close(mrc_seg_domain_t *d) {
  mrc::seg::clear_error();
  return mrc::seg::release_domain(d, nullptr);
}

mrc_status_t mrc_seg_domain_scan(mrc_seg_domain_t *d) {
  using namespace mrc::seg;
  clear_error();
  if (!usable_here(d)) return MRC_ERR_INVALID;
  const mrc_status_t st = lock_domain(d, nullptr);
  if (st != MRC_OK) return st;
  reap_dead_locked(d);
  unlock_domain(d);
  return MRC_OK;
}

mrc_status_t mrc_seg_domain_info(mrc_seg_domain_t *d, mrc_seg_domain_info_t *info) {
  using namespace mrc::seg;
  clear_error();
  if (info == nullptr) return fail(MRC_ERR_INVALID, "info is NULL");
  if (!usable_here(d)) return MRC_ERR_INVALID;
  const mrc_status_t st = lock_domain(d, nullptr);
  if (st != MRC_OK) return st;
  const RootHeader *root = d->root;
  *info = mrc_seg_domain_info_t{};
  info->base = root->base;
  info->size = root->size;
  info->va_page_size = kVaPageSize;
  info->pages_total = d->va_pages;
  for (uint64_t i = 0; i < d->va_pages; ++i) info->pages_used += page_used(root, i) ? 1U : 0U;
  info->clients = live_clients_locked(d);
  for (const SegEntry &e : root->segments) info->segments += e.state != kEntryFree ? 1U : 0U;
  info->slot = d->slot;
  info->created = d->created ? 1 : 0;
  info->domain_id = root->domain_id;
  info->repairs = root->repairs;
  info->clients_reaped = root->clients_reaped;
  unlock_domain(d);
  return MRC_OK;
}

mrc_status_t mrc_seg_domain_check(mrc_seg_domain_t *d) {
  using namespace mrc::seg;
  clear_error();
  if (!usable_here(d)) return MRC_ERR_INVALID;
  mrc_status_t st = lock_domain(d, nullptr);
  if (st != MRC_OK) return st;
  const RootHeader *root = d->root;
  auto *expect = new (std::nothrow) uint64_t[kMaxVaPages / 64]();
  if (expect == nullptr) {
    unlock_domain(d);
    return fail(MRC_ERR_NO_MEMORY, "out of memory");
  }
  if (root->state != kDomainLive) st = fail(MRC_ERR_IO, "domain is marked dead");
  for (unsigned s = 0; st == MRC_OK && s < kMaxClients; ++s) {
    st = check_client_slot(root->clients[s], s);
  }
  const WindowLimits limits = window_limits(d);
  for (unsigned i = 0; st == MRC_OK && i < kMaxSegments; ++i) {
    const SegEntry e = root->segments[i];  // checked, then used: a copy (internal/validate.h)
    if (e.state == kEntryFree) continue;
    if (e.state != kEntryReady && e.state <= kEntryDeleting) {
      st = fail(MRC_ERR_IO, "directory entry {} is in state {} outside the lock", i, e.state);
      break;
    }
    st = check_entry(e, i, limits);
    if (st != MRC_OK) break;
    for (unsigned j = 0; j < i; ++j) {
      if (root->segments[j].state == kEntryReady &&
          std::strncmp(root->segments[j].name, e.name, sizeof e.name) == 0) {
        st = fail(MRC_ERR_IO, "segment {} is listed twice", e.name);
      }
    }
    const uint64_t first = e.va_offset / kVaPageSize;
    for (uint64_t p = first; p < first + e.va_pages; ++p) {
      if ((expect[p / 64] >> (p % 64) & 1U) != 0) {
        st = fail(MRC_ERR_IO, "segment {} overlaps another one", e.name);
      }
      expect[p / 64] |= uint64_t{1} << (p % 64);
    }
    for (unsigned s = 0; s < kMaxClients; ++s) {
      if (client_bit(e, s) && root->clients[s].state != kSlotActive) {
        st = fail(MRC_ERR_IO, "segment {} lists free client slot {}", e.name, s);
      }
    }
    if (!has_clients(e)) st = fail(MRC_ERR_IO, "segment {} has no client: leaked", e.name);
    if (st == MRC_OK && (e.flags & MRC_SEG_NODATA) == 0) {
      char name[160];
      (void)entry_file_name(d, e, name);  // the name was checked
      const int fd = shm_open(name, O_RDONLY, 0);
      if (fd < 0) {
        st = fail(MRC_ERR_IO, "segment {}: /dev/shm{} is missing", e.name, name);
      } else {
        st = check_file(fd, name, d->uid, d->gid, d->mode, e.map_size);
        close(fd);
      }
    }
  }
  for (uint64_t w = 0; st == MRC_OK && w < kMaxVaPages / 64; ++w) {
    if (expect[w] != root->va_bitmap[w]) {
      st = fail(MRC_ERR_IO, "page bitmap word {} is {:#x}, the directory says {:#x}", w,
                root->va_bitmap[w], expect[w]);
    }
  }
  delete[] expect;
  if (st == MRC_OK) {
    // The domain's files of this prefix that nobody names: leaks. Another user's files in the
    // name space are not the domain's: skipped (describe lists them).
    DIR *dir = opendir("/dev/shm");
    while (dir != nullptr && st == MRC_OK) {
      dirent *ent = readdir(dir);  // NOLINT(concurrency-mt-unsafe): a stream of our own
      if (ent == nullptr) break;
      if (classify_shm_file_locked(d, ent->d_name) == ShmFile::Orphan) {
        st = fail(MRC_ERR_IO, "/dev/shm/{} belongs to no segment", ent->d_name);
      }
    }
    if (dir != nullptr) closedir(dir);
  }
  unlock_domain(d);
  return st;
}

mrc_status_t mrc_seg_domain_repair(mrc_seg_domain_t *d, unsigned *repaired) {
  using namespace mrc::seg;
  clear_error();
  if (repaired != nullptr) *repaired = 0;
  if (!usable_here(d)) return MRC_ERR_INVALID;
  bool domain_repaired = false;
  mrc_status_t st = lock_domain(d, &domain_repaired);
  if (st != MRC_OK) return st;
  unsigned count = domain_repaired ? 1U : 0U;
  reap_dead_locked(d);
  remove_orphans_locked(d);
  // The heaps: map each heap segment's files anywhere (offsets, not pointers, inside).
  // Copies of the heap entries that pass internal/validate.h's checks (the others fail the check
  // below).
  struct Todo {
    SegEntry e;
    char file[160];
  };
  auto *todo = new (std::nothrow) Todo[kMaxSegments];
  unsigned n = 0;
  const WindowLimits limits = window_limits(d);
  for (unsigned i = 0; todo != nullptr && i < kMaxSegments; ++i) {
    Todo &t = todo[n];
    t.e = d->root->segments[i];
    if (t.e.state != kEntryReady || (t.e.flags & MRC_SEG_HEAP) == 0) continue;
    if (check_entry(t.e, i, limits) != MRC_OK || !entry_file_name(d, t.e, t.file)) continue;
    ++n;
  }
  unlock_domain(d);
  if (todo == nullptr) return fail(MRC_ERR_NO_MEMORY, "out of memory");
  clear_error();  // a skipped entry's reason: the check at the end reports it
  for (unsigned i = 0; i < n && st == MRC_OK; ++i) {
    const SegEntry &t = todo[i].e;
    const char *name = todo[i].file;
    const int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) continue;  // removed meanwhile
    st = check_file(fd, name, d->uid, d->gid, d->mode, t.map_size);
    void *hdr = MAP_FAILED;
    void *data = MAP_FAILED;
    if (st == MRC_OK) hdr = mmap(nullptr, t.map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (hdr == MAP_FAILED) continue;
    auto *h = static_cast<SegHeader *>(hdr);
    if ((t.flags & MRC_SEG_FILE) != 0) {
      const int bfd = open(t.backing_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
      struct stat sb {};
      // Only the file the segment was created on, and only as many bytes as it has.
      if (bfd >= 0 && fstat(bfd, &sb) == 0 && sb.st_dev == t.backing_dev &&
          sb.st_ino == t.backing_ino && static_cast<uint64_t>(sb.st_size) >= t.data_size) {
        data = mmap(nullptr, t.data_size, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0);
      }
      if (bfd >= 0) close(bfd);
    } else {
      data = static_cast<char *>(hdr) + t.data_offset;  // inside map_size (check_entry)
    }
    if (h->magic == kSegMagic && h->domain_id == d->domain_id && data != MAP_FAILED) {
      SharedHeap heap(&h->heap, static_cast<char *>(data), t.data_size);
      bool heap_repaired = false;
      st = heap.recover(&heap_repaired);
      count += heap_repaired ? 1U : 0U;
      if (st == MRC_OK) st = heap.check(nullptr);
    }
    if ((t.flags & MRC_SEG_FILE) != 0 && data != MAP_FAILED) munmap(data, t.data_size);
    munmap(hdr, t.map_size);
  }
  delete[] todo;
  if (repaired != nullptr) *repaired = count;
  if (st != MRC_OK) return st;
  return mrc_seg_domain_check(d);
}

mrc_status_t mrc_seg_remove(mrc_seg_domain_t *d, const char *name) {
  using namespace mrc::seg;
  clear_error();
  if (!usable_here(d)) return MRC_ERR_INVALID;
  if (!valid_name(name)) return fail(MRC_ERR_INVALID, "bad segment name");
  mrc_status_t st = lock_domain(d, nullptr);
  if (st != MRC_OK) return st;
  reap_dead_locked(d);
  st = fail(MRC_ERR_NOT_FOUND, "no segment {}", name);
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    SegEntry &e = d->root->segments[i];
    if (e.state != kEntryReady || std::strcmp(e.name, name) != 0) continue;
    if (has_clients(e)) {
      st = fail(MRC_ERR_BUSY, "segment {} is open in {} live processes", name, count_clients(e));
    } else {
      teardown_entry_locked(d, i);
      st = MRC_OK;
    }
    break;
  }
  unlock_domain(d);
  if (st == MRC_OK) clear_error();
  return st;
}

mrc_status_t mrc_seg_domain_remove_v2(const mrc_seg_domain_params_t *params, unsigned *removed) {
  using namespace mrc::seg;
  if (removed != nullptr) *removed = 0;
  // Join (or create) as a client: then the lock, the orphans and the last-out teardown are ours
  // to handle like any member's.
  mrc_seg_domain_t *d = nullptr;
  mrc_status_t st = open_domain(params, false, &d);
  if (st != MRC_OK) return st;
  char prefix[kNameMax + 1];
  std::strcpy(prefix, d->prefix);  // NOLINT: same size
  const unsigned before = d->files_unlinked;
  unsigned live_others = 0;
  st = lock_domain(d, nullptr);
  if (st == MRC_OK) {
    reap_dead_locked(d);
    remove_orphans_locked(d);
    for (unsigned i = 0; i < kMaxSegments; ++i) {
      SegEntry &e = d->root->segments[i];
      if (e.state == kEntryReady && !has_clients(e)) teardown_entry_locked(d, i);
    }
    live_others = live_clients_locked(d) - 1;
    unlock_domain(d);
  }
  unsigned count = d->files_unlinked - before;
  pthread_mutex_lock(&d->mu);
  const bool open_here = d->refs > 1;  // this process holds the domain open elsewhere
  pthread_mutex_unlock(&d->mu);
  unsigned total = 0;
  const bool created = d->created;  // then the root was not there before this call
  const mrc_status_t close_st = release_domain(d, &total);  // last out: removes the root
  if (!open_here && total > before) count = total - before - (created ? 1U : 0U);
  if (removed != nullptr) *removed = count;
  if (st != MRC_OK) return st;
  if (close_st != MRC_OK) return close_st;
  if (live_others > 0 || open_here) {
    return fail(MRC_ERR_BUSY, "{} live processes still use domain {}",
                live_others + (open_here ? 1U : 0U), prefix);
  }
  return MRC_OK;
}

}  // extern "C"
