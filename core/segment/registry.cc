// SPDX-License-Identifier: BSD-3-Clause
// The registry of the domains this process has joined, one per prefix: opening a domain (a
// second open of a prefix shares the first; otherwise create_root/join_root in join.cc),
// closing it when the last reference goes, and the fork() handlers that keep a child from
// holding its parent's presence locks.
//
// SYNCHRONIZATION: see domain.h (the registry mutex, then mrc_seg_domain::mu, then the shared
// domain lock) and layout.h (the OFD presence locks). In this file the suffix _locked names the
// registry mutex, not the domain lock.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {

bool inherited(const mrc_seg_domain *d) { return d->forked || d->pid != getpid(); }

namespace {

pthread_mutex_t g_registry_mu = PTHREAD_MUTEX_INITIALIZER;
mrc_seg_domain *g_registry = nullptr;
pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

// Each domain's mu too (the lock order: registry mutex, then mu), so that the child's copies
// are consistent and unlocked: the child may still close the segments it inherited.
void atfork_prepare() {
  pthread_mutex_lock(&g_registry_mu);
  for (mrc_seg_domain *d = g_registry; d != nullptr; d = d->next) pthread_mutex_lock(&d->mu);
}
void atfork_parent() {
  for (mrc_seg_domain *d = g_registry; d != nullptr; d = d->next) pthread_mutex_unlock(&d->mu);
  pthread_mutex_unlock(&g_registry_mu);
}
// The child must not keep the parent's presence locks alive: an OFD lock lives as long as any
// descriptor of its open file description, and the child's copy is one.
void atfork_child() {
  for (mrc_seg_domain *d = g_registry; d != nullptr; d = d->next) {
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    d->forked = true;
    pthread_mutex_unlock(&d->mu);
  }
  pthread_mutex_unlock(&g_registry_mu);
}
void install_atfork() { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

// A fork child's copies: unmap them (the child may open the same domain again) but keep the
// objects, in case the child still holds their handles (calls on them fail cleanly). A copy with
// inherited segments still open stays mapped and listed: unmapping its window would pull the
// memory from under those segments (segment.h, fork()); open_domain refuses its prefix.
void forget_forked_locked() {
  mrc_seg_domain **link = &g_registry;
  while (*link != nullptr) {
    mrc_seg_domain *d = *link;
    if (inherited(d) && d->open_segments == 0) {
      *link = d->next;
      d->forked = true;
      if (d->size != 0) munmap(reinterpret_cast<void *>(d->base), d->size);
      if (d->root != nullptr) munmap(d->root, kRootSize);
      d->root = nullptr;
      d->size = 0;
    } else {
      link = &d->next;
    }
  }
}

// Leaves the domain: the caller holds the registry mutex (clients) and nothing else.
// *unlinked: files this process unlinked over the handle's life.
mrc_status_t close_domain_locked(mrc_seg_domain *d, unsigned *unlinked) {
  // An observer holds nothing in the domain: it leaves without the lock.
  if (d->root != nullptr && !d->forked && !d->observer && d->slot >= 0) {
    if (lock_domain(d, nullptr) == MRC_OK) {
      release_slot_locked(d, static_cast<unsigned>(d->slot));
      ofd_unlock(d->fd, kPresenceLockOffset + d->slot);
      d->slot = -1;
      reap_dead_locked(d);
      if (live_clients_locked(d) == 0) teardown_domain_locked(d);
      unlock_domain(d);
    }
    // Without the lock (a live holder hung), our presence lock still goes away with our
    // descriptor below, so the next scan releases our slot.
  }
  if (d->size != 0) munmap(reinterpret_cast<void *>(d->base), d->size);
  if (d->root != nullptr) munmap(d->root, kRootSize);
  if (d->fd >= 0) close(d->fd);
  if (unlinked != nullptr) *unlinked = d->files_unlinked;
  pthread_mutex_destroy(&d->mu);
  delete d;
  return MRC_OK;
}

}  // namespace

mrc_status_t open_domain(const mrc_seg_domain_params_t *params, bool observer,
                         mrc_seg_domain **out) {
  clear_error();
  if (out == nullptr) return fail(MRC_ERR_INVALID, "out is NULL");
  Resolved r{};
  mrc_status_t st = resolve(params, observer, &r);
  if (st != MRC_OK) return st;

  pthread_once(&g_atfork_once, install_atfork);
  pthread_mutex_lock(&g_registry_mu);
  forget_forked_locked();
  if (!observer) {
    for (mrc_seg_domain *d = g_registry; d != nullptr; d = d->next) {
      if (std::strcmp(d->prefix, r.prefix) != 0) continue;
      if (inherited(d)) {
        const int open = d->open_segments;
        pthread_mutex_unlock(&g_registry_mu);
        return fail(MRC_ERR_BUSY,
                    "this fork() child still has {} segments of domain {} inherited from its "
                    "parent: mrc_seg_close them first (until then they stay usable here)",
                    open, r.prefix);
      }
      pthread_mutex_lock(&d->mu);
      d->refs++;
      pthread_mutex_unlock(&d->mu);
      pthread_mutex_unlock(&g_registry_mu);
      *out = d;
      return MRC_OK;
    }
  }
  auto *d = new (std::nothrow) mrc_seg_domain;
  if (d == nullptr) {
    pthread_mutex_unlock(&g_registry_mu);
    return fail(MRC_ERR_NO_MEMORY, "out of memory");
  }
  pthread_mutex_init(&d->mu, nullptr);
  d->pid = getpid();
  d->observer = observer;
  std::strcpy(d->prefix, r.prefix);        // NOLINT: bounded by resolve()
  std::strcpy(d->root_name, r.root_name);  // NOLINT
  d->uid = r.uid;
  d->gid = r.gid;
  d->mode = r.mode;
  d->timeout_ms = r.timeout_ms;
  d->refs = 1;

  const uint64_t deadline = monotonic_ns() + uint64_t{r.timeout_ms} * 1000000ULL;
  for (;;) {
    bool retry = false;
    const int fd = observer ? -1 : shm_open(r.root_name, O_RDWR | O_CREAT | O_EXCL, r.mode);
    if (fd >= 0) {
      st = create_root(r, d, observer, fd, &retry);
    } else if (observer || errno == EEXIST) {
      st = join_root(r, d, observer, deadline, &retry);
    } else {
      st = fail(errno == EACCES ? MRC_ERR_INVALID : MRC_ERR_IO, "creating /dev/shm{}: {}",
                r.root_name, errno_text(errno));
    }
    if (st != MRC_OK || !retry) break;
    if (monotonic_ns() > deadline) {
      st = fail(MRC_ERR_BUSY, "domain {} kept being torn down for {} ms", r.prefix, r.timeout_ms);
      break;
    }
    sleep_ns(kPollNs);
  }
  if (st != MRC_OK) {
    pthread_mutex_unlock(&g_registry_mu);
    pthread_mutex_destroy(&d->mu);
    delete d;
    return st;
  }
  if (!observer) {
    d->next = g_registry;
    g_registry = d;
  }
  pthread_mutex_unlock(&g_registry_mu);
  *out = d;
  return MRC_OK;
}

// mrc_seg_domain_close; *unlinked as above when this was the last reference here.
mrc_status_t release_domain(mrc_seg_domain *d, unsigned *unlinked) {
  if (unlinked != nullptr) *unlinked = 0;
  if (d == nullptr) return fail(MRC_ERR_INVALID, "domain is NULL");
  if (d->observer) return close_domain_locked(d, unlinked);
  pthread_mutex_lock(&g_registry_mu);
  if (d->forked || d->pid != getpid()) {
    pthread_mutex_unlock(&g_registry_mu);
    return fail(MRC_ERR_INVALID, "domain handle belongs to the parent of this fork() child");
  }
  pthread_mutex_lock(&d->mu);
  if (d->refs == 1 && d->open_segments != 0) {
    const int open = d->open_segments;
    pthread_mutex_unlock(&d->mu);
    pthread_mutex_unlock(&g_registry_mu);
    return fail(MRC_ERR_BUSY, "{} segments of domain {} are still open here", open, d->prefix);
  }
  const int refs = --d->refs;
  pthread_mutex_unlock(&d->mu);
  if (refs > 0) {
    pthread_mutex_unlock(&g_registry_mu);
    return MRC_OK;
  }
  for (mrc_seg_domain **link = &g_registry; *link != nullptr; link = &(*link)->next) {
    if (*link == d) {
      *link = d->next;
      break;
    }
  }
  const mrc_status_t st = close_domain_locked(d, unlinked);
  pthread_mutex_unlock(&g_registry_mu);
  return st;
}

void close_inherited(mrc_seg *seg) noexcept {
  mrc_seg_domain *d = seg->domain;
  MappedSegment *m = seg->map;
  pthread_mutex_lock(&d->mu);
  // Back to the reservation the child inherited; the directory is the parent's business.
  if (--m->refs == 0) unmap_segment_locked(d, m);
  d->open_segments--;
  pthread_mutex_unlock(&d->mu);
}

void unmap_segment_locked(mrc_seg_domain *d, MappedSegment *m) noexcept {
  if (!reserve_again(m->start, m->va_len)) munmap(m->start, m->va_len);
  for (MappedSegment **link = &d->maps; *link != nullptr; link = &(*link)->next) {
    if (*link == m) {
      *link = m->next;
      break;
    }
  }
  delete m;
}

bool usable_here(const mrc_seg_domain *d) noexcept {
  if (d == nullptr || d->forked || d->root == nullptr || d->pid != getpid()) {
    set_error("domain handle is NULL, closed, or belongs to the parent of this fork() child");
    return false;
  }
  return true;
}

}  // namespace mrc::seg
