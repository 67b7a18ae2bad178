// SPDX-License-Identifier: BSD-3-Clause
// The calls between the files that implement domains (domain_params.cc, registry.cc, join.cc,
// files.cc, bitmap.cc, directory.cc, named.cc, capi_domain.cc); private to core/segment/. The
// objects they work on are in domain.h, the shared memory in layout.h.
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
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "core/segment/domain.h"
#include "core/segment/internal/validate.h"
#include "core/segment/layout.h"
#include "mrcache/mrcache.h"

namespace mrc::seg {

constexpr uint64_t kPollNs = uint64_t{200} * 1000;

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

// A caller's mrc_seg_domain_params_t, checked and completed with the defaults (resolve()).
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

inline void commit() noexcept { std::atomic_signal_fence(std::memory_order_seq_cst); }

// ---- domain_params.cc: the params of a domain ----------------------------------------------
void domain_defaults(mrc_seg_domain_params_t *params);
[[nodiscard]] mrc_status_t resolve(const mrc_seg_domain_params_t *caller, bool observer,
                                   Resolved *r);

// ---- registry.cc: the domains this process has joined --------------------------------------
[[nodiscard]] mrc_status_t open_domain(const mrc_seg_domain_params_t *params, bool observer,
                                       mrc_seg_domain **out);
// mrc_seg_domain_close; *unlinked: files this process unlinked over the handle's life, when this
// was the last reference here.
[[nodiscard]] mrc_status_t release_domain(mrc_seg_domain *d, unsigned *unlinked);

// ---- join.cc: root creation and joining ----------------------------------------------------
// We created the file (O_EXCL). *retry: a remover took it for a stale root; start over.
[[nodiscard]] mrc_status_t create_root(const Resolved &r, mrc_seg_domain *d, bool observer, int fd,
                                       bool *retry);
// The root exists (or, for an observer, may exist). *retry: it went away or is being torn down;
// start over.
[[nodiscard]] mrc_status_t join_root(const Resolved &r, mrc_seg_domain *d, bool observer,
                                     uint64_t deadline, bool *retry);

// ---- files.cc: files and the window --------------------------------------------------------
bool same_file(int fd, const char *name);
[[nodiscard]] mrc_status_t reserve_window(uint64_t base, uint64_t size);
// The segment file of `e`, unlinked when it is ours (owned by the domain's uid).
void unlink_segment_file(mrc_seg_domain *d, const SegEntry &e);

// ---- bitmap.cc: the page bitmap and the client bitmaps -------------------------------------
// Page indexes are bounded by the window's pages as validated at join (mrc_seg_domain::va_pages,
// at most kMaxVaPages); a range outside them is ignored.
bool page_used(const RootHeader *root, uint64_t i);
void mark_pages(RootHeader *root, uint64_t window_pages, uint64_t first, uint64_t count, bool used);
// First fit among the window's pages (d->va_pages) that no one uses: a page is used when the
// page bitmap, a live directory entry with a valid range, or one of this process's own mappings
// (d->maps) says so. The bitmap is shared memory (docs/DESIGN.md, "Shared segments: shared memory
// is input"): a corrupted one must not place a new segment over a live one. The number of the
// first page, or ~0.
uint64_t find_pages(const mrc_seg_domain *d, const RootHeader *root, uint64_t count);
bool has_clients(const SegEntry &e);
unsigned count_clients(const SegEntry &e);
bool client_bit(const SegEntry &e, unsigned slot);
void set_client_bit(SegEntry &e, unsigned slot, bool on);

// ---- directory.cc: directory and clients (all *_locked) ------------------------------------
// The limits entries are checked against (validate.h): this process's window, and the
// generations handed out so far.
WindowLimits window_limits(const mrc_seg_domain *d);
// The file name of entry `e`; false (and no name) when its name field is not a valid name.
bool entry_file_name(const mrc_seg_domain *d, const SegEntry &e, char (&out)[160]);
void teardown_entry_locked(mrc_seg_domain *d, unsigned index);
void release_slot_locked(mrc_seg_domain *d, unsigned slot);
// A slot whose presence lock nobody holds belongs to a dead process.
unsigned reap_dead_locked(mrc_seg_domain *d);
unsigned live_clients_locked(const mrc_seg_domain *d);
void fill_slot(RootHeader *root, unsigned s);
int claim_slot_locked(mrc_seg_domain *d);
void repair_locked(mrc_seg_domain *d);
// The last client is gone: remove everything. REQUIRES: no live client.
void teardown_domain_locked(mrc_seg_domain *d);
// What a file in /dev/shm is to the domain: not of its prefix, its root, a segment file a
// directory entry names, an orphan (the domain's own file that no entry names: a leak), or a
// foreign file (of the prefix's name space, but not the domain's: another user's, or not a
// regular file; left alone by check, repair and remove, listed by describe).
enum class ShmFile { Other, Root, Segment, Orphan, Foreign };
ShmFile classify_shm_file_locked(const mrc_seg_domain *d, const char *file);
// Unlinks the orphans.
void remove_orphans_locked(mrc_seg_domain *d);

}  // namespace mrc::seg
