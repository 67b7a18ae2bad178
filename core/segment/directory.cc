// The directory of segments and the client slots in the root (functions named *_locked, all
// under the shared domain lock): tearing entries down, claiming, releasing and reaping client
// slots, crash repair, removing the whole domain and orphaned files; and the domain lock
// itself, which runs the repair when its owner died.
//
// SYNCHRONIZATION: see layout.h (the robust domain lock, the OFD presence locks) and domain.h
// (lock order).
// CRASH CONSISTENCY: see layout.h and domain_internal.h (root removal, segment files).
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/segment/domain_internal.h"
#include "core/segment/sys.h"

namespace mrc::seg {

void teardown_entry_locked(mrc_seg_domain *d, unsigned index) {
  RootHeader *root = d->root;
  SegEntry &e = root->segments[index];
  e.state = kEntryDeleting;
  commit();
  if ((e.flags & MRC_SEG_NODATA) == 0) unlink_segment_file(d, e);
  if (e.va_pages <= root->va_pages && e.va_offset / kVaPageSize <= root->va_pages - e.va_pages) {
    mark_pages(root, e.va_offset / kVaPageSize, e.va_pages, false);
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

// A slot whose presence lock nobody holds belongs to a dead process.
unsigned reap_dead_locked(mrc_seg_domain *d) {
  unsigned reaped = 0;
  for (unsigned s = 0; s < kMaxClients; ++s) {
    if (d->root->clients[s].state != kSlotActive || static_cast<int>(s) == d->slot) continue;
    if (ofd_held(d->fd, kPresenceLockOffset + static_cast<off_t>(s)) == 0) {
      release_slot_locked(d, s);
      d->root->clients_reaped++;
      ++reaped;
    }
  }
  return reaped;
}

unsigned live_clients_locked(const mrc_seg_domain *d) {
  unsigned n = 0;
  for (const ClientSlot &c : d->root->clients) n += c.state == kSlotActive ? 1U : 0U;
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
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    SegEntry &e = root->segments[i];
    if (e.state == kEntryFree) continue;
    const bool in_window = e.va_pages != 0 && e.va_pages <= root->va_pages &&
                           e.va_offset % kVaPageSize == 0 &&
                           e.va_offset / kVaPageSize <= root->va_pages - e.va_pages;
    if (e.state != kEntryReady || !in_window) {
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
    if (e.state == kEntryReady) mark_pages(root, e.va_offset / kVaPageSize, e.va_pages, true);
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

// Orphans: files of this prefix that no directory entry names (a crash between creating a
// segment file and recording it cannot leave one, but a root removed by hand can).
void remove_orphans_locked(mrc_seg_domain *d) {
  DIR *dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const size_t plen = std::strlen(d->prefix);
  while (dirent *ent = readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): our own stream
    const char *n = ent->d_name;
    if (std::strncmp(n, d->prefix, plen) != 0 || n[plen] != ':') continue;
    const char *rest = n + plen + 1;
    char *end = nullptr;
    errno = 0;
    const unsigned long long gen = std::strtoull(rest, &end, 10);
    if (errno != 0 || end == rest || *end != ':' || !valid_name(end + 1)) continue;
    bool named = false;
    for (const SegEntry &e : d->root->segments) {
      if (e.state != kEntryFree && e.generation == gen && std::strcmp(e.name, end + 1) == 0) {
        named = true;
      }
    }
    if (named) continue;
    SegEntry orphan{};
    orphan.generation = gen;
    std::strcpy(orphan.name, end + 1);  // NOLINT: valid_name bounds it
    unlink_segment_file(d, orphan);
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
