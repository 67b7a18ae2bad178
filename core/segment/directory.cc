// SPDX-License-Identifier: BSD-3-Clause
// The directory of segments and the client slots in the root (functions named *_locked, all
// under the shared domain lock): tearing entries down, claiming, releasing and reaping client
// slots, crash repair, removing the whole domain and orphaned files; and the domain lock
// itself, which runs the repair when its owner died.
//
// SYNCHRONIZATION: see layout.h (the robust domain lock, the OFD presence locks) and domain.h
// (lock order).
// CRASH CONSISTENCY: see layout.h and internal/domain_calls.h (root removal, segment files).
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {

WindowLimits window_limits(const mrc_seg_domain *d) {
  return WindowLimits{d->va_pages, d->root->next_generation};
}

bool entry_file_name(const mrc_seg_domain *d, const SegEntry &e, char (&out)[160]) {
  if (std::memchr(e.name, '\0', sizeof e.name) == nullptr || !valid_name(e.name)) return false;
  segment_shm_name(d->prefix, e.generation, e.file_tag, e.name, out);
  return true;
}

void teardown_entry_locked(mrc_seg_domain *d, unsigned index) {
  RootHeader *root = d->root;
  SegEntry &e = root->segments[index];
  // The values used are read once (shared memory: internal/validate.h); a range outside the window
  // frees no page, a scribbled name unlinks no file.
  const uint32_t flags = e.flags;
  const uint64_t va_offset = e.va_offset;
  const uint64_t va_pages = e.va_pages;
  e.state = kEntryDeleting;
  commit();
  if ((flags & MRC_SEG_NODATA) == 0) unlink_segment_file(d, e);
  if (va_offset % kVaPageSize == 0) {
    mark_pages(root, d->va_pages, va_offset / kVaPageSize, va_pages, false);
  }
  commit();
  std::memset(&e, 0, sizeof e);  // state becomes kEntryFree
}

void release_slot_locked(mrc_seg_domain *d, unsigned slot) {
  RootHeader *root = d->root;
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    SegEntry &e = root->segments[i];
    if (e.state != kEntryReady || !client_bit(e, slot)) continue;
    set_client_bit(e, slot, false);
    if (!has_clients(e)) {
      teardown_entry_locked(d, i);
      root->segments_reaped++;
    }
  }
  commit();
  std::memset(&root->clients[slot], 0, sizeof(ClientSlot));
}

// A slot whose presence lock nobody holds belongs to a dead process. A slot in a state that is
// neither free nor active (garbage written into the table) is treated the same way: reaped when
// no live process holds its presence lock, so garbage cannot take the slots for ever.
unsigned reap_dead_locked(mrc_seg_domain *d) {
  unsigned reaped = 0;
  for (unsigned s = 0; s < kMaxClients; ++s) {
    if (d->root->clients[s].state == kSlotFree || static_cast<int>(s) == d->slot) continue;
    if (ofd_held(d->fd, kPresenceLockOffset + static_cast<off_t>(s)) == 0) {
      release_slot_locked(d, s);
      d->root->clients_reaped++;
      ++reaped;
    }
  }
  return reaped;
}

// Slots not free: after reap_dead_locked, a slot in a garbage state belongs to a live process.
unsigned live_clients_locked(const mrc_seg_domain *d) {
  unsigned n = 0;
  for (const ClientSlot &c : d->root->clients) n += c.state != kSlotFree ? 1U : 0U;
  return n;
}

void fill_slot(RootHeader *root, unsigned s) {
  ClientSlot &c = root->clients[s];
  c.pid = getpid();
  c.uid = geteuid();
  c.serial = root->next_serial++;
  c.attach_time_ns = realtime_ns();
  self_comm(c.comm);
  commit();
  c.state = kSlotActive;
}

int claim_slot_locked(mrc_seg_domain *d) {
  for (int pass = 0; pass < 2; ++pass) {
    for (unsigned s = 0; s < kMaxClients; ++s) {
      if (d->root->clients[s].state != kSlotFree) continue;
      if (ofd_trylock(d->fd, kPresenceLockOffset + static_cast<off_t>(s)) != 0) continue;
      fill_slot(d->root, s);
      return static_cast<int>(s);
    }
    if (pass == 0 && reap_dead_locked(d) == 0) break;
  }
  return -1;
}

void repair_locked(mrc_seg_domain *d) {
  RootHeader *root = d->root;
  root->repairs++;
  const WindowLimits limits = window_limits(d);
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    SegEntry &e = root->segments[i];
    if (e.state == kEntryFree) continue;
    // An entry that fails internal/validate.h's checks is garbage: no process can have mapped it.
    if (e.state != kEntryReady || check_entry(e, i, limits) != MRC_OK) {
      teardown_entry_locked(d, i);  // creating: roll back; deleting: roll forward
      continue;
    }
    for (unsigned s = 0; s < kMaxClients; ++s) {
      if (client_bit(e, s) && root->clients[s].state != kSlotActive) set_client_bit(e, s, false);
    }
    // Ready without a client: its last client died between leaving it and tearing it down
    // (a ready entry always has its creator's bit). Finish the close.
    if (!has_clients(e)) {
      teardown_entry_locked(d, i);
      root->segments_reaped++;
    }
  }
  std::memset(root->va_bitmap, 0, sizeof root->va_bitmap);
  for (const SegEntry &e : root->segments) {
    if (e.state == kEntryReady) {
      mark_pages(root, d->va_pages, e.va_offset / kVaPageSize, e.va_pages, true);
    }
  }
}

// The last client is gone: remove everything. REQUIRES: no live client.
void teardown_domain_locked(mrc_seg_domain *d) {
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    if (d->root->segments[i].state != kEntryFree) teardown_entry_locked(d, i);
  }
  d->root->state = kDomainDead;
  commit();
  if (same_file(d->fd, d->root_name) && shm_unlink(d->root_name) == 0) d->files_unlinked++;
}

namespace {

bool names_entry_locked(const mrc_seg_domain *d, uint64_t generation, uint64_t tag,
                        const char *name) {
  for (const SegEntry &e : d->root->segments) {
    if (e.state != kEntryFree && e.generation == generation && e.file_tag == tag &&
        std::strncmp(e.name, name, sizeof e.name) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

ShmFile classify_shm_file_locked(const mrc_seg_domain *d, const char *file) {
  const size_t plen = std::strlen(d->prefix);
  if (std::strncmp(file, d->prefix, plen) != 0 || file[plen] != ':') return ShmFile::Other;
  if (std::strcmp(file + plen, ":root") == 0) return ShmFile::Root;
  char path[300];
  auto r = fmt::format_to_n(path, sizeof path - 1, "/dev/shm/{}", file);
  *r.out = '\0';
  struct stat st {};
  // Not the domain's (another user's file, or not a regular file): it costs nothing, it is left
  // alone, and mrc_seg_domain_describe lists it.
  if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
      !owned_by_domain(st.st_uid, st.st_gid, d->uid, d->gid, d->mode)) {
    return ShmFile::Foreign;
  }
  uint64_t generation = 0, tag = 0;
  const char *name = nullptr;
  if (parse_segment_name(file + plen + 1, &generation, &tag, &name) &&
      names_entry_locked(d, generation, tag, name)) {
    return ShmFile::Segment;
  }
  return ShmFile::Orphan;
}

// Orphans: files of this prefix, owned by the domain, that no directory entry names (a crash
// between creating a segment file and recording it cannot leave one, but a root removed by hand
// can). Foreign files are left alone.
void remove_orphans_locked(mrc_seg_domain *d) {
  DIR *dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (dirent *ent = readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): our own stream
    if (classify_shm_file_locked(d, ent->d_name) != ShmFile::Orphan) continue;
    char name[300];
    auto r = fmt::format_to_n(name, sizeof name - 1, "/{}", ent->d_name);
    *r.out = '\0';
    if (shm_unlink(name) == 0) d->files_unlinked++;
  }
  closedir(dir);
}

mrc_status_t lock_domain(mrc_seg_domain *d, bool *repaired) noexcept {
  if (repaired != nullptr) *repaired = false;
  const uint64_t deadline = monotonic_ns() + uint64_t{d->timeout_ms} * 1000000ULL;
  switch (robust_lock(&d->root->lock, deadline)) {
    case LockResult::Acquired: return MRC_OK;
    case LockResult::OwnerDied:
      repair_locked(d);
      pthread_mutex_consistent(&d->root->lock);
      if (repaired != nullptr) *repaired = true;
      return MRC_OK;
    case LockResult::Timeout: {
      const MutexState s = mutex_state(&d->root->lock);
      return fail(MRC_ERR_BUSY, "domain {}: lock held by live thread {} for {} ms", d->prefix,
                  s.owner_tid, d->timeout_ms);
    }
    case LockResult::Unrecoverable:
      return fail(MRC_ERR_IO, "domain {}: lock not recoverable", d->prefix);
    case LockResult::Error: break;
  }
  return fail(MRC_ERR_IO, "domain {}: lock failed", d->prefix);
}

void unlock_domain(mrc_seg_domain *d) noexcept { pthread_mutex_unlock(&d->root->lock); }

}  // namespace mrc::seg
