// SPDX-License-Identifier: BSD-3-Clause
// The watch table, private to uffd/ (its face is watches.h): what is registered with the
// userfaultfd (entries), and how many watches each part of the address space carries (pieces).
// Why the rules below hold: docs/DESIGN.md, "The watch table" and "The watch table's fast path".
//
//   1. A watch registers every whole VMA it touches, never a part, in every mode; the brk heap
//      (start_brk to the break) page by page. The monitor's memory (WatchConfig) is never watched.
//   2. Entries: ranges known registered, sorted, disjoint, never adjacent (touching ones coalesce).
//      forget() cuts out what an UNMAP or REMAP record says the kernel dropped.
//   3. An entry is recorded only if, after UFFDIO_REGISTER, one VMA still covers what was asked.
//   4. Pieces count watches. A watch makes a piece where it finds none, as large as the free space
//      around it in its entry. A piece never changes shape while it counts a watch, and keeps every
//      entry it overlaps in use until its last watch leaves; an entry no piece overlaps is idle.
//   5. Idle entries stay registered up to config_.idle_limit (oldest evicted first, evict_idle()).
//   6. vmas_added() = 2 x entries stays under the VMA budget: past it idle entries go, then watch()
//      answers NotMonitorable.
//   7. The window: until the monitor has read an UNMAP/REMAP, its stale entry answers watches of
//      memory mapped afresh there. A watch after probe_unmaps() answered Read is outside it.
//
// SYNCHRONIZATION
//   1. Every member but try_*_fast runs under the monitor's registry mutex; the monitor thread
//      never touches the table. Allocation (nothrow) is allowed. No destructors: reset() frees
//      (through the epoch domain where readers may hold the memory).
//   2. PieceCount::watches: changed under the mutex and, lock-free, by try_*_fast (CAS loops,
//      relaxed): a fast watch adds only to a count >= 1, a fast unwatch takes only from one >= 2.
//   3. A count crosses zero only under the mutex: the unwatch that takes it to 0 removes the piece
//      in the same critical section; reset() stores 0 into every count it drops. Only the mutex
//      holder revives a count (revivable(): same shape, inside a registered entry).
//   4. published_ (the snapshot): rebuilt by the mutex holder in publish(), stored with release;
//      try_*_fast load it with acquire inside an EpochGuard of the process-wide domain.
//   5. A replaced snapshot is retired before the PieceCounts of pieces it showed that left the
//      table. retire() runs under the mutex (then the domain's); no reclaim callback may take it.
//   6. A snapshot may lag the table only by pieces that left it (count 0 until revived) and by
//      entries unregistered as idle.
//   7. withdraw() (release store of null) precedes every drain that calls forget(); the drain then
//      advances the internal subscription's cursor (release). try_watch_fast's caller checks that
//      subscription's quiescent() (acquire) before the snapshot is loaded.
//   8. g_registrations, g_snapshots and g_before_register are relaxed: they publish nothing.
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
