// SPDX-License-Identifier: BSD-3-Clause
// The watch table, private to uffd/ (its face is watches.h): what is registered with the
// userfaultfd, and how many watches each part of the address space carries.
//
// Registration follows the kernel's VMAs. In every mode a watch registers every whole VMA
// (mapping) it touches, never a part of one: registering part of a VMA splits it, and the
// application's mremap of a range that spans several VMAs fails with EFAULT (a grow always; a
// move too before Linux 6.17, and from 6.17 on whenever one of the VMAs is registered, which the
// kernel cannot move along with others; 6.18 moves the first VMA before it fails). In MISSING
// mode the monitor thread then resolves the faults of the whole mapping; it must never fault on
// a watched page itself, so no mapping that holds what it touches is watched (WatchConfig), and
// it runs no code a program may interpose (monitor_thread.cc). The brk heap (between start_brk
// and the break) is registered exactly, in every mode: nothing mremaps the heap, brk() grows and
// shrinks it whatever its VMAs, and registering all of it made every free() that trims the heap,
// and every madvise of its free memory, wait for the monitor although no registration lay there
// (docs/DESIGN.md, "Watching").
//
// Two records:
//  - Entries: the ranges known to be registered, sorted, disjoint and never adjacent (touching
//    ones are coalesced; the kernel merges adjacent registered VMAs where it can). Every byte of
//    an entry is registered with our userfaultfd, up to the window below. The kernel drops the
//    registration of whatever is unmapped or moved away (the moved VMA keeps it at its new
//    address, where no entry records it: a watch there registers it again, a no-op) and says so
//    with an UNMAP or REMAP record of the old range; forget() cuts those bytes out. A watch that
//    lies inside one entry costs no syscall.
//  - Pieces: the units watches are counted in. A watch that finds no piece under part of its
//    range creates one there, as large as the free space around it inside the watch's entry, so
//    a mapping's first watch makes one piece for the whole mapping and the next ones count in
//    it. A piece never changes shape while it counts a watch: every piece an unwatch finds under
//    its range is one its watch counted in, so neighbours never unwatch each other. Entries do
//    change shape under the pieces (unmaps, new mappings in the holes); a piece then keeps every
//    entry it overlaps in use until its last watch leaves. An entry no piece overlaps is idle.
//
// Idle entries stay registered, so that a watch after the last one left is a count increment,
// up to a limit (oldest evicted first): an idle registered mapping costs the application one
// monitor round trip per munmap/madvise in it, and keeps the kernel from merging it with its
// neighbours.
//
// After UFFDIO_REGISTER the mapping is looked up again: an entry is recorded only if one VMA
// still covers what was registered. Registering a range registers the VMAs present and skips
// holes; had the application unmapped part of an unregistered VMA in between (no event) and
// mapped memory there again, an entry over it would answer watches of memory that nothing
// registered, and that memory's unmap would never be seen.
//
// VMA accounting: a registered entry adds at most two VMAs (neighbours it keeps from merging
// with it; in the brk heap, the splits at its edges). vmas_added() = 2 x entries is that
// upper bound, kept under the budget from vm.max_map_count: past it idle entries go first, then
// watch() answers NotMonitorable rather than let the application's next mmap fail with ENOMEM.
//
// The window: the kernel removes a VMA before it queues the UNMAP/REMAP event. Until the monitor
// has read it, an entry can cover memory another thread has already mapped afresh at the same
// address; a watch there is answered from the stale entry and registers nothing. A watch made
// after Subscription::probe_unmaps() answered Read (an exact cache's get probes first) is outside
// the window: the unmap's record is then published or `pending` raised, so the internal
// subscription is not quiescent and the table is synced first (docs/DESIGN.md, "Exact under
// concurrent unmaps"). Without the probe (fast mode), the record, once drained, invalidates
// what was cached there and cuts the entry, so the next watch there registers.
//
// The lock-free fast path: a watch that lies inside one registered entry and one piece that
// already counts a watch, and an unwatch that leaves its piece a watch, change nothing but that
// piece's count. Counts live in objects of their own (PieceCount) that the table and a published
// snapshot (entries and pieces, shapes only) share, so such calls need neither the registry mutex
// nor the table: try_watch_fast() / try_unwatch_fast(). Everything else (a first watch, a count
// that crosses zero, registration, idle entries, eviction, forget, reset) takes the mutex.
//
// SYNCHRONIZATION
//   The table (entries_, pieces_, the totals, config_, the counter lists): every member function
//   not named try_*_fast runs under the monitor's registry mutex. The monitor thread never touches
//   it. Allocation (nothrow) is allowed here: this is never the monitor thread. No destructors: the
//   table lives in a process-wide object that must stay usable while other threads run at exit;
//   reset() frees the memory (through the epoch domain where readers may hold it).
//   PieceCount::watches: changed by the mutex holder and, lock-free, by try_*_fast. A count
//   crosses zero only under the mutex: the fast watch adds only to a count >= 1 and the fast
//   unwatch subtracts only from a count >= 2 (CAS loops); the locked unwatch that takes it to 0
//   removes the piece from the table in the same critical section, and reset() stores 0 into
//   every count it drops. So no fast path can revive a count after the mutex holder decided that
//   its piece is gone (and may unregister what it kept in use). Only the mutex holder may: a
//   later watch that needs a piece of exactly that shape again (revivable()) puts the same count
//   back into the table, inside a registered entry, before it adds to it. Relaxed: the count
//   publishes nothing; the atomicity of the read-modify-writes is the whole protocol.
//   published_ (the snapshot): rebuilt by the mutex holder at the end of a locked call when
//   the table gained a piece or an entry or forgot one (publish(); in a large table only every
//   so many such calls, like a snapshot whose allocation failed), and stored with a release;
//   try_*_fast load it (acquire, pairs with that store: the snapshot's contents, and the
//   UFFDIO_REGISTER of every entry in it, happen before the reader sees them) inside an
//   EpochGuard of the process-wide domain. A replaced snapshot, and then the PieceCounts of
//   pieces it showed that left the table, are retired to that domain (in that order: a count
//   retired while a published snapshot shows it could be freed under a reader that loads that
//   snapshot after the retire), so no reader touches freed memory. retire() runs under the
//   registry mutex (lock order: registry mutex, then the epoch domain's, as in the fork
//   handlers) and may run other objects' reclaim callbacks: none may take the registry mutex.
//   A published snapshot may be older than the table in two ways only, both safe to act on:
//   it may show pieces that left the table (their count is 0 until the mutex holder revives
//   one, with the same shape, inside a registered entry) and entries unregistered as idle (no
//   piece in the table overlapped them then). So when try_watch_fast finds a count >= 1, its
//   piece is in the table with the shape shown (pieces never change shape while they count),
//   the piece lay inside a registered entry when it was (re)made, and registered memory under a
//   piece in the table is lost only to an unmap (forget), which the snapshot reflects:
//   forget() runs only while draining the monitor's records, and withdraw() (a release
//   store of null) precedes that drain; the drain advances the internal subscription's cursor
//   (release) after it. The fast watch checks that subscription's quiescent() (acquire) before it
//   loads the snapshot: if it sees the cursor past a record it sees null or a later snapshot;
//   if records are pending or unapplied it takes the slow path. So a watch that starts after an
//   unmap returned never trusts an entry that unmap cut (the pending protocol of subscription.h).
//   g_registrations and g_snapshots (statistics) and g_before_register (test-only, set by the
//   thread that then watches) are relaxed atomics: nothing is published through them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/epoch.h"
#include "base/proc_maps.h"
#include "mrcache/mrcache.h"
#include "uffd/watches.h"

namespace mrc::uffd::detail {

// Idle entries kept registered by default (testing::set_idle_vmas changes it).
inline constexpr uint64_t kDefaultIdleLimit = 32;

struct WatchConfig {
  int uffd = -1;
  uint64_t register_mode = 0;  // UFFDIO_REGISTER_MODE_*
  mrc_monitor_mode_t mode = MRC_MONITOR_UNCACHED;
  uint64_t vma_budget = 0;
  uint64_t idle_limit = 0;  // idle entries kept registered
  // The monitor's own memory (thread stack, queue): never watched, because in MISSING mode a
  // fault there would wait for the monitor itself.
  uintptr_t own[2][2] = {{0, 0}, {0, 0}};
  // The state the monitor thread reads (g_monitor, g_paused), in the library's data or, linked
  // statically, the application's: in MISSING mode no mapping that holds it is watched either.
  uintptr_t state[2][2] = {{0, 0}, {0, 0}};
  // Where the brk heap starts (os::brk_heap_start(); 0: unknown, the heap is watched whole).
  uintptr_t brk_heap_start = 0;
};

class WatchTable {
 public:
  constexpr WatchTable() = default;
  WatchTable(const WatchTable &) = delete;
  WatchTable &operator=(const WatchTable &) = delete;

  // Forgets everything and adopts a new userfaultfd (after start, or after fork).
  void reset(const WatchConfig &config) noexcept;

  // Lock-free, any thread, inside an EpochGuard of epoch_domain(). REQUIRES: start < end, both
  // page-aligned. try_watch_fast counts a watch of [start, end) when one registered entry and
  // one piece that already counts a watch cover it; try_unwatch_fast drops up to `count` watches
  // of it in one step when one piece covers it, keeping at least one, and returns how many it
  // dropped. false / fewer than asked: take the mutex and call watch() / unwatch() for the rest.
  // REQUIRES for try_watch_fast: the caller saw the monitor's internal subscription quiescent()
  // after entering the guard (see SYNCHRONIZATION).
  [[nodiscard]] bool try_watch_fast(uintptr_t start, uintptr_t end) const noexcept;
  [[nodiscard]] size_t try_unwatch_fast(uintptr_t start, uintptr_t end,
                                        size_t count = 1) const noexcept;
  // Makes the fast path see the table's pieces and entries (when it gained some or forgot some
  // since the last call; see SYNCHRONIZATION for what a snapshot may still show). A snapshot
  // copies the whole table, so past kPublishAlways items a new one is made only once the locked
  // calls since the last one number an eighth of the table: a first watch of each of n mappings
  // then costs O(1) copies on average instead of O(n) (the fast path meanwhile takes the mutex
  // for what the snapshot lacks). Without memory for a snapshot the fast path stays off until a
  // later call succeeds.
  void publish() noexcept;
  // Turns the fast path off until the next publish(): before records that cut entries are applied.
  void withdraw() noexcept;

  // REQUIRES: start < end, both page-aligned. NotMonitorable leaves no watch counted; mappings it
  // registered before it failed stay as idle entries.
  [[nodiscard]] WatchResult watch(uintptr_t start, uintptr_t end, char *why, size_t why_len);
  void unwatch(uintptr_t start, uintptr_t end) noexcept;
  // The kernel dropped the registration of [start, end): an UNMAP record (`unmap`) or a REMAP
  // one. An unmap that cut a hole in a registered mapping may have been a MAP_FIXED: the new
  // mapping there is registered too (write-protect modes), so that the kernel can merge it with
  // its registered neighbours as it would have without us (else the application's mremap of
  // the whole range fails: Linux 6.17+ refuses a multi-VMA move with a registered VMA in it).
  void forget(uintptr_t start, uintptr_t end, bool unmap) noexcept;
  // Records were lost: any registration may be gone.
  void forget_all() noexcept;

  // Idle entries past the limit, or a watch that wanted room under the VMA budget: once no unmap
  // is in flight (else later: it never waits), the caller drains, then calls evict_idle() (it
  // unregisters; an entry still standing for memory already unmapped could cover someone else's
  // mapping by now).
  bool wants_eviction() const noexcept { return idle_ > config_.idle_limit || wants_room(); }
  // The last watch() failed for want of room under the VMA budget, and idle entries hold some.
  bool wants_room() const noexcept { return room_wanted_ && idle_ > 0; }
  // Unregisters idle entries, oldest first, until wants_eviction() is false.
  void evict_idle() noexcept;

  uint64_t watched_bytes() const noexcept { return watched_bytes_; }
  uint64_t vmas_added() const noexcept { return 2 * static_cast<uint64_t>(entries_.count); }
  uint64_t vma_budget() const noexcept { return config_.vma_budget; }

 private:
  struct Entry {
    uintptr_t start;
    uintptr_t end;
    uint64_t pieces;      // pieces overlapping it
    uint64_t idle_since;  // when `pieces` last fell to 0 (eviction order); 0 while in use
  };
  // A piece's watch count, on a line of its own (pieces of different mappings are counted by
  // different threads). The rest is the mutex holder's: `next` links counts allocated ahead of
  // need (spares_) and those of pieces that left the table while the published snapshot may
  // still show them (unpublished_, `listed`); `removed`: not in the table (revivable()).
  struct alignas(64) PieceCount {
    std::atomic<uint64_t> watches{0};
    PieceCount *next = nullptr;
    bool listed = false;
    bool removed = false;
  };
  struct Piece {
    uintptr_t start;
    uintptr_t end;
    PieceCount *count;
  };
  struct Span {
    uintptr_t start;
    uintptr_t end;
  };
  // What the fast path reads: the entries' and the pieces' shapes, sorted, in one allocation
  // (the two arrays follow the header).
  struct Snapshot {
    size_t entry_count;
    size_t piece_count;
    const Span *entries() const noexcept { return reinterpret_cast<const Span *>(this + 1); }
    const Piece *pieces() const noexcept {
      return reinterpret_cast<const Piece *>(entries() + entry_count);
    }
  };
  // A sorted array of disjoint ranges (entries or pieces).
  template <class T>
  struct Ranges {
    T *items = nullptr;
    size_t count = 0;
    size_t capacity = 0;
    // Index of the first item whose end lies above `address` (count if none).
    size_t first_ending_above(uintptr_t address) const noexcept;
    // Index of the first item that starts at or above `address` (count if none).
    size_t first_starting_from(uintptr_t address) const noexcept;
    // How many items overlap [start, end).
    size_t overlapping(uintptr_t start, uintptr_t end) const noexcept {
      return first_starting_from(end) - first_ending_above(start);
    }
    [[nodiscard]] bool reserve(size_t more) noexcept;
    // REQUIRES: reserve() made room.
    void insert_at(size_t index, const T &item) noexcept;
    void erase_at(size_t index) noexcept;
    void release() noexcept;
  };

  const Entry *containing(uintptr_t address) const noexcept;
  bool acceptable(const os::Vma &mapping, char *why, size_t why_len) const noexcept;
  // Whether the mapping is part of the brk heap (watched exactly, not whole).
  bool in_brk_heap(const os::Vma &mapping) const noexcept;
  bool register_from(uintptr_t at, uintptr_t end, uintptr_t *next, char *why, size_t why_len);
  [[nodiscard]] bool record(uintptr_t start, uintptr_t end) noexcept;
  void adopt_replacement(uintptr_t start, uintptr_t end) noexcept;
  void account(Entry *entry, bool add) noexcept;
  [[nodiscard]] bool count_watch(uintptr_t start, uintptr_t end) noexcept;
  void pieces_changed(uintptr_t start, uintptr_t end, bool added) noexcept;
  void unregister_entry(size_t index) noexcept;
  void unregister(uintptr_t start, uintptr_t end) noexcept;
  void destroy_all() noexcept;
  [[nodiscard]] bool stock_spares(size_t count) noexcept;
  PieceCount *take_spare() noexcept;
  PieceCount *revivable(uintptr_t start, uintptr_t end) const noexcept;
  void drop_count(PieceCount *count) noexcept;
  void replace_snapshot(const Snapshot *fresh) noexcept;
  static void reclaim_count(void *count) noexcept;
  static void reclaim_snapshot(void *snapshot) noexcept;

  WatchConfig config_;
  Ranges<Entry> entries_;
  Ranges<Piece> pieces_;
  uint64_t watched_bytes_ = 0;
  uint64_t idle_ = 0;        // entries with no piece
  uint64_t idle_clock_ = 0;  // ticks whenever an entry falls idle
  bool room_wanted_ = false;
  // The snapshot lacks a piece or an entry the table has (or it was withdrawn): publish()
  // rebuilds it. Pieces and entries that left the table do not make it stale (see publish()).
  bool stale_ = false;
  static constexpr size_t kPublishAlways = 64;  // entries + pieces copied at every publish()
  static constexpr size_t kPublishRatio = 8;    // beyond: one copy per table/8 stale calls
  size_t stale_calls_ = 0;                      // publish() calls while stale, since the last copy
  PieceCount *spares_ = nullptr;
  // Retired only after the snapshot that shows them is replaced: a reader that loads that
  // snapshot after their retire() would not be waited for.
  PieceCount *unpublished_ = nullptr;
  std::atomic<const Snapshot *> published_{nullptr};
};

// UFFDIO_REGISTER calls since the process started (testing::registrations()).
extern std::atomic<uint64_t> g_registrations;
// Snapshots published since the process started (testing::snapshots()).
extern std::atomic<uint64_t> g_snapshots;
// testing::set_before_register_hook.
extern std::atomic<void (*)(uintptr_t, uintptr_t)> g_before_register;

}  // namespace mrc::uffd::detail
