// SPDX-License-Identifier: BSD-3-Clause
// Root creation and joining, for open_domain (registry.cc): creating a domain's root file and
// reserving its window, or joining a root that exists (waiting for its creator, removing a root
// that a dead creator left unready, finishing the removal of a dead one), and claiming a
// client slot.
//
// SYNCHRONIZATION: see layout.h (the ready word, the creator and presence locks, the robust
// domain lock) and domain.h (lock order).
// CRASH CONSISTENCY: see internal/domain_calls.h (root creation, root removal).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {

namespace {

constexpr uint64_t kBaseGranule = uint64_t{1} << 30;

// A root left unready by a dead creator: removed when we hold its creator lock ourselves and the
// name still names it. true when removed.
bool remove_stale_root(int fd, const Resolved &r, const RootHeader *root) {
  if (ofd_trylock(fd, kCreatorLockOffset) != 0) return false;
  struct stat st {};
  bool stale = false;
  if (fstat(fd, &st) == 0) {
    if (st.st_size == 0) {
      stale = true;
    } else if (root != nullptr) {
      stale = root->ready.load(std::memory_order_acquire) != kReadyWord &&
              (root->magic == 0 || root->magic == kRootMagic);
    }
  }
  bool removed = false;
  if (stale && same_file(fd, r.root_name)) removed = shm_unlink(r.root_name) == 0;
  ofd_unlock(fd, kCreatorLockOffset);
  return removed;
}

void init_root(RootHeader *root, const Resolved &r, uint64_t base, uint64_t size) {
  root->magic = kRootMagic;
  root->layout_version = kLayoutVersion;
  root->domain_id = random_u64() | 1U;
  root->base = base;
  root->size = size;
  root->va_page_shift = kVaPageShift;
  root->va_pages = static_cast<uint32_t>(size / kVaPageSize);
  root->uid = r.uid;
  root->gid = r.gid;
  root->mode = r.mode;
  root->root_size = static_cast<uint32_t>(kRootSize);
  root->created_ns = realtime_ns();
  std::strcpy(root->prefix, r.prefix);  // NOLINT: bounded by resolve()
  root->state = kDomainLive;
  root->next_generation = 1;
  root->next_serial = 1;
}

mrc_status_t validate_root(const RootHeader *root, const Resolved &r) {
  if (root->magic != kRootMagic || root->layout_version != kLayoutVersion) {
    return fail(MRC_ERR_INVALID,
                "/dev/shm{}: bad magic {:#x} or layout {}: not an mrcache domain root, refused",
                r.root_name, root->magic, root->layout_version);
  }
  if (root->va_page_shift != kVaPageShift || root->root_size != kRootSize || root->va_pages == 0 ||
      root->va_pages > kMaxVaPages || root->size != uint64_t{root->va_pages} << kVaPageShift ||
      root->base % kVaPageSize != 0 ||
      std::strncmp(root->prefix, r.prefix, sizeof root->prefix) != 0) {
    return fail(MRC_ERR_INVALID, "/dev/shm{}: inconsistent header, refused", r.root_name);
  }
  if (root->base < r.accept_lo || root->base > r.accept_hi ||
      root->size > r.accept_hi - root->base) {
    return fail(MRC_ERR_INVALID,
                "/dev/shm{}: window [{:#x}, {:#x}) lies outside the configured window "
                "[{:#x}, {:#x}), refused",
                r.root_name, root->base, root->base + root->size, r.accept_lo, r.accept_hi);
  }
  return MRC_OK;
}

}  // namespace

// We created the file (O_EXCL). *retry: a remover took it for a stale root; start over.
mrc_status_t create_root(const Resolved &r, mrc_seg_domain *d, bool observer, int fd, bool *retry) {
  if (ofd_trylock(fd, kCreatorLockOffset) != 0 || !same_file(fd, r.root_name)) {
    close(fd);
    *retry = true;
    return MRC_OK;
  }
  RootHeader *root = nullptr;
  uint64_t base = 0;
  const uint64_t size = r.want_size;
  mrc_status_t st = MRC_OK;
  int rc = 0;
  if (observer) {
    st = fail(MRC_ERR_NOT_FOUND, "no domain under prefix {}", r.prefix);
    goto undo;
  }
  st = give_to_domain(fd, "the root file", r.uid, r.gid, r.mode);
  if (st != MRC_OK) goto undo;
  if (ftruncate(fd, static_cast<off_t>(kRootSize)) != 0) {
    st = fail(MRC_ERR_IO, "sizing the root file: {}", errno_text(errno));
    goto undo;
  }
  root = static_cast<RootHeader *>(
      mmap(nullptr, kRootSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (root == MAP_FAILED) {
    root = nullptr;
    st = fail(MRC_ERR_NO_MEMORY, "mapping the root file: {}", errno_text(errno));
    goto undo;
  }
  if (r.want_base != 0) {
    base = r.want_base;
    st = reserve_window(base, size);
  } else {
    // Small randomisation, as VPP does: two domains of one process rarely collide, and when they
    // do we try elsewhere (joiners accept any window inside the default range).
    const uint64_t slots = (kDefaultWindow.hi - kDefaultWindow.lo - size) / kBaseGranule + 1;
    for (int attempt = 0; attempt < 16; ++attempt) {
      base = kDefaultWindow.lo + random_u64() % slots * kBaseGranule;
      st = reserve_window(base, size);
      if (st != MRC_ERR_EXISTS) break;
    }
  }
  if (st != MRC_OK) goto undo;
  init_root(root, r, base, size);
  rc = robust_mutex_init(&root->lock);
  if (rc != 0) {
    munmap(reinterpret_cast<void *>(base), size);
    st = fail(MRC_ERR_IO, "initialising the domain lock: {}", errno_text(rc));
    goto undo;
  }
  // Nobody can lock before `ready`: take slot 0 directly.
  if (ofd_trylock(fd, kPresenceLockOffset) != 0) {
    munmap(reinterpret_cast<void *>(base), size);
    st = fail(MRC_ERR_IO, "presence lock: {}", errno_text(errno));
    goto undo;
  }
  fill_slot(root, 0);
  root->ready.store(kReadyWord, std::memory_order_release);
  ofd_unlock(fd, kCreatorLockOffset);
  d->fd = fd;
  d->root = root;
  d->base = base;
  d->size = size;
  d->va_pages = size / kVaPageSize;
  d->slot = 0;
  d->created = true;
  d->domain_id = root->domain_id;
  return MRC_OK;

undo:
  if (root != nullptr) munmap(root, kRootSize);
  shm_unlink(r.root_name);  // ours: created under O_EXCL, creator lock held, never ready
  close(fd);
  return st;
}

mrc_status_t join_root(const Resolved &r, mrc_seg_domain *d, bool observer, uint64_t deadline,
                       bool *retry) {
  const int fd = shm_open(r.root_name, O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) {
      if (observer) return fail(MRC_ERR_NOT_FOUND, "no domain under prefix {}", r.prefix);
      *retry = true;
      return MRC_OK;
    }
    return fail(errno == EACCES ? MRC_ERR_INVALID : MRC_ERR_IO, "opening /dev/shm{}: {}",
                r.root_name, errno_text(errno));
  }
  char what[200];
  auto res = fmt::format_to_n(what, sizeof what - 1, "/dev/shm{}", r.root_name);
  *res.out = '\0';
  mrc_status_t st = check_file(fd, what, r.uid, r.gid, r.mode, 0);
  if (st != MRC_OK) {
    close(fd);
    return st;
  }
  for (;;) {
    struct stat sb {};
    if (fstat(fd, &sb) != 0) {
      close(fd);
      return fail(MRC_ERR_IO, "fstat {}: {}", what, errno_text(errno));
    }
    if (static_cast<uint64_t>(sb.st_size) == kRootSize) break;
    if (sb.st_size != 0) {
      close(fd);
      return fail(MRC_ERR_INVALID, "{} has {} bytes; this layout needs {}: refused", what,
                  sb.st_size, kRootSize);
    }
    if (ofd_held(fd, kCreatorLockOffset) == 0 && remove_stale_root(fd, r, nullptr)) {
      close(fd);
      *retry = true;
      return MRC_OK;
    }
    if (monotonic_ns() > deadline) {
      close(fd);
      return fail(MRC_ERR_BUSY, "the creator of {} did not finish within {} ms", what,
                  r.timeout_ms);
    }
    sleep_ns(kPollNs);
  }
  auto *root = static_cast<RootHeader *>(
      mmap(nullptr, kRootSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (root == MAP_FAILED) {
    close(fd);
    return fail(MRC_ERR_NO_MEMORY, "mapping {}: {}", what, errno_text(errno));
  }
  auto drop = [&] {
    munmap(root, kRootSize);
    close(fd);
  };
  while (root->ready.load(std::memory_order_acquire) != kReadyWord) {
    if (root->magic != 0 && root->magic != kRootMagic) {
      st = validate_root(root, r);
      drop();
      return st;
    }
    if (ofd_held(fd, kCreatorLockOffset) == 0 && remove_stale_root(fd, r, root)) {
      drop();
      *retry = true;
      return MRC_OK;
    }
    if (monotonic_ns() > deadline) {
      drop();
      return fail(MRC_ERR_BUSY, "the creator of {} did not finish within {} ms", what,
                  r.timeout_ms);
    }
    sleep_ns(kPollNs);
  }
  st = validate_root(root, r);
  if (st != MRC_OK) {
    drop();
    return st;
  }
  d->fd = fd;
  d->root = root;
  d->domain_id = root->domain_id;
  d->va_pages = root->va_pages;  // validated above; never read from the root again
  if (!observer) {
    st = reserve_window(root->base, root->size);
    if (st != MRC_OK) {
      d->fd = -1;
      d->root = nullptr;
      drop();
      return st;
    }
    d->base = root->base;
    d->size = root->size;
  }
  auto undo = [&] {
    if (!observer) munmap(reinterpret_cast<void *>(d->base), d->size);
    d->fd = -1;
    d->root = nullptr;
    d->base = 0;
    d->size = 0;
    drop();
  };
  if (observer) {
    // No lock: looking must work (and change nothing) while a live process holds the lock or
    // its owner died. A racy read of `state` is enough to say "being torn down".
    if (std::atomic_ref<uint32_t>(root->state).load(std::memory_order_relaxed) == kDomainDead) {
      undo();
      return fail(MRC_ERR_NOT_FOUND, "no domain under prefix {} (being removed)", r.prefix);
    }
    return MRC_OK;
  }
  st = lock_domain(d, nullptr);
  if (st != MRC_OK) {
    undo();
    return st;
  }
  if (root->state == kDomainDead) {
    // Its last client left (or died unlinking it): finish the removal, then start over.
    if (same_file(fd, r.root_name)) shm_unlink(r.root_name);
    unlock_domain(d);
    undo();
    *retry = true;
    return MRC_OK;
  }
  d->slot = claim_slot_locked(d);
  if (d->slot < 0) {
    unlock_domain(d);
    undo();
    return fail(MRC_ERR_NO_MEMORY, "all {} client slots of domain {} are taken", kMaxClients,
                r.prefix);
  }
  unlock_domain(d);
  return MRC_OK;
}

}  // namespace mrc::seg
