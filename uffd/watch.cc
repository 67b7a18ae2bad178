// Watched ranges (see watch.h for the model and the synchronization contract).
#include "uffd/watch.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>

#include "pgtable/check.h"
#include "uffd/internal.h"
#include "uffd/kernel.h"

namespace mrc::uffd::detail {

std::atomic<uint64_t> g_registrations{0};

struct Piece {
  uintptr_t start;
  uintptr_t end;
  uint64_t refs = 0;
  bool armed = false;
  bool ever_armed = false;
  // The edge was an edge of the mapping before we registered anything next to it: no split.
  bool vma_start_edge = false;
  bool vma_end_edge = false;
  Piece *created_next = nullptr;  // pieces created by the watch() in progress (for rollback)
};

// The pieces that intersect one block, sorted by start. Most blocks hold one piece.
struct BlockEntry {
  static constexpr uint32_t kInline = 3;
  uint32_t count = 0;
  uint32_t capacity = kInline;
  Piece **items = inline_items;
  Piece *inline_items[kInline] = {};

  BlockEntry() = default;
  BlockEntry(const BlockEntry &) = delete;
  BlockEntry &operator=(const BlockEntry &) = delete;
  ~BlockEntry() {
    if (items != inline_items) delete[] items;
  }

  bool insert(Piece *piece) noexcept {
    if (count == capacity) {
      const uint32_t grown = capacity * 2;
      Piece **bigger = new (std::nothrow) Piece *[grown];
      if (bigger == nullptr) return false;
      std::copy(items, items + count, bigger);
      if (items != inline_items) delete[] items;
      items = bigger;
      capacity = grown;
    }
    uint32_t at = count;
    while (at > 0 && items[at - 1]->start > piece->start) {
      items[at] = items[at - 1];
      --at;
    }
    items[at] = piece;
    ++count;
    return true;
  }

  void erase(const Piece *piece) noexcept {
    uint32_t at = 0;
    while (at < count && items[at] != piece) ++at;
    MRC_CHECK(at < count);
    for (; at + 1 < count; ++at) items[at] = items[at + 1];
    --count;
  }
};

namespace {

constexpr unsigned kBlockShift = 21;
static_assert(kWatchBlock == (size_t{1} << kBlockShift));

uint64_t block_of(uintptr_t address) noexcept { return address >> kBlockShift; }

uintptr_t align_down(uintptr_t value, uintptr_t alignment) noexcept {
  return value & ~(alignment - 1);
}

uintptr_t align_up(uintptr_t value, uintptr_t alignment) noexcept {
  return (value + alignment - 1) & ~(alignment - 1);
}

bool overlaps(uintptr_t a0, uintptr_t a1, uintptr_t b0, uintptr_t b1) noexcept {
  return a0 < b1 && b0 < a1;
}

const char *mode_word(mrc_monitor_mode_t mode) noexcept {
  switch (mode) {
    case MRC_MONITOR_WP_ASYNC: return "wp-async";
    case MRC_MONITOR_WP: return "wp";
    case MRC_MONITOR_MISSING: return "missing";
    case MRC_MONITOR_UNCACHED: break;
  }
  return "uncached";
}

void explain_errno(char *why, size_t why_len, const char *what, int error, uintptr_t start,
                   uintptr_t end, mrc_monitor_mode_t mode) noexcept {
  if (why == nullptr || why_len == 0) return;
  const char *meaning;
  switch (error) {
    case EBUSY: meaning = "another userfaultfd already watches it"; break;
    case EINVAL: meaning = "the kernel cannot watch this kind of mapping in this mode"; break;
    case EPERM: meaning = "the mapping can never be written (read-only shared file)"; break;
    case ENOMEM: meaning = "the kernel's VMA limit was reached"; break;
    default: meaning = strerror(error); break;
  }
  snprintf(why, why_len, "%s [%#" PRIxPTR ", %#" PRIxPTR ") failed in %s mode: %s (%s)", what,
           start, end, mode_word(mode), meaning, strerrorname_np(error));
}

}  // namespace

// ---- BlockMap ----

size_t BlockMap::home(uint64_t block) const noexcept {
  return static_cast<size_t>((block * 0x9E3779B97F4A7C15ull) >> (64 - bits_));
}

BlockEntry *BlockMap::find(uint64_t block) const noexcept {
  if (buckets_ == nullptr) return nullptr;
  for (size_t i = home(block);; i = (i + 1) & mask_) {
    const Bucket &bucket = buckets_[i];
    if (bucket.entry == nullptr) return nullptr;
    if (bucket.block == block) return bucket.entry;
  }
}

bool BlockMap::grow() noexcept {
  const unsigned bits = buckets_ == nullptr ? 6 : bits_ + 1;
  const size_t capacity = size_t{1} << bits;
  Bucket *fresh = new (std::nothrow) Bucket[capacity]();
  if (fresh == nullptr) return false;
  Bucket *old = buckets_;
  const size_t old_capacity = buckets_ == nullptr ? 0 : mask_ + 1;
  buckets_ = fresh;
  mask_ = capacity - 1;
  bits_ = bits;
  for (size_t i = 0; i < old_capacity; ++i) {
    if (old[i].entry == nullptr) continue;
    size_t at = home(old[i].block);
    while (buckets_[at].entry != nullptr) at = (at + 1) & mask_;
    buckets_[at] = old[i];
  }
  delete[] old;
  return true;
}

bool BlockMap::insert(uint64_t block, BlockEntry *entry) noexcept {
  if (buckets_ == nullptr || (size_ + 1) * 4 > (mask_ + 1) * 3) {
    if (!grow()) return false;
  }
  size_t at = home(block);
  while (buckets_[at].entry != nullptr) {
    MRC_DASSERT(buckets_[at].block != block);
    at = (at + 1) & mask_;
  }
  buckets_[at] = Bucket{block, entry};
  ++size_;
  return true;
}

void BlockMap::erase(uint64_t block) noexcept {
  if (buckets_ == nullptr) return;
  size_t hole = home(block);
  while (buckets_[hole].entry != nullptr && buckets_[hole].block != block) {
    hole = (hole + 1) & mask_;
  }
  if (buckets_[hole].entry == nullptr) return;
  buckets_[hole].entry = nullptr;
  --size_;
  // Backward-shift deletion: pull later members of the probe run into the hole when the hole
  // lies between their home and their current position.
  for (size_t at = (hole + 1) & mask_; buckets_[at].entry != nullptr; at = (at + 1) & mask_) {
    const size_t want = home(buckets_[at].block);
    const bool movable = hole <= at ? (want <= hole || want > at) : (want <= hole && want > at);
    if (movable) {
      buckets_[hole] = buckets_[at];
      buckets_[at].entry = nullptr;
      hole = at;
    }
  }
}

void BlockMap::reset() noexcept {
  delete[] buckets_;
  buckets_ = nullptr;
  mask_ = 0;
  bits_ = 0;
  size_ = 0;
}

// ---- WatchSet: the piece index ----

Piece *WatchSet::first_overlapping(uintptr_t from, uintptr_t to) const noexcept {
  for (uint64_t block = block_of(from), last = block_of(to - 1); block <= last; ++block) {
    const BlockEntry *entry = blocks_.find(block);
    if (entry == nullptr) continue;
    for (uint32_t i = 0; i < entry->count; ++i) {
      Piece *piece = entry->items[i];
      if (piece->start >= to) return nullptr;  // sorted: nothing later can overlap
      if (piece->end > from) return piece;
    }
  }
  return nullptr;
}

Piece *WatchSet::last_overlapping(uintptr_t from, uintptr_t to) const noexcept {
  for (uint64_t block = block_of(to - 1), first = block_of(from);; --block) {
    const BlockEntry *entry = blocks_.find(block);
    if (entry != nullptr) {
      for (uint32_t i = entry->count; i-- > 0;) {
        Piece *piece = entry->items[i];
        if (piece->end <= from) return nullptr;
        if (piece->start < to) return piece;
      }
    }
    if (block == first) return nullptr;
  }
}

Piece *WatchSet::piece_ending_at(uintptr_t address) const noexcept {
  Piece *piece = last_overlapping(address - 1, address);
  return piece != nullptr && piece->end == address ? piece : nullptr;
}

Piece *WatchSet::piece_starting_at(uintptr_t address) const noexcept {
  Piece *piece = first_overlapping(address, address + 1);
  return piece != nullptr && piece->start == address ? piece : nullptr;
}

bool WatchSet::link(Piece *piece) noexcept {
  const uint64_t first = block_of(piece->start);
  const uint64_t last = block_of(piece->end - 1);
  for (uint64_t block = first; block <= last; ++block) {
    BlockEntry *entry = blocks_.find(block);
    bool ok;
    if (entry == nullptr) {
      entry = new (std::nothrow) BlockEntry;
      ok = entry != nullptr && entry->insert(piece) && blocks_.insert(block, entry);
      if (!ok) delete entry;
    } else {
      ok = entry->insert(piece);
    }
    if (!ok) {
      // Undo the blocks linked so far.
      for (uint64_t undo = first; undo < block; ++undo) {
        BlockEntry *done = blocks_.find(undo);
        MRC_CHECK(done != nullptr);
        done->erase(piece);
        if (done->count == 0) {
          blocks_.erase(undo);
          delete done;
        }
      }
      return false;
    }
  }
  return true;
}

void WatchSet::unlink(Piece *piece) noexcept {
  for (uint64_t block = block_of(piece->start), last = block_of(piece->end - 1); block <= last;
       ++block) {
    BlockEntry *entry = blocks_.find(block);
    MRC_CHECK(entry != nullptr);
    entry->erase(piece);
    if (entry->count == 0) {
      blocks_.erase(block);
      delete entry;
    }
  }
}

// ---- VMA accounting ----

int64_t WatchSet::splits_at(uintptr_t address) const noexcept {
  const Piece *left = piece_ending_at(address);
  const Piece *right = piece_starting_at(address);
  if ((left != nullptr && left->vma_end_edge) || (right != nullptr && right->vma_start_edge)) {
    return 0;
  }
  const bool left_registered = left != nullptr && left->armed;
  const bool right_registered = right != nullptr && right->armed;
  return left_registered != right_registered ? 1 : 0;
}

int64_t WatchSet::splits_around(const Piece *piece) const noexcept {
  return splits_at(piece->start) + splits_at(piece->end);
}

void WatchSet::set_armed(Piece *piece, bool armed) noexcept {
  if (piece->armed == armed) return;
  const int64_t before = splits_around(piece);
  piece->armed = armed;
  if (armed) piece->ever_armed = true;
  vmas_added_ += splits_around(piece) - before;
  MRC_DASSERT(vmas_added_ >= 0);
  const uint64_t bytes = piece->end - piece->start;
  watched_bytes_ = armed ? watched_bytes_ + bytes : watched_bytes_ - bytes;
}

// ---- registration ----

bool WatchSet::acceptable(const Mapping &mapping, char *why, size_t why_len) const noexcept {
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

bool WatchSet::fill_gap(uintptr_t from, uintptr_t to, Piece **created, char *why, size_t why_len) {
  uintptr_t at = from;
  while (at < to) {
    Mapping mapping;
    const mrc_status_t status = query_mapping(at, &mapping);
    if (status != MRC_OK) {
      if (why != nullptr && why_len > 0) {
        snprintf(why, why_len, "%#" PRIxPTR " is %s", at,
                 status == MRC_ERR_NOT_FOUND ? "not mapped" : "not readable in /proc/self/maps");
      }
      return false;
    }
    if (!acceptable(mapping, why, why_len)) return false;
    // MISSING mode registers exactly what was asked for: a widened piece could take in memory
    // merged into the same VMA that the monitor thread itself touches for the first time (a
    // runtime's per-thread data), and that fault would wait for the monitor.
    const uintptr_t alignment = config_.mode == MRC_MONITOR_MISSING
                                    ? static_cast<uintptr_t>(mapping.page_size)
                                    : std::max<uintptr_t>(kWatchBlock, mapping.page_size);
    uintptr_t lo = std::max(mapping.start, align_down(at, alignment));
    uintptr_t hi = std::min(mapping.end, align_up(to, alignment));
    // [at, to) is free; widen into the free space around it only.
    if (lo < at) {
      if (const Piece *left = last_overlapping(lo, at)) lo = left->end;
    }
    if (const Piece *right = first_overlapping(at, hi)) hi = std::min(hi, right->start);
    MRC_CHECK(lo <= at && hi > at);

    Piece *piece = new (std::nothrow) Piece;
    if (piece == nullptr) {
      set_text(why, why_len, "out of memory");
      return false;
    }
    piece->start = lo;
    piece->end = hi;
    // An edge where one of our pieces ends may be a split we caused: count it as a split.
    piece->vma_start_edge = lo == mapping.start && piece_ending_at(lo) == nullptr;
    piece->vma_end_edge = hi == mapping.end && piece_starting_at(hi) == nullptr;
    const int64_t before = splits_at(lo) + splits_at(hi);
    if (!link(piece)) {
      delete piece;
      set_text(why, why_len, "out of memory");
      return false;
    }
    vmas_added_ += splits_at(lo) + splits_at(hi) - before;
    piece->created_next = *created;
    *created = piece;
    at = hi;
  }
  return true;
}

// Registers every mapping in [start, end) (each must be acceptable). Holes are refused: the
// caller asked for memory that is not there.
bool WatchSet::register_vmas(uintptr_t start, uintptr_t end, char *why, size_t why_len) {
  uintptr_t at = start;
  while (at < end) {
    Mapping mapping;
    if (query_mapping(at, &mapping) != MRC_OK) {
      if (why != nullptr && why_len > 0) snprintf(why, why_len, "%#" PRIxPTR " is not mapped", at);
      return false;
    }
    if (!acceptable(mapping, why, why_len)) return false;
    uffdio_register request{};
    request.range.start = std::max(at, mapping.start);
    request.range.len = std::min(end, mapping.end) - request.range.start;
    request.mode = config_.register_mode;
    g_registrations.fetch_add(1, std::memory_order_relaxed);
    if (ioctl(config_.uffd, UFFDIO_REGISTER, &request) != 0) {
      explain_errno(why, why_len, "UFFDIO_REGISTER", errno, request.range.start,
                    request.range.start + request.range.len, config_.mode);
      return false;
    }
    at = std::min(end, mapping.end);
  }
  return true;
}

bool WatchSet::arm(Piece *piece, uintptr_t start, uintptr_t end, char *why, size_t why_len) {
  const int64_t before = splits_around(piece);
  piece->armed = true;
  const int64_t after = splits_around(piece);
  piece->armed = false;
  if (vmas_added_ + after - before > static_cast<int64_t>(config_.vma_budget)) {
    if (why != nullptr && why_len > 0) {
      snprintf(why, why_len,
               "watching would exceed the VMA budget (%" PRId64 " VMAs added, budget %" PRIu64
               ", from vm.max_map_count)",
               vmas_added_, config_.vma_budget);
    }
    return false;
  }

  // A fresh piece lies in one acceptable mapping. A piece whose registration was taken away may
  // now hold other mappings, and holes: arm all of it only if acceptable mappings cover it
  // without a hole. A hole registers nothing, so memory mapped into it later would be neither
  // registered nor reported (no unmap happens), while the piece claimed to be armed.
  bool whole = true;
  if (piece->ever_armed) {
    uintptr_t at = piece->start;
    while (whole && at < piece->end) {
      Mapping mapping;
      whole = query_mapping(at, &mapping) == MRC_OK && acceptable(mapping, nullptr, 0);
      if (whole) at = mapping.end;
    }
  }
  if (whole) {
    uffdio_register request{};
    request.range.start = piece->start;
    request.range.len = piece->end - piece->start;
    request.mode = config_.register_mode;
    g_registrations.fetch_add(1, std::memory_order_relaxed);
    if (ioctl(config_.uffd, UFFDIO_REGISTER, &request) == 0) {
      set_armed(piece, true);
      return true;
    }
    const int error = errno;
    if (!piece->ever_armed) {
      explain_errno(why, why_len, "UFFDIO_REGISTER", error, piece->start, piece->end, config_.mode);
      return false;
    }
  }
  // Only the mappings under this watch; the piece stays disarmed (later watches register again).
  return register_vmas(std::max(start, piece->start), std::min(end, piece->end), why, why_len);
}

void WatchSet::unregister(uintptr_t start, uintptr_t end) noexcept {
  uffdio_range range{start, end - start};
  if (ioctl(config_.uffd, UFFDIO_UNREGISTER, &range) == 0 || errno != EINVAL) return;
  // EINVAL: a mapping in the range cannot be watched at all (it appeared after an unmap). The
  // kernel refuses the whole range then; unregister mapping by mapping, ignoring failures.
  uintptr_t at = start;
  while (at < end) {
    Mapping mapping;
    if (query_mapping_from(at, &mapping) != MRC_OK || mapping.start >= end) return;
    uffdio_range part{std::max(at, mapping.start), 0};
    part.len = std::min(end, mapping.end) - part.start;
    (void)ioctl(config_.uffd, UFFDIO_UNREGISTER, &part);
    at = mapping.end;
  }
}

void WatchSet::drop(Piece *piece) noexcept {
  // Even a disarmed piece may keep part of its registration (a partial unmap): unregister it.
  // Never a range we did not register: the kernel would not check whose registration it drops.
  if (piece->ever_armed) unregister(piece->start, piece->end);
  set_armed(piece, false);
  const int64_t before = splits_around(piece);
  unlink(piece);
  vmas_added_ += splits_at(piece->start) + splits_at(piece->end) - before;
  delete piece;
}

void WatchSet::rollback(Piece *created) noexcept {
  while (created != nullptr) {
    Piece *next = created->created_next;
    drop(created);
    created = next;
  }
}

void WatchSet::add_refs(uintptr_t start, uintptr_t end) noexcept {
  for (uintptr_t at = start; at < end;) {
    Piece *piece = first_overlapping(at, end);
    MRC_CHECK(piece != nullptr && piece->start <= at);
    ++piece->refs;
    piece->created_next = nullptr;
    at = piece->end;
  }
}

// ---- WatchSet: public ----

void WatchSet::destroy_all() noexcept {
  // A piece is listed in every block it spans: collect it from its first block only, and free
  // nothing until every entry has been visited.
  Piece *doomed = nullptr;
  blocks_.for_each([&doomed](uint64_t block, BlockEntry *entry) {
    for (uint32_t i = 0; i < entry->count; ++i) {
      Piece *piece = entry->items[i];
      if (block_of(piece->start) != block) continue;
      piece->created_next = doomed;
      doomed = piece;
    }
  });
  blocks_.for_each([](uint64_t, BlockEntry *entry) { delete entry; });
  while (doomed != nullptr) {
    Piece *next = doomed->created_next;
    delete doomed;
    doomed = next;
  }
  blocks_.reset();
  watched_bytes_ = 0;
  vmas_added_ = 0;
}

void WatchSet::reset(const WatchConfig &config) noexcept {
  destroy_all();
  config_ = config;
}

WatchResult WatchSet::watch(uintptr_t start, uintptr_t end, char *why, size_t why_len) {
  MRC_DASSERT(start < end);
  if (config_.uffd < 0) {
    set_text(why, why_len, "the monitor runs uncached: nothing can be watched");
    return WatchResult::NotMonitorable;
  }
  // The common case: every piece is there and armed. No syscall.
  bool ready = true;
  for (uintptr_t at = start; at < end && ready;) {
    const Piece *piece = first_overlapping(at, end);
    ready = piece != nullptr && piece->start <= at && piece->armed;
    if (ready) at = piece->end;
  }
  if (ready) {
    add_refs(start, end);
    return WatchResult::Watched;
  }

  Piece *created = nullptr;
  for (uintptr_t at = start; at < end;) {
    const Piece *piece = first_overlapping(at, end);
    if (piece != nullptr && piece->start <= at) {
      at = piece->end;
      continue;
    }
    const uintptr_t gap_end = piece != nullptr ? piece->start : end;
    if (!fill_gap(at, gap_end, &created, why, why_len)) {
      rollback(created);
      return WatchResult::NotMonitorable;
    }
    at = gap_end;
  }
  for (uintptr_t at = start; at < end;) {
    Piece *piece = first_overlapping(at, end);
    MRC_CHECK(piece != nullptr && piece->start <= at);
    if (!piece->armed && !arm(piece, start, end, why, why_len)) {
      rollback(created);
      return WatchResult::NotMonitorable;
    }
    at = piece->end;
  }
  add_refs(start, end);
  return WatchResult::Watched;
}

void WatchSet::unwatch(uintptr_t start, uintptr_t end) {
  for (uintptr_t at = start; at < end;) {
    Piece *piece = first_overlapping(at, end);
    if (piece == nullptr) return;  // forgotten (fork, stop): nothing to release
    at = piece->end;
    MRC_DASSERT(piece->refs > 0);
    if (piece->refs > 0 && --piece->refs == 0) drop(piece);
  }
}

void WatchSet::disarm(uintptr_t start, uintptr_t end) noexcept {
  if (start >= end) return;
  for (uintptr_t at = start; at < end;) {
    Piece *piece = first_overlapping(at, end);
    if (piece == nullptr) return;
    set_armed(piece, false);
    at = piece->end;
  }
}

void WatchSet::disarm_all() noexcept {
  // set_armed() changes pieces and counters, never the block map being walked.
  blocks_.for_each([this](uint64_t block, BlockEntry *entry) {
    for (uint32_t i = 0; i < entry->count; ++i) {
      Piece *piece = entry->items[i];
      if (block_of(piece->start) == block) set_armed(piece, false);
    }
  });
}

}  // namespace mrc::uffd::detail
