// Segment domains: create/join/leave the root region, the directory of named segments, client
// tracking, crash repair, and named segments' open/close.
//
// SYNCHRONIZATION: see layout.h (shared memory: the ready word, the robust domain lock, OFD
// presence locks) and domain.h (process-local: registry mutex -> mu -> domain lock -> heap
// lock). Every function named *_locked requires the shared domain lock.
//
// CRASH CONSISTENCY: see layout.h. The protocols that touch file names:
//  - Root creation: shm_open(O_CREAT|O_EXCL) -> OFD "creator" lock -> check that the name still
//    names our file -> size, map, initialise -> publish `ready` (release) -> drop the creator
//    lock. A root that stays unready with its creator lock free was left by a dead creator; a
//    joiner removes it only while holding that creator lock itself and after checking that the
//    name still names that file, so a root is never removed from under a live creator.
//  - Root removal (last client out): under the domain lock, tear the segments down, mark the
//    header kDomainDead, unlink. A process that waited on the lock of a dead root finishes the
//    unlink when needed (same-file check) and starts over.
//  - Segment files are created and unlinked only under the domain lock, named by a generation
//    that is never reused, and unlinked only when owned by the domain's uid.
#include "core/segment/domain.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "base/sized.h"
#include "core/segment/heap.h"
#include "core/segment/sys.h"

namespace mrc::seg {

namespace {

constexpr unsigned kDefaultTimeoutMs = 5000;
constexpr uint64_t kBaseGranule = uint64_t{1} << 30;
constexpr uint64_t kUserTop = uint64_t{1} << 47;
constexpr uint64_t kPollNs = uint64_t{200} * 1000;
constexpr uint64_t kPage = 4096;

// The default window: where processes rarely map anything, and (x86-64) inside the application
// ranges of ASan and TSan, so sanitizer builds work too.
struct DefaultWindow {
  uint64_t lo, hi, size;
};
#if defined(__x86_64__) && defined(MRC_TSAN)
constexpr DefaultWindow kDefaultWindow{0x566000000000ULL, 0x568000000000ULL, 16ULL << 30};
#elif defined(__x86_64__)
constexpr DefaultWindow kDefaultWindow{0x580000000000ULL, 0x5a0000000000ULL, 64ULL << 30};
#else
// 39-bit user address spaces (some arm64 kernels) end at 512 GiB.
constexpr DefaultWindow kDefaultWindow{0x2000000000ULL, 0x6000000000ULL, 16ULL << 30};
#endif

struct Resolved {
  char prefix[kNameMax + 1];
  char root_name[160];
  unsigned mode;
  uid_t uid;
  gid_t gid;
  unsigned timeout_ms;
  uint64_t want_base;  // 0: random inside the default range
  uint64_t want_size;
  uint64_t accept_lo, accept_hi;  // a joiner's configured window
};

inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline void commit() noexcept { std::atomic_signal_fence(std::memory_order_seq_cst); }

void domain_defaults(mrc_seg_domain_params_t *params) {
  *params = mrc_seg_domain_params_t{};
  params->struct_size = sizeof *params;
  params->uid = -1;
  params->gid = -1;
}

mrc_status_t resolve(const mrc_seg_domain_params_t *caller, bool observer, Resolved *r) {
  if (caller == nullptr) return fail(MRC_ERR_INVALID, "params is NULL");
  // The size rule of mrcache.h: fields past the caller's struct_size keep their defaults.
  mrc_seg_domain_params_t known;
  domain_defaults(&known);
  if (!sized_input_copy(&known, sizeof known, caller, caller->struct_size,
                        MRC_SEG_DOMAIN_PARAMS_SIZE_0_2)) {
    return fail(MRC_ERR_INVALID,
                "struct_size {} is not a mrc_seg_domain_params_t this library reads (set it "
                "with mrc_seg_domain_params_init)",
                caller->struct_size);
  }
  const mrc_seg_domain_params_t *p = &known;
  const char *prefix = p->prefix != nullptr ? p->prefix : "mrcache";
  if (!valid_name(prefix)) {
    return fail(MRC_ERR_INVALID, "prefix must be 1..{} characters of [A-Za-z0-9._-]", kNameMax);
  }
  std::strcpy(r->prefix, prefix);  // NOLINT: length checked by valid_name
  root_shm_name(prefix, r->root_name);
  r->mode = p->mode == 0 ? 0600U : p->mode;
  if ((r->mode & ~0777U) != 0 || (r->mode & 0002U) != 0 || (r->mode & 0600U) != 0600U) {
    return fail(MRC_ERR_INVALID, "mode {:o}: needs owner read/write and never world-write",
                r->mode);
  }
  if (p->uid < -1 || p->gid < -1) return fail(MRC_ERR_INVALID, "uid and gid: -1 or an id");
  r->uid = p->uid == -1 ? geteuid() : static_cast<uid_t>(p->uid);
  r->gid = p->gid == -1 ? getegid() : static_cast<gid_t>(p->gid);
  r->timeout_ms = p->join_timeout_ms == 0 ? kDefaultTimeoutMs : p->join_timeout_ms;
  r->want_size = p->size == 0 ? kDefaultWindow.size : p->size;
  if (r->want_size % kVaPageSize != 0 || r->want_size / kVaPageSize > kMaxVaPages) {
    return fail(MRC_ERR_INVALID, "window size {:#x}: a multiple of 2 MiB, at most {} GiB",
                r->want_size, (kMaxVaPages * kVaPageSize) >> 30);
  }
  r->want_base = p->base;
  if (p->base != 0) {
    if (p->base % kVaPageSize != 0 || p->base >= kUserTop || r->want_size > kUserTop - p->base) {
      return fail(MRC_ERR_INVALID, "window base {:#x}: 2 MiB aligned, window below {:#x}", p->base,
                  kUserTop);
    }
    r->accept_lo = p->base;
    r->accept_hi = p->base + r->want_size;
  } else if (observer && p->size == 0) {
    // An observer maps nothing at the window, so it need not trust where the window is: it
    // accepts any window in user space unless told which one to expect.
    r->accept_lo = 0;
    r->accept_hi = kUserTop;
  } else {
    if (r->want_size > kDefaultWindow.hi - kDefaultWindow.lo) {
      return fail(MRC_ERR_INVALID, "window size {:#x} exceeds the default range: set a base",
                  r->want_size);
    }
    r->accept_lo = kDefaultWindow.lo;
    r->accept_hi = kDefaultWindow.hi;
  }
  return MRC_OK;
}

// ---- the registry of joined domains ------------------------------------------------------
pthread_mutex_t g_registry_mu = PTHREAD_MUTEX_INITIALIZER;
mrc_seg_domain *g_registry = nullptr;
pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

void atfork_prepare() { pthread_mutex_lock(&g_registry_mu); }
void atfork_parent() { pthread_mutex_unlock(&g_registry_mu); }
// The child must not keep the parent's presence locks alive: an OFD lock lives as long as any
// descriptor of its open file description, and the child's copy is one.
void atfork_child() {
  for (mrc_seg_domain *d = g_registry; d != nullptr; d = d->next) {
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    d->forked = true;
  }
  pthread_mutex_unlock(&g_registry_mu);
}
void install_atfork() { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

// A fork child's copies: unmap them (the child may open the same domain again) but keep the
// objects, in case the child still holds their handles (calls on them fail cleanly).
void forget_forked_locked() {
  mrc_seg_domain **link = &g_registry;
  while (*link != nullptr) {
    mrc_seg_domain *d = *link;
    if (d->forked || d->pid != getpid()) {
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

// ---- files and mappings --------------------------------------------------------------------
bool same_file(int fd, const char *name) {
  const int other = shm_open(name, O_RDONLY, 0);
  if (other < 0) return false;
  struct stat a {
  }, b{};
  const bool same =
      fstat(fd, &a) == 0 && fstat(other, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  close(other);
  return same;
}

mrc_status_t reserve_window(uint64_t base, uint64_t size) {
  void *want = reinterpret_cast<void *>(base);
  void *got = mmap(want, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (got == MAP_FAILED) {
    if (errno == EEXIST) {
      return fail(MRC_ERR_EXISTS,
                  "something is already mapped in [{:#x}, {:#x}) in this process: the domain "
                  "window cannot go there (nothing was replaced)",
                  base, base + size);
    }
    return fail(MRC_ERR_NO_MEMORY, "reserving the window [{:#x}, {:#x}): {}", base, base + size,
                errno_text(errno));
  }
  if (got != want) {  // a kernel older than 4.17 treats the flag as a hint
    munmap(got, size);
    return fail(MRC_ERR_EXISTS, "the window [{:#x}, {:#x}) is not free in this process", base,
                base + size);
  }
  return MRC_OK;
}

// The segment file of `e`, unlinked when it is ours (owned by the domain's uid).
void unlink_segment_file(mrc_seg_domain *d, const SegEntry &e) {
  char name[160];
  segment_shm_name(d->prefix, e.generation, e.name, name);
  const int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) return;  // never created, or already gone
  struct stat st {};
  if (fstat(fd, &st) == 0 && owned_by_domain(st.st_uid, st.st_gid, d->uid, d->gid, d->mode)) {
    if (shm_unlink(name) == 0) d->files_unlinked++;
  } else {
    set_error("{} does not belong to the domain: left alone", name);
  }
  close(fd);
}

// ---- the page bitmap -----------------------------------------------------------------------
bool page_used(const RootHeader *root, uint64_t i) {
  return (root->va_bitmap[i / 64] >> (i % 64) & 1U) != 0;
}
void mark_pages(RootHeader *root, uint64_t first, uint64_t count, bool used) {
  for (uint64_t i = first; i < first + count; ++i) {
    if (used) {
      root->va_bitmap[i / 64] |= uint64_t{1} << (i % 64);
    } else {
      root->va_bitmap[i / 64] &= ~(uint64_t{1} << (i % 64));
    }
  }
}
// First fit; the number of pages or ~0.
uint64_t find_pages(const RootHeader *root, uint64_t count) {
  uint64_t run = 0;
  for (uint64_t i = 0; i < root->va_pages; ++i) {
    if (i % 64 == 0 && root->va_bitmap[i / 64] == ~uint64_t{0} && i + 64 <= root->va_pages) {
      run = 0;
      i += 63;
      continue;
    }
    if (page_used(root, i)) {
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

// ---- directory and clients (all *_locked) ------------------------------------------------
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

// ---- root creation and joining -----------------------------------------------------------
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
      if (std::strcmp(d->prefix, r.prefix) == 0) {
        pthread_mutex_lock(&d->mu);
        d->refs++;
        pthread_mutex_unlock(&d->mu);
        pthread_mutex_unlock(&g_registry_mu);
        *out = d;
        return MRC_OK;
      }
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

}  // namespace

// ---- internal API ------------------------------------------------------------------------
bool usable_here(const mrc_seg_domain *d) noexcept {
  if (d == nullptr || d->forked || d->root == nullptr || d->pid != getpid()) {
    set_error("domain handle is NULL, closed, or belongs to the parent of this fork() child");
    return false;
  }
  return true;
}

mrc_status_t lock_domain(mrc_seg_domain *d, bool *repaired) noexcept {
  if (repaired != nullptr) *repaired = false;
  const uint64_t deadline = monotonic_ns() + uint64_t{d->timeout_ms} * 1000000ULL;
  switch (robust_lock(&d->root->lock, deadline)) {
    case LockResult::kAcquired: return MRC_OK;
    case LockResult::kOwnerDied:
      repair_locked(d);
      pthread_mutex_consistent(&d->root->lock);
      if (repaired != nullptr) *repaired = true;
      return MRC_OK;
    case LockResult::kTimeout: {
      const MutexState s = mutex_state(&d->root->lock);
      return fail(MRC_ERR_BUSY, "domain {}: lock held by live thread {} for {} ms", d->prefix,
                  s.owner_tid, d->timeout_ms);
    }
    case LockResult::kUnrecoverable:
      return fail(MRC_ERR_IO, "domain {}: lock not recoverable", d->prefix);
    case LockResult::kError: break;
  }
  return fail(MRC_ERR_IO, "domain {}: lock failed", d->prefix);
}

void unlock_domain(mrc_seg_domain *d) noexcept { pthread_mutex_unlock(&d->root->lock); }

bool reserve_again(void *start, size_t len) noexcept {
  return mmap(start, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
              0) == start;
}

mrc_status_t numa_check_node(int node) noexcept {
  if (numa_available() < 0) {
    return fail(MRC_ERR_UNSUPPORTED, "NUMA is not available here (libnuma: numa_available < 0)");
  }
  const int max_node = numa_max_node();
  if (node < 0 || node > max_node || node >= 1024 ||
      numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node)) == 0) {
    return fail(MRC_ERR_NOT_FOUND, "NUMA node {} is not there (nodes 0..{} on this machine)", node,
                max_node);
  }
  return MRC_OK;
}

mrc_status_t numa_bind(void *addr, size_t len, int node) noexcept {
  constexpr unsigned long kBits = 1024;
  unsigned long mask[kBits / 64] = {};
  mask[static_cast<unsigned>(node) / 64] = 1UL << (static_cast<unsigned>(node) % 64);
  // mbind reads maxnode - 1 bits (a historical off-by-one).
  if (mbind(addr, len, MPOL_BIND, mask, kBits + 1, 0) != 0) {
    return fail(MRC_ERR_IO, "mbind to NUMA node {}: {}", node, errno_text(errno));
  }
  int mode = -1;
  unsigned long got[kBits / 64] = {};
  if (get_mempolicy(&mode, got, kBits, addr, MPOL_F_ADDR) != 0) {
    return fail(MRC_ERR_IO, "get_mempolicy: {}", errno_text(errno));
  }
  for (unsigned i = 0; i < kBits / 64; ++i) {
    if (got[i] != mask[i] || mode != MPOL_BIND) {
      return fail(MRC_ERR_IO, "NUMA policy did not stick (mode {}): node {} refused", mode, node);
    }
  }
  return MRC_OK;
}

// ---- named segments ----------------------------------------------------------------------
namespace {

struct SegLayout {
  uint64_t map_size;     // bytes of the /dev/shm file
  uint64_t data_offset;  // from the segment start
  uint64_t data_size;
  uint64_t va_pages;
};

mrc_status_t validate_params(const mrc_seg_params_t *p) {
  if (p == nullptr || !valid_name(p->name)) {
    return fail(MRC_ERR_INVALID, "segment name must be 1..{} characters of [A-Za-z0-9._-]",
                kNameMax);
  }
  constexpr unsigned kKnown = MRC_SEG_HEAP | MRC_SEG_NODATA | MRC_SEG_FILE | MRC_SEG_HUGETLB |
                              MRC_SEG_EXCL | MRC_SEG_NOCREATE;
  if ((p->flags & ~kKnown) != 0) return fail(MRC_ERR_INVALID, "unknown flags {:#x}", p->flags);
  if ((p->flags & MRC_SEG_EXCL) != 0 && (p->flags & MRC_SEG_NOCREATE) != 0) {
    return fail(MRC_ERR_INVALID, "MRC_SEG_EXCL and MRC_SEG_NOCREATE exclude each other");
  }
  if ((p->flags & MRC_SEG_NODATA) != 0 && (p->flags & (MRC_SEG_HEAP | MRC_SEG_FILE)) != 0) {
    return fail(MRC_ERR_INVALID, "MRC_SEG_NODATA has neither heap nor file");
  }
  if ((p->flags & MRC_SEG_FILE) != 0) {
    if (p->backing_file == nullptr || p->backing_file[0] != '/' ||
        std::strlen(p->backing_file) > kPathMax) {
      return fail(MRC_ERR_INVALID,
                  "MRC_SEG_FILE needs an absolute backing_file of at most {} "
                  "characters",
                  kPathMax);
    }
  }
  if (p->numa_node < -1) return fail(MRC_ERR_INVALID, "numa_node: -1 or a node");
  if (p->size > (kMaxVaPages * kVaPageSize)) {
    return fail(MRC_ERR_INVALID, "size {} exceeds any window", p->size);
  }
  return MRC_OK;
}

// The backing file of a MRC_SEG_FILE segment: created 0600/mode with O_EXCL, or opened and
// checked. *hugepage: its page size when it lives on hugetlbfs, else 0.
mrc_status_t open_backing(mrc_seg_domain *d, const char *path, uint64_t *size_inout, bool creating,
                          int *fd_out, uint64_t *hugepage) {
  *hugepage = 0;
  int fd = -1;
  bool created = false;
  if (creating) {
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, d->mode);
    created = fd >= 0;
  }
  if (fd < 0 && (!creating || errno == EEXIST)) {
    fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  }
  if (fd < 0) return fail(MRC_ERR_IO, "backing file {}: {}", path, errno_text(errno));
  struct statfs fs {};
  if (fstatfs(fd, &fs) == 0 && static_cast<uint64_t>(fs.f_type) == HUGETLBFS_MAGIC) {
    *hugepage = static_cast<uint64_t>(fs.f_bsize);
  }
  if (created) {
    const mrc_status_t given = give_to_domain(fd, path, d->uid, d->gid, d->mode);
    if (given != MRC_OK) {
      close(fd);
      return given;
    }
  }
  mrc_status_t st = check_file(fd, path, d->uid, d->gid, d->mode, 0);
  if (st != MRC_OK) {
    close(fd);
    return st;
  }
  const uint64_t page = *hugepage != 0 ? *hugepage : kPage;
  const uint64_t want = round_up(*size_inout, page);
  struct stat sb {};
  fstat(fd, &sb);
  if (created || (creating && static_cast<uint64_t>(sb.st_size) < want && sb.st_size == 0)) {
    if (ftruncate(fd, static_cast<off_t>(want)) != 0) {
      close(fd);
      return fail(MRC_ERR_IO, "sizing {}: {}", path, errno_text(errno));
    }
  } else if (static_cast<uint64_t>(sb.st_size) < want) {
    close(fd);
    return fail(MRC_ERR_INVALID, "{} has {} bytes, the segment needs {}: refused", path, sb.st_size,
                want);
  }
  *size_inout = want;
  *fd_out = fd;
  return MRC_OK;
}

mrc_seg *new_handle(mrc_seg_domain *d, Mapping *m, bool created) {
  auto *seg = new (std::nothrow) mrc_seg;
  if (seg == nullptr) return nullptr;
  seg->domain = d;
  seg->map = m;
  seg->created = created;
  return seg;
}

// Validates the header of a segment mapped at `start` against its directory entry.
mrc_status_t validate_segment(const mrc_seg_domain *d, const SegEntry &e, const char *start) {
  const auto *h = reinterpret_cast<const SegHeader *>(start);
  const auto base = reinterpret_cast<uint64_t>(start);
  if (h->magic != kSegMagic || h->layout_version != kLayoutVersion ||
      h->domain_id != d->domain_id || h->generation != e.generation || h->base != base ||
      h->map_size != e.map_size || h->data_offset != e.data_offset || h->data_size != e.data_size ||
      std::strncmp(h->name, e.name, sizeof h->name) != 0) {
    return fail(MRC_ERR_INVALID,
                "segment {}: its header does not match its directory entry: refused", e.name);
  }
  return MRC_OK;
}

// Maps a ready segment at its window address. REQUIRES: domain lock held.
mrc_status_t map_existing_locked(mrc_seg_domain *d, const SegEntry &e, Mapping *m) {
  char *start = reinterpret_cast<char *>(d->base + e.va_offset);
  m->start = start;
  m->va_len = e.va_pages * kVaPageSize;
  m->map_size = e.map_size;
  m->data = start + e.data_offset;
  m->data_size = e.data_size;
  if ((e.flags & MRC_SEG_NODATA) != 0) return MRC_OK;
  char name[160];
  segment_shm_name(d->prefix, e.generation, e.name, name);
  const int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return fail(MRC_ERR_IO, "segment file /dev/shm{}: {}", name, errno_text(errno));
  char what[200];
  auto res = fmt::format_to_n(what, sizeof what - 1, "/dev/shm{}", name);
  *res.out = '\0';
  mrc_status_t st = check_file(fd, what, d->uid, d->gid, d->mode, e.map_size);
  if (st == MRC_OK &&
      mmap(start, e.map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != start) {
    st = fail(MRC_ERR_NO_MEMORY, "mapping {}: {}", what, errno_text(errno));
  }
  close(fd);
  if (st != MRC_OK) return st;
  if ((e.flags & MRC_SEG_FILE) != 0) {
    const int bfd = open(e.backing_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb {};
    if (bfd < 0 || fstat(bfd, &sb) != 0 || sb.st_dev != e.backing_dev ||
        sb.st_ino != e.backing_ino) {
      st = fail(MRC_ERR_INVALID, "backing file {} is not the file the segment was created on",
                e.backing_path);
    } else {
      st = check_file(bfd, e.backing_path, d->uid, d->gid, d->mode, 0);
      if (st == MRC_OK && static_cast<uint64_t>(sb.st_size) < e.data_size) {
        st = fail(MRC_ERR_INVALID, "backing file {} shrank: refused", e.backing_path);
      }
      if (st == MRC_OK && mmap(m->data, e.data_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                               bfd, 0) != m->data) {
        st = fail(MRC_ERR_NO_MEMORY, "mapping {}: {}", e.backing_path, errno_text(errno));
      }
    }
    if (bfd >= 0) close(bfd);
  }
  if (st == MRC_OK) st = validate_segment(d, e, start);
  if (st != MRC_OK) {
    (void)reserve_again(start, m->va_len);
    return st;
  }
  m->header = reinterpret_cast<SegHeader *>(start);
  return MRC_OK;
}

// Creates a segment. REQUIRES: domain lock held, no ready entry of that name.
mrc_status_t create_locked(mrc_seg_domain *d, const mrc_seg_params_t *p, Mapping *m) {
  RootHeader *root = d->root;
  if (p->size == 0) return fail(MRC_ERR_INVALID, "segment {} does not exist; size 0", p->name);
  SegLayout lay{};
  int backing_fd = -1;
  uint64_t hugepage = 0;
  if ((p->flags & MRC_SEG_FILE) != 0) {
    uint64_t size = p->size;
    mrc_status_t st = open_backing(d, p->backing_file, &size, true, &backing_fd, &hugepage);
    if (st != MRC_OK) return st;
    if (hugepage > kVaPageSize) {
      close(backing_fd);
      return fail(MRC_ERR_UNSUPPORTED, "huge pages of {} bytes exceed the window's 2 MiB granule",
                  hugepage);
    }
    lay.map_size = kSegHeaderSize;
    lay.data_offset = hugepage != 0 ? kVaPageSize : kSegHeaderSize;
    lay.data_size = size;
  } else if ((p->flags & MRC_SEG_NODATA) != 0) {
    lay.map_size = 0;
    lay.data_offset = 0;
    lay.data_size = round_up(p->size, kPage);
  } else {
    lay.data_offset = kSegHeaderSize;
    lay.data_size = round_up(p->size, kPage);
    lay.map_size = kSegHeaderSize + lay.data_size;
  }
  lay.va_pages = round_up(lay.data_offset + lay.data_size, kVaPageSize) / kVaPageSize;
  if ((p->flags & MRC_SEG_HEAP) != 0 && lay.data_size > SharedHeap::kMaxHeapSize) {
    if (backing_fd >= 0) close(backing_fd);
    return fail(MRC_ERR_INVALID, "a heap segment holds at most {} bytes", SharedHeap::kMaxHeapSize);
  }

  unsigned index = kMaxSegments;
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    if (root->segments[i].state == kEntryFree) {
      index = i;
      break;
    }
  }
  const uint64_t first = find_pages(root, lay.va_pages);
  if (index == kMaxSegments || first == ~uint64_t{0}) {
    if (backing_fd >= 0) close(backing_fd);
    return index == kMaxSegments
               ? fail(MRC_ERR_NO_MEMORY, "the directory holds {} segments already", kMaxSegments)
               : fail(MRC_ERR_NO_MEMORY, "no room for {} pages of 2 MiB in the window",
                      lay.va_pages);
  }

  // Record the intent first: a crash from here on is rolled back by repair_locked().
  SegEntry &e = root->segments[index];
  std::memset(&e, 0, sizeof e);
  e.flags = p->flags & (MRC_SEG_HEAP | MRC_SEG_NODATA | MRC_SEG_FILE);
  e.generation = root->next_generation++;
  e.va_offset = first * kVaPageSize;
  e.va_pages = lay.va_pages;
  e.map_size = lay.map_size;
  e.data_offset = lay.data_offset;
  e.data_size = lay.data_size;
  e.numa_node = p->numa_node;
  e.creator_slot = static_cast<uint32_t>(d->slot);
  e.created_ns = realtime_ns();
  std::strcpy(e.name, p->name);  // NOLINT: bounded by valid_name
  if (backing_fd >= 0) {
    struct stat sb {};
    fstat(backing_fd, &sb);
    e.backing_dev = sb.st_dev;
    e.backing_ino = sb.st_ino;
    std::strcpy(e.backing_path, p->backing_file);  // NOLINT: bounded by validate_params
  }
  commit();
  e.state = kEntryCreating;
  commit();
  mark_pages(root, first, lay.va_pages, true);

  char *start = reinterpret_cast<char *>(d->base + e.va_offset);
  m->start = start;
  m->va_len = lay.va_pages * kVaPageSize;
  m->map_size = lay.map_size;
  m->data = start + lay.data_offset;
  m->data_size = lay.data_size;
  mrc_status_t st = MRC_OK;
  if ((p->flags & MRC_SEG_NODATA) == 0) {
    char name[160];
    segment_shm_name(d->prefix, e.generation, e.name, name);
    const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, d->mode);
    if (fd < 0) {
      st = fail(MRC_ERR_IO, "creating /dev/shm{}: {}", name, errno_text(errno));
    } else {
      st = give_to_domain(fd, name, d->uid, d->gid, d->mode);
      if (st == MRC_OK && ftruncate(fd, static_cast<off_t>(lay.map_size)) != 0) {
        st = fail(MRC_ERR_IO, "sizing /dev/shm{}: {}", name, errno_text(errno));
      } else if (st == MRC_OK && mmap(start, lay.map_size, PROT_READ | PROT_WRITE,
                                      MAP_SHARED | MAP_FIXED, fd, 0) != start) {
        st = fail(MRC_ERR_NO_MEMORY, "mapping /dev/shm{}: {}", name, errno_text(errno));
      }
      close(fd);
    }
    if (st == MRC_OK && backing_fd >= 0 &&
        mmap(m->data, lay.data_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, backing_fd,
             0) != m->data) {
      st = fail(hugepage != 0 && errno == ENOMEM ? MRC_ERR_NO_MEMORY : MRC_ERR_IO,
                "mapping {}: {}{}", p->backing_file, errno_text(errno),
                hugepage != 0 ? " (not enough free huge pages?)" : "");
    }
    // NUMA: the policy goes on before anything touches the pages.
    if (st == MRC_OK && p->numa_node >= 0) {
      st = numa_bind(start, lay.map_size, p->numa_node);
      if (st == MRC_OK && backing_fd >= 0) st = numa_bind(m->data, lay.data_size, p->numa_node);
    }
    if (st == MRC_OK) {
      auto *h = reinterpret_cast<SegHeader *>(start);
      h->magic = kSegMagic;
      h->layout_version = kLayoutVersion;
      h->flags = e.flags;
      h->domain_id = d->domain_id;
      h->generation = e.generation;
      h->base = reinterpret_cast<uint64_t>(start);
      h->map_size = lay.map_size;
      h->data_offset = lay.data_offset;
      h->data_size = lay.data_size;
      h->numa_node = p->numa_node;
      std::strcpy(h->name, p->name);  // NOLINT: bounded
      if ((p->flags & MRC_SEG_HEAP) != 0) st = SharedHeap::init(&h->heap, m->data, lay.data_size);
      m->header = h;
    }
  }
  if (backing_fd >= 0) close(backing_fd);
  if (st != MRC_OK) {
    (void)reserve_again(start, m->va_len);
    m->header = nullptr;
    teardown_entry_locked(d, index);
    return st;
  }
  set_client_bit(e, static_cast<unsigned>(d->slot), true);
  commit();
  e.state = kEntryReady;
  m->entry = index;
  m->generation = e.generation;
  return MRC_OK;
}

}  // namespace

mrc_status_t segment_open(mrc_seg_domain *d, const mrc_seg_params_t *p, mrc_seg **out) noexcept {
  clear_error();
  if (out == nullptr) return fail(MRC_ERR_INVALID, "out is NULL");
  if (!usable_here(d)) return MRC_ERR_INVALID;
  if (d->observer) return fail(MRC_ERR_INVALID, "an observer handle cannot open segments");
  mrc_status_t st = validate_params(p);
  if (st != MRC_OK) return st;
  if ((p->flags & MRC_SEG_HUGETLB) != 0) {
    return fail(MRC_ERR_UNSUPPORTED,
                "named segments live in /dev/shm (tmpfs, no huge pages): use MRC_SEG_FILE with a "
                "backing_file on hugetlbfs, or a memfd segment");
  }
  if (p->numa_node >= 0) {
    st = numa_check_node(p->numa_node);
    if (st != MRC_OK) return st;
  }
  auto *m = new (std::nothrow) Mapping;
  if (m == nullptr) return fail(MRC_ERR_NO_MEMORY, "out of memory");

  pthread_mutex_lock(&d->mu);
  st = lock_domain(d, nullptr);
  if (st != MRC_OK) {
    pthread_mutex_unlock(&d->mu);
    delete m;
    return st;
  }
  RootHeader *root = d->root;
  int found = -1;
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    if (root->segments[i].state == kEntryReady &&
        std::strncmp(root->segments[i].name, p->name, sizeof root->segments[i].name) == 0) {
      found = static_cast<int>(i);
      break;
    }
  }
  bool created = false;
  Mapping *result = nullptr;
  if (found >= 0) {
    SegEntry &e = root->segments[found];
    const unsigned kinds = MRC_SEG_HEAP | MRC_SEG_NODATA | MRC_SEG_FILE;
    if ((p->flags & MRC_SEG_EXCL) != 0) {
      st = fail(MRC_ERR_EXISTS, "segment {} exists", p->name);
    } else if ((p->flags & kinds) != e.flags) {
      st = fail(MRC_ERR_INVALID, "segment {} exists with flags {:#x}, asked {:#x}", p->name,
                e.flags, p->flags & kinds);
    } else if (p->size > e.data_size) {
      st = fail(MRC_ERR_INVALID, "segment {} exists with {} bytes, asked {}", p->name, e.data_size,
                p->size);
    } else {
      for (Mapping *x = d->maps; x != nullptr; x = x->next) {
        if (x->entry == static_cast<uint32_t>(found) && x->generation == e.generation) result = x;
      }
      if (result == nullptr) {
        st = map_existing_locked(d, e, m);
        if (st == MRC_OK) {
          m->entry = static_cast<uint32_t>(found);
          m->generation = e.generation;
          set_client_bit(e, static_cast<unsigned>(d->slot), true);
          result = m;
        }
      }
    }
  } else if ((p->flags & MRC_SEG_NOCREATE) != 0) {
    st = fail(MRC_ERR_NOT_FOUND, "no segment {}", p->name);
  } else {
    st = create_locked(d, p, m);
    if (st == MRC_OK) {
      result = m;
      created = true;
    }
  }
  unlock_domain(d);
  if (st == MRC_OK) {
    if (result == m) {
      const SegEntry &e = root->segments[m->entry];
      m->flags = e.flags;
      m->numa_node = e.numa_node;
      std::strcpy(m->name, e.name);  // NOLINT: bounded
      m->next = d->maps;
      d->maps = m;
    } else {
      delete m;
    }
    mrc_seg *seg = new_handle(d, result, created);
    if (seg == nullptr) {
      pthread_mutex_unlock(&d->mu);
      mrc_seg tmp;
      tmp.domain = d;
      tmp.map = result;
      result->refs++;
      d->open_segments++;
      (void)segment_close(&tmp);  // undo the open (takes mu itself)
      return fail(MRC_ERR_NO_MEMORY, "out of memory");
    }
    result->refs++;
    d->open_segments++;
    *out = seg;
  } else {
    delete m;
  }
  pthread_mutex_unlock(&d->mu);
  return st;
}

mrc_status_t segment_close(mrc_seg *seg) noexcept {
  mrc_seg_domain *d = seg->domain;
  Mapping *m = seg->map;
  if (!usable_here(d)) return MRC_ERR_INVALID;
  pthread_mutex_lock(&d->mu);
  if (--m->refs == 0) {
    // Leave the directory first, then give the range back to the reservation while still
    // holding mu: no thread of ours can map the pages' next owner before.
    if (lock_domain(d, nullptr) == MRC_OK) {
      SegEntry &e = d->root->segments[m->entry];
      if (e.state == kEntryReady && e.generation == m->generation) {
        set_client_bit(e, static_cast<unsigned>(d->slot), false);
        if (!has_clients(e)) teardown_entry_locked(d, m->entry);
      }
      unlock_domain(d);
    }
    // Never leave the old pages mapped: without a reservation (the kernel out of VMAs) a hole
    // in the window is the lesser harm.
    if (!reserve_again(m->start, m->va_len)) munmap(m->start, m->va_len);
    for (Mapping **link = &d->maps; *link != nullptr; link = &(*link)->next) {
      if (*link == m) {
        *link = m->next;
        break;
      }
    }
    delete m;
  }
  d->open_segments--;
  pthread_mutex_unlock(&d->mu);
  return MRC_OK;
}

}  // namespace mrc::seg

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

// ---- C API: domains ------------------------------------------------------------------------
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
  info->pages_total = root->va_pages;
  for (uint64_t i = 0; i < root->va_pages; ++i) info->pages_used += page_used(root, i) ? 1U : 0U;
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
  for (unsigned i = 0; st == MRC_OK && i < kMaxSegments; ++i) {
    const SegEntry &e = root->segments[i];
    if (e.state == kEntryFree) continue;
    if (e.state != kEntryReady) {
      st = fail(MRC_ERR_IO, "entry {} ({}) is in state {} outside the lock", i, e.name, e.state);
      break;
    }
    if (!valid_name(e.name) || e.generation == 0 || e.generation >= root->next_generation) {
      st = fail(MRC_ERR_IO, "entry {}: bad name or generation", i);
      break;
    }
    for (unsigned j = 0; j < i; ++j) {
      if (root->segments[j].state == kEntryReady &&
          std::strcmp(root->segments[j].name, e.name) == 0) {
        st = fail(MRC_ERR_IO, "segment {} is listed twice", e.name);
      }
    }
    const uint64_t first = e.va_offset / kVaPageSize;
    if (e.va_offset % kVaPageSize != 0 || e.va_pages == 0 || e.va_pages > root->va_pages ||
        first > root->va_pages - e.va_pages ||
        e.data_offset + e.data_size > e.va_pages * kVaPageSize) {
      st = fail(MRC_ERR_IO, "segment {}: range outside the window", e.name);
      break;
    }
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
      segment_shm_name(d->prefix, e.generation, e.name, name);
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
    // Files of this prefix nobody names: leaks.
    DIR *dir = opendir("/dev/shm");
    const size_t plen = std::strlen(d->prefix);
    while (dir != nullptr && st == MRC_OK) {
      dirent *ent = readdir(dir);  // NOLINT(concurrency-mt-unsafe): a stream of our own
      if (ent == nullptr) break;
      if (std::strncmp(ent->d_name, d->prefix, plen) != 0 || ent->d_name[plen] != ':') continue;
      if (std::strcmp(ent->d_name + plen, ":root") == 0) continue;
      bool named = false;
      for (const SegEntry &e : root->segments) {
        if (e.state != kEntryReady) continue;
        char name[160];
        segment_shm_name(d->prefix, e.generation, e.name, name);
        if (std::strcmp(name + 1, ent->d_name) == 0) named = true;
      }
      if (!named) st = fail(MRC_ERR_IO, "/dev/shm/{} belongs to no segment", ent->d_name);
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
  struct Todo {
    uint64_t generation;
    char name[kNameMax + 1];
    uint64_t map_size, data_offset, data_size;
    unsigned flags;
    char backing[kPathMax + 1];
  };
  auto *todo = new (std::nothrow) Todo[kMaxSegments];
  unsigned n = 0;
  for (const SegEntry &e : d->root->segments) {
    if (todo == nullptr || e.state != kEntryReady || (e.flags & MRC_SEG_HEAP) == 0) continue;
    Todo &t = todo[n++];
    t.generation = e.generation;
    std::memcpy(t.name, e.name, sizeof t.name);
    t.map_size = e.map_size;
    t.data_offset = e.data_offset;
    t.data_size = e.data_size;
    t.flags = e.flags;
    std::memcpy(t.backing, e.backing_path, sizeof t.backing);
  }
  unlock_domain(d);
  if (todo == nullptr) return fail(MRC_ERR_NO_MEMORY, "out of memory");
  for (unsigned i = 0; i < n && st == MRC_OK; ++i) {
    const Todo &t = todo[i];
    char name[160];
    segment_shm_name(d->prefix, t.generation, t.name, name);
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
      const int bfd = open(t.backing, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
      if (bfd >= 0) {
        data = mmap(nullptr, t.data_size, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0);
        close(bfd);
      }
    } else {
      data = static_cast<char *>(hdr) + t.data_offset;
    }
    if (h->magic == kSegMagic && h->domain_id == d->domain_id && data != MAP_FAILED) {
      SharedHeap heap(&h->heap, static_cast<char *>(data));
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
