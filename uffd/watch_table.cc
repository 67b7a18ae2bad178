// SPDX-License-Identifier: BSD-3-Clause
// Watched ranges: the rules in internal/watch_table.h, the model in docs/DESIGN.md, "The watch
// table".
#include "uffd/internal/watch_table.h"

#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>

#include "base/check.h"
#include "uffd/internal/kernel.h"
#include "uffd/internal/plumbing.h"
#include "uffd/modes.h"

namespace mrc::uffd::detail {

std::atomic<uint64_t> g_registrations{0};
std::atomic<uint64_t> g_snapshots{0};
std::atomic<void (*)(uintptr_t, uintptr_t)> g_before_register{nullptr};

namespace {

// Registrations tried when the mapping changed between the lookup and the check after it.
constexpr int kRegisterAttempts = 4;
constexpr size_t kFirstCapacity = 16;

void explain_errno(char *why, size_t why_len, const char *what, int error, uintptr_t start,
                   uintptr_t end, mrc_monitor_mode_t mode) noexcept {
  if (why == nullptr || why_len == 0) return;
  const char *meaning;
  switch (error) {
    case EBUSY: meaning = "another userfaultfd already watches it"; break;
    case EINVAL: meaning = "the kernel cannot watch this kind of mapping in this mode"; break;
    case EPERM: meaning = "the mapping can never be written (read-only shared file)"; break;
    case ENOMEM: meaning = "the kernel's VMA limit was reached"; break;
    default: meaning = strerrordesc_np(error); break;  // strerror() is not thread-safe
  }
  if (meaning == nullptr) meaning = "unknown error";
  snprintf(why, why_len, "%s [%#" PRIxPTR ", %#" PRIxPTR ") failed in %s mode: %s (%s)", what,
           start, end, mode_name(mode), meaning, strerrorname_np(error));
}

bool overlaps(uintptr_t a0, uintptr_t a1, uintptr_t b0, uintptr_t b1) noexcept {
  return a0 < b1 && b0 < a1;
}

// The item of a sorted array of disjoint ranges that contains [start, end), or nullptr.
template <class T>
const T *covering(const T *items, size_t count, uintptr_t start, uintptr_t end) noexcept {
  const T *found = std::partition_point(items, items + count,
                                        [start](const T &item) { return item.end <= start; });
  return found != items + count && found->start <= start && found->end >= end ? found : nullptr;
}

}  // namespace

// ---- Ranges ----

template <class T>
size_t WatchTable::Ranges<T>::first_ending_above(uintptr_t address) const noexcept {
  const T *found = std::partition_point(items, items + count,
                                        [address](const T &item) { return item.end <= address; });
  return static_cast<size_t>(found - items);
}

template <class T>
size_t WatchTable::Ranges<T>::first_starting_from(uintptr_t address) const noexcept {
  const T *found = std::partition_point(items, items + count,
                                        [address](const T &item) { return item.start < address; });
  return static_cast<size_t>(found - items);
}

template <class T>
bool WatchTable::Ranges<T>::reserve(size_t more) noexcept {
  if (count + more <= capacity) return true;
  const size_t grown = std::max(kFirstCapacity, std::max(2 * capacity, count + more));
  T *fresh = new (std::nothrow) T[grown];
  if (fresh == nullptr) return false;
  std::copy(items, items + count, fresh);
  delete[] items;
  items = fresh;
  capacity = grown;
  return true;
}

template <class T>
void WatchTable::Ranges<T>::insert_at(size_t index, const T &item) noexcept {
  MRC_DASSERT(count < capacity && index <= count);
  std::copy_backward(items + index, items + count, items + count + 1);
  items[index] = item;
  ++count;
}

template <class T>
void WatchTable::Ranges<T>::erase_at(size_t index) noexcept {
  std::copy(items + index + 1, items + count, items + index);
  --count;
}

template <class T>
void WatchTable::Ranges<T>::release() noexcept {
  delete[] items;
  items = nullptr;
  count = 0;
  capacity = 0;
}

// ---- WatchTable: entries and pieces ----

const WatchTable::Entry *WatchTable::containing(uintptr_t address) const noexcept {
  const size_t at = entries_.first_ending_above(address);
  return at < entries_.count && entries_.items[at].start <= address ? &entries_.items[at] : nullptr;
}

// Adds (or removes) the entry's bytes and idleness to (from) the totals. On add, the pieces over
// it are counted afresh (its shape is new).
void WatchTable::account(Entry *entry, bool add) noexcept {
  const uint64_t bytes = entry->end - entry->start;
  if (add) {
    entry->pieces = pieces_.overlapping(entry->start, entry->end);
    entry->idle_since = entry->pieces == 0 ? ++idle_clock_ : 0;
    watched_bytes_ += bytes;
    idle_ += entry->pieces == 0 ? 1u : 0u;
  } else {
    watched_bytes_ -= bytes;
    idle_ -= entry->pieces == 0 ? 1u : 0u;
  }
}

// A piece [start, end) appeared or went: so did one piece of each entry it overlaps.
void WatchTable::pieces_changed(uintptr_t start, uintptr_t end, bool added) noexcept {
  for (size_t at = entries_.first_ending_above(start);
       at < entries_.count && entries_.items[at].start < end; ++at) {
    Entry &entry = entries_.items[at];
    if (added) {
      if (entry.pieces++ == 0) {
        --idle_;
        entry.idle_since = 0;
      }
    } else {
      MRC_DASSERT(entry.pieces > 0);
      if (--entry.pieces == 0) {
        ++idle_;
        entry.idle_since = ++idle_clock_;
      }
    }
  }
}

// [start, end) is registered: one entry with every entry it overlaps or touches.
bool WatchTable::record(uintptr_t start, uintptr_t end) noexcept {
  const size_t first = entries_.first_ending_above(start - 1);  // ends at `start` or later
  size_t last = first;
  uintptr_t merged_start = start;
  uintptr_t merged_end = end;
  for (; last < entries_.count && entries_.items[last].start <= end; ++last) {
    merged_start = std::min(merged_start, entries_.items[last].start);
    merged_end = std::max(merged_end, entries_.items[last].end);
  }
  stale_ = true;
  if (last == first) {
    if (!entries_.reserve(1)) return false;
    entries_.insert_at(first, Entry{merged_start, merged_end, 0, 0});
  } else {
    for (size_t i = first; i < last; ++i) account(&entries_.items[i], false);
    for (size_t i = first + 1; i < last; ++i) entries_.erase_at(first + 1);
    entries_.items[first] = Entry{merged_start, merged_end, 0, 0};
  }
  account(&entries_.items[first], true);
  return true;
}

void WatchTable::forget(uintptr_t start, uintptr_t end, bool unmap) noexcept {
  if (start >= end) return;
  bool hole = false;  // registered memory is left next to [start, end)
  for (size_t at = entries_.first_ending_above(start);
       at < entries_.count && entries_.items[at].start < end;) {
    stale_ = true;
    const Entry old = entries_.items[at];
    account(&entries_.items[at], false);
    const bool left = old.start < start;
    const bool right = old.end > end;
    hole = hole || left || right;
    if (left && right && entries_.reserve(1)) {  // out of memory: forget the right part too
      entries_.items[at].end = start;
      entries_.insert_at(at + 1, Entry{end, old.end, 0, 0});
      account(&entries_.items[at], true);
      account(&entries_.items[at + 1], true);
      at += 2;
    } else if (left) {
      entries_.items[at].end = start;
      account(&entries_.items[at], true);
      ++at;
    } else if (right) {
      entries_.items[at].start = end;
      account(&entries_.items[at], true);
      ++at;
    } else {
      entries_.erase_at(at);
    }
  }
  if (unmap && hole) adopt_replacement(start, end);
}

// A mapping that lies inside the hole an unmap cut into registered memory, and so was most
// likely mapped over it (MAP_FIXED), is registered whole.
void WatchTable::adopt_replacement(uintptr_t start, uintptr_t end) noexcept {
  os::Vma mapping;
  if (os::query_vma(start, &mapping) != MRC_OK || mapping.start < start || mapping.end > end) {
    return;  // a plain hole, or a mapping that reaches beyond it
  }
  if (!acceptable(mapping, nullptr, 0)) return;
  uintptr_t next;
  (void)register_from(mapping.start, mapping.end, &next, nullptr, 0);
}

void WatchTable::forget_all() noexcept {
  stale_ = true;
  entries_.count = 0;
  watched_bytes_ = 0;
  idle_ = 0;
  room_wanted_ = false;
}

// Counts one watch of [start, end), which lies inside one entry: in every piece under it, and in
// new pieces where there is none.
bool WatchTable::count_watch(uintptr_t start, uintptr_t end) noexcept {
  size_t first = pieces_.first_ending_above(start);
  if (first < pieces_.count && pieces_.items[first].start <= start &&
      pieces_.items[first].end >= end) {
    // One piece covers it (the fast path missed it only by a race, or took the mutex anyway).
    pieces_.items[first].count->watches.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const Entry *entry = containing(start);
  MRC_CHECK(entry != nullptr && entry->end >= end);
  const uintptr_t entry_start = entry->start;
  const uintptr_t entry_end = entry->end;
  // Gaps under [start, end): one before each piece that starts inside, and one after the last.
  size_t gaps = 0;
  uintptr_t at = start;
  for (size_t i = first; i < pieces_.count && pieces_.items[i].start < end; ++i) {
    gaps += pieces_.items[i].start > at ? 1 : 0;
    at = pieces_.items[i].end;
  }
  gaps += at < end ? 1 : 0;
  if (!pieces_.reserve(gaps) || !stock_spares(gaps)) return false;
  // Fill each gap with a piece as wide as the free space around it inside the entry.
  at = start;
  for (size_t i = first;; ++i) {
    const bool piece_here = i < pieces_.count && pieces_.items[i].start < end;
    const uintptr_t gap_end = piece_here ? pieces_.items[i].start : end;
    if (gap_end > at) {
      const uintptr_t lo = i > 0 ? std::max(entry_start, pieces_.items[i - 1].end) : entry_start;
      const uintptr_t hi =
          i < pieces_.count ? std::min(entry_end, pieces_.items[i].start) : entry_end;
      PieceCount *count = revivable(lo, hi);
      if (count != nullptr) {
        count->removed = false;  // the table and the snapshot agree again on this piece
      } else {
        count = take_spare();
        stale_ = true;
      }
      pieces_.insert_at(i, Piece{lo, hi, count});
      pieces_changed(lo, hi, true);
      ++i;
    }
    if (!piece_here) break;
    at = pieces_.items[i].end;
  }
  // A new piece goes from 0 to 1 here: unpublished, or revived (a fast path that shows it fails
  // on its 0 until then, and may count in it once the table holds it again).
  for (size_t i = pieces_.first_ending_above(start);
       i < pieces_.count && pieces_.items[i].start < end; ++i) {
    pieces_.items[i].count->watches.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

// Counters for `count` new pieces, allocated before the first is inserted, so that running out
// of memory leaves the table as it was.
bool WatchTable::stock_spares(size_t count) noexcept {
  size_t stocked = 0;
  for (const PieceCount *spare = spares_; spare != nullptr && stocked < count;
       spare = spare->next) {
    ++stocked;
  }
  for (; stocked < count; ++stocked) {
    PieceCount *fresh = new (std::nothrow) PieceCount;
    if (fresh == nullptr) return false;
    fresh->next = spares_;
    spares_ = fresh;
  }
  return true;
}

// The count of a piece of exactly [start, end) that the published snapshot still shows although
// the table dropped it (its last watch left; see publish()), or nullptr. REQUIRES: no piece of
// the table overlaps [start, end). Reusing it makes a mapping's watch after its last unwatch
// publish nothing.
WatchTable::PieceCount *WatchTable::revivable(uintptr_t start, uintptr_t end) const noexcept {
  const Snapshot *snapshot = published_.load(std::memory_order_relaxed);  // our own store
  if (snapshot == nullptr) return nullptr;
  const Piece *piece = covering(snapshot->pieces(), snapshot->piece_count, start, end);
  if (piece == nullptr || piece->start != start || piece->end != end) return nullptr;
  MRC_DASSERT(piece->count->removed && piece->count->watches.load() == 0);
  return piece->count;
}

WatchTable::PieceCount *WatchTable::take_spare() noexcept {
  PieceCount *count = spares_;
  MRC_CHECK(count != nullptr);  // stock_spares() made them
  spares_ = count->next;
  count->next = nullptr;
  count->watches.store(0, std::memory_order_relaxed);
  return count;
}

// ---- registration ----

bool WatchTable::acceptable(const os::Vma &mapping, char *why, size_t why_len) const noexcept {
  if (mapping.sysv_shm) {
    set_text(why, why_len,
             "SysV shared memory: the kernel reports no event for shmdt(), so a cached "
             "registration could outlive the mapping");
    return false;
  }
  for (const auto &own : config_.own) {
    if (own[0] != own[1] && overlaps(mapping.start, mapping.end, own[0], own[1])) {
      set_text(why, why_len, "the monitor's own memory is never watched");
      return false;
    }
  }
  if (config_.mode == MRC_MONITOR_MISSING) {
    // The monitor thread itself must never fault on a watched page: nothing could answer it. It
    // touches only its stack, the queue and its state, and pages of the mapping that holds its
    // state may be untouched (a .bss shared with the library's other globals, or with the
    // application's when it links the library statically).
    for (const auto &state : config_.state) {
      if (state[0] != state[1] && overlaps(mapping.start, mapping.end, state[0], state[1])) {
        set_text(why, why_len,
                 "missing mode never watches the mapping that holds the monitor's own state");
        return false;
      }
    }
    // Every page of the mapping not yet present faults to the monitor, which maps the zero page
    // (UFFDIO_ZEROPAGE). Shared memory could be answered so too (a zeroed page fills the file's
    // hole; it needs UFFD_FEATURE_MISSING_SHMEM), hugetlbfs only by a UFFDIO_COPY of a zeroed
    // huge page (it has no zero page). MISSING mode, the fallback of kernels without
    // write-protect registration, takes neither: their gets register uncached.
    static const size_t base_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    if (!mapping.anonymous || mapping.page_size != base_page) {
      set_text(why, why_len,
               "missing mode watches private anonymous memory only: the monitor resolves faults "
               "with zero pages, which would be wrong for shared, file or huge pages");
      return false;
    }
  }
  return true;
}

bool WatchTable::in_brk_heap(const os::Vma &mapping) const noexcept {
  // Mappings far above start_brk (the mmap area, tens of TiB away) are not asked about: the brk
  // syscall would cost every first watch there. Were a heap ever larger, it would just be watched
  // whole, as every mapping was before.
  constexpr uintptr_t kHeapReach = uintptr_t{1} << 40;
  if (config_.brk_heap_start == 0 || !mapping.anonymous || mapping.start < config_.brk_heap_start ||
      mapping.start - config_.brk_heap_start >= kHeapReach) {
    return false;
  }
  const auto brk_now = static_cast<uintptr_t>(syscall(SYS_brk, 0));  // the current break
  return mapping.start < brk_now;
}

// Registers the mapping at `at` (in the brk heap only its part in [at, end)), records it, and
// sets *next to the end of what it registered. REQUIRES: no entry contains `at`.
bool WatchTable::register_from(uintptr_t at, uintptr_t end, uintptr_t *next, char *why,
                               size_t why_len) {
  for (int attempt = 1;; ++attempt) {
    os::Vma mapping;
    const mrc_status_t status = os::query_vma(at, &mapping);
    if (status != MRC_OK) {
      if (why != nullptr && why_len > 0) {
        snprintf(why, why_len, "%#" PRIxPTR " is %s", at,
                 status == MRC_ERR_NOT_FOUND ? "not mapped" : "not readable in /proc/self/maps");
      }
      return false;
    }
    if (!acceptable(mapping, why, why_len)) return false;
    const bool exact = in_brk_heap(mapping);
    const uintptr_t lo = exact ? at : mapping.start;
    const uintptr_t hi = exact ? std::min(end, mapping.end) : mapping.end;

    // The entries this one will absorb (overlapping or touching) do not add to the count.
    const size_t absorbed =
        entries_.first_starting_from(hi + 1) - entries_.first_ending_above(lo - 1);
    const uint64_t entries_after = entries_.count + 1 - absorbed;
    if (2 * entries_after > config_.vma_budget) {
      room_wanted_ = idle_ > 0;
      if (why != nullptr && why_len > 0) {
        snprintf(why, why_len,
                 "watching would exceed the VMA budget (%zu registered mappings, up to 2 VMAs "
                 "each; budget %" PRIu64 ", from vm.max_map_count)",
                 entries_.count, config_.vma_budget);
      }
      return false;
    }

    if (auto *hook = g_before_register.load(std::memory_order_relaxed)) hook(lo, hi);
    uffdio_register request{};
    request.range.start = lo;
    request.range.len = hi - lo;
    request.mode = config_.register_mode;
    g_registrations.fetch_add(1, std::memory_order_relaxed);
    if (ioctl(config_.uffd, UFFDIO_REGISTER, &request) != 0) {
      const int error = errno;
      os::Vma now;
      const bool changed =
          os::query_vma(at, &now) != MRC_OK || now.start != mapping.start || now.end != mapping.end;
      if (changed && attempt < kRegisterAttempts) continue;
      explain_errno(why, why_len, "UFFDIO_REGISTER", error, lo, hi, config_.mode);
      return false;
    }
    // Only if one VMA still covers [lo, hi) was all of it registered (docs/DESIGN.md, "The watch
    // table"). A registration that fails this check stays in the kernel unrecorded: it costs
    // spurious events only.
    os::Vma after;
    if (os::query_vma(lo, &after) == MRC_OK && after.start <= lo && after.end >= hi) {
      if (!record(lo, hi)) {
        set_text(why, why_len, "out of memory");
        return false;
      }
      *next = hi;
      return true;
    }
    if (attempt == kRegisterAttempts) {
      if (why != nullptr && why_len > 0) {
        snprintf(why, why_len, "the mapping at %#" PRIxPTR " kept changing while it was watched",
                 at);
      }
      return false;
    }
  }
}

void WatchTable::unregister(uintptr_t start, uintptr_t end) noexcept {
  uffdio_range range{start, end - start};
  if (ioctl(config_.uffd, UFFDIO_UNREGISTER, &range) == 0 || errno != EINVAL) return;
  // EINVAL: a mapping in the range cannot be watched at all (it appeared after an unmap). The
  // kernel refuses the whole range then; unregister mapping by mapping, ignoring failures.
  uintptr_t at = start;
  while (at < end) {
    os::Vma mapping;
    if (os::query_vma_from(at, &mapping) != MRC_OK || mapping.start >= end) return;
    uffdio_range part{std::max(at, mapping.start), 0};
    part.len = std::min(end, mapping.end) - part.start;
    (void)ioctl(config_.uffd, UFFDIO_UNREGISTER, &part);
    at = mapping.end;
  }
}

void WatchTable::unregister_entry(size_t index) noexcept {
  uintptr_t lo = entries_.items[index].start;
  uintptr_t hi = entries_.items[index].end;
  account(&entries_.items[index], false);
  entries_.erase_at(index);
  // Never leave a split behind: a VMA that grew in place (no event) carries our registration
  // past the entry. Take the whole VMA when no other entry and no watch lies in the rest.
  auto quiet = [this](uintptr_t from, uintptr_t to) {
    return entries_.overlapping(from, to) == 0 && pieces_.overlapping(from, to) == 0;
  };
  os::Vma mapping;
  if (os::query_vma(lo, &mapping) == MRC_OK && mapping.start < lo && quiet(mapping.start, lo)) {
    lo = mapping.start;
  }
  if (os::query_vma(hi - 1, &mapping) == MRC_OK && mapping.end > hi && quiet(hi, mapping.end)) {
    hi = mapping.end;
  }
  unregister(lo, hi);
}

void WatchTable::evict_idle() noexcept {
  while (wants_eviction()) {
    size_t victim = entries_.count;
    uint64_t oldest = UINT64_MAX;
    for (size_t i = 0; i < entries_.count; ++i) {
      const Entry &entry = entries_.items[i];
      if (entry.pieces == 0 && entry.idle_since < oldest) {
        oldest = entry.idle_since;
        victim = i;
      }
    }
    MRC_CHECK(victim < entries_.count);  // idle_ counts the entries without a piece
    unregister_entry(victim);
  }
  room_wanted_ = false;
}

// ---- WatchTable: public ----

void WatchTable::destroy_all() noexcept {
  // A reader with the old snapshot may still try these counts: 0 sends it to the mutex, where
  // the table is empty (the watch is forgotten, like every other).
  for (size_t i = 0; i < pieces_.count; ++i) {
    PieceCount *count = pieces_.items[i].count;
    count->watches.store(0, std::memory_order_relaxed);
    drop_count(count);
  }
  withdraw();
  while (spares_ != nullptr) delete take_spare();  // never published
  stale_ = false;
  stale_calls_ = 0;
  entries_.release();
  pieces_.release();
  watched_bytes_ = 0;
  idle_ = 0;
  idle_clock_ = 0;
  room_wanted_ = false;
}

void WatchTable::reset(const WatchConfig &config) noexcept {
  destroy_all();
  config_ = config;
}

WatchResult WatchTable::watch(uintptr_t start, uintptr_t end, char *why, size_t why_len) {
  MRC_DASSERT(start < end);
  if (config_.uffd < 0) {
    set_text(why, why_len, "the monitor runs uncached: nothing can be watched");
    return WatchResult::NotMonitorable;
  }
  const Entry *entry = containing(start);
  if (entry == nullptr || entry->end < end) {
    room_wanted_ = false;
    for (uintptr_t at = start; at < end;) {
      entry = containing(at);
      if (entry != nullptr) {
        at = entry->end;
        continue;
      }
      if (!register_from(at, end, &at, why, why_len)) return WatchResult::NotMonitorable;
    }
  }
  if (!count_watch(start, end)) {
    set_text(why, why_len, "out of memory");
    return WatchResult::NotMonitorable;
  }
  return WatchResult::Watched;
}

void WatchTable::unwatch(uintptr_t start, uintptr_t end) noexcept {
  // No piece here: the watch was forgotten (fork, a stopped monitor); nothing to release.
  for (size_t at = pieces_.first_ending_above(start);
       at < pieces_.count && pieces_.items[at].start < end;) {
    Piece &piece = pieces_.items[at];
    // Only the mutex holder takes a count from 1 to 0 (a fast unwatch leaves 1), and 0 is final
    // (a fast watch adds to 1 or more only): the piece goes now, with nobody still counting in it.
    const uint64_t before = piece.count->watches.fetch_sub(1, std::memory_order_relaxed);
    MRC_DASSERT(before > 0);
    if (before != 1) {
      ++at;
      continue;
    }
    const uintptr_t lo = piece.start;
    const uintptr_t hi = piece.end;
    drop_count(piece.count);
    pieces_.erase_at(at);
    pieces_changed(lo, hi, false);
  }
}

// ---- WatchTable: the lock-free fast path ----

bool WatchTable::try_watch_fast(uintptr_t start, uintptr_t end) const noexcept {
  const Snapshot *snapshot = published_.load(std::memory_order_acquire);
  if (snapshot == nullptr) return false;
  if (covering(snapshot->entries(), snapshot->entry_count, start, end) == nullptr) return false;
  const Piece *piece = covering(snapshot->pieces(), snapshot->piece_count, start, end);
  if (piece == nullptr) return false;
  std::atomic<uint64_t> &watches = piece->count->watches;
  uint64_t seen = watches.load(std::memory_order_relaxed);
  do {
    if (seen == 0) return false;  // gone, or going: its last watch left under the mutex
  } while (!watches.compare_exchange_weak(seen, seen + 1, std::memory_order_relaxed,
                                          std::memory_order_relaxed));
  return true;
}

size_t WatchTable::try_unwatch_fast(uintptr_t start, uintptr_t end, size_t count) const noexcept {
  const Snapshot *snapshot = published_.load(std::memory_order_acquire);
  if (snapshot == nullptr) return 0;
  const Piece *piece = covering(snapshot->pieces(), snapshot->piece_count, start, end);
  if (piece == nullptr) return 0;
  std::atomic<uint64_t> &watches = piece->count->watches;
  uint64_t seen = watches.load(std::memory_order_relaxed);
  uint64_t dropped = 0;
  do {
    if (seen < 2) return 0;  // the last watch (or a dropped table): the mutex decides
    dropped = std::min<uint64_t>(count, seen - 1);
  } while (!watches.compare_exchange_weak(seen, seen - dropped, std::memory_order_relaxed,
                                          std::memory_order_relaxed));
  return dropped;
}

void WatchTable::publish() noexcept {
  if (!stale_) return;
  const size_t items = entries_.count + pieces_.count;
  if (items > kPublishAlways && ++stale_calls_ * kPublishRatio < items) return;
  stale_calls_ = 0;
  const Snapshot *fresh = nullptr;
  if (config_.uffd >= 0 && pieces_.count != 0) {  // no piece: nothing the fast path could count
    const size_t bytes =
        sizeof(Snapshot) + entries_.count * sizeof(Span) + pieces_.count * sizeof(Piece);
    void *memory = ::operator new(bytes, std::nothrow);
    if (memory == nullptr) {
      withdraw();  // stays stale: the next call tries again
      return;
    }
    g_snapshots.fetch_add(1, std::memory_order_relaxed);
    auto *snapshot = new (memory) Snapshot{entries_.count, pieces_.count};
    auto *spans = reinterpret_cast<Span *>(snapshot + 1);
    for (size_t i = 0; i < entries_.count; ++i) {
      new (&spans[i]) Span{entries_.items[i].start, entries_.items[i].end};
    }
    auto *pieces = reinterpret_cast<Piece *>(spans + entries_.count);
    for (size_t i = 0; i < pieces_.count; ++i) new (&pieces[i]) Piece(pieces_.items[i]);
    fresh = snapshot;
  }
  replace_snapshot(fresh);
  stale_ = false;
}

void WatchTable::withdraw() noexcept {
  replace_snapshot(nullptr);
  stale_ = true;
}

// A piece left the table; its count is freed once no snapshot shows it (replace_snapshot).
void WatchTable::drop_count(PieceCount *count) noexcept {
  count->removed = true;
  if (count->listed) return;  // revived and dropped again since the last snapshot
  count->listed = true;
  count->next = unpublished_;
  unpublished_ = count;
}

void WatchTable::replace_snapshot(const Snapshot *fresh) noexcept {
  // Release: pairs with the fast path's acquire load (the contents, and the registrations of the
  // entries in it, before the pointer).
  const Snapshot *old = published_.exchange(fresh, std::memory_order_release);
  if (old != nullptr) epoch_domain().retire(const_cast<Snapshot *>(old), &reclaim_snapshot);
  // Only now: a count retired while a published snapshot shows it could be freed under a reader
  // that loads that snapshot after the retire.
  while (unpublished_ != nullptr) {
    PieceCount *count = unpublished_;
    unpublished_ = count->next;
    count->next = nullptr;
    count->listed = false;
    if (count->removed) epoch_domain().retire(count, &reclaim_count);  // else revived: in use
  }
}

void WatchTable::reclaim_count(void *count) noexcept { delete static_cast<PieceCount *>(count); }

void WatchTable::reclaim_snapshot(void *snapshot) noexcept { ::operator delete(snapshot); }

}  // namespace mrc::uffd::detail
