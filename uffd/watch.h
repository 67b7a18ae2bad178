// Watched ranges: which parts of the address space are registered with the userfaultfd.
//
// A watch(start, end) is widened to pieces: whole kWatchBlock blocks (or huge pages), clipped to
// the mapping that holds them and to the pieces that already exist. In MISSING mode pieces are
// exactly the pages asked for (see fill_gap: faults there are resolved by the monitor thread,
// which must never fault on anything it did not choose). Pieces never overlap; each
// counts the live watches that overlap it and is unregistered when the last one goes, so
// neighbours never unwatch each other. A piece is `armed` while its registration is known to be
// intact: the kernel drops the registration of whatever is unmapped or moved, and the monitor's
// own records (read through a private cursor before every watch/unwatch) disarm the pieces they
// touch, so that the next watch there registers again. A watch over armed pieces costs no
// syscall.
//
// VMA accounting: registering a piece inside a larger VMA splits it. vmas_added() estimates the
// VMAs this adds: for every piece edge that is not an edge of the original mapping, one split
// when exactly one side of the edge is registered (adjacent registered pieces merge back into
// one VMA). Past the budget, watch() answers NotMonitorable instead of letting the application's
// next mmap fail with ENOMEM at vm.max_map_count.
//
// SYNCHRONIZATION
//   Not thread-safe: every member runs under the monitor's registry mutex. The monitor thread
//   never touches it. Allocation (nothrow) is allowed here: this is never the monitor thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"
#include "uffd/uffd.h"

namespace mrc::uffd::detail {

struct Piece;
struct BlockEntry;

// Open addressing (linear probing, backward-shift deletion): block index -> BlockEntry.
class BlockMap {
 public:
  BlockEntry *find(uint64_t block) const noexcept;
  [[nodiscard]] bool insert(uint64_t block, BlockEntry *entry) noexcept;  // block absent
  void erase(uint64_t block) noexcept;
  // Calls f(block, BlockEntry *) for every entry; f must not modify the map.
  template <class F>
  void for_each(F &&f) const {
    for (size_t i = 0; buckets_ != nullptr && i <= mask_; ++i) {
      if (buckets_[i].entry != nullptr) f(buckets_[i].block, buckets_[i].entry);
    }
  }
  void reset() noexcept;  // frees the bucket array (not the entries)

 private:
  struct Bucket {
    uint64_t block;
    BlockEntry *entry;  // nullptr: empty
  };
  size_t home(uint64_t block) const noexcept;
  [[nodiscard]] bool grow() noexcept;

  Bucket *buckets_ = nullptr;
  size_t mask_ = 0;
  unsigned bits_ = 0;
  size_t size_ = 0;
};

struct WatchConfig {
  int uffd = -1;
  uint64_t register_mode = 0;  // UFFDIO_REGISTER_MODE_*
  mrc_monitor_mode_t mode = MRC_MONITOR_UNCACHED;
  uint64_t vma_budget = 0;
  // The monitor's own memory (thread stack, queue): never watched, because in MISSING mode a
  // fault there would wait for the monitor itself.
  uintptr_t own[2][2] = {{0, 0}, {0, 0}};
};

class WatchSet {
 public:
  constexpr WatchSet() = default;
  WatchSet(const WatchSet &) = delete;
  WatchSet &operator=(const WatchSet &) = delete;

  // Forgets everything and adopts a new userfaultfd (after start, or after fork).
  void reset(const WatchConfig &config) noexcept;

  // REQUIRES: start < end, both page-aligned.
  [[nodiscard]] WatchResult watch(uintptr_t start, uintptr_t end, char *why, size_t why_len);
  void unwatch(uintptr_t start, uintptr_t end);
  // The kernel dropped the registration of [start, end) (UNMAP or REMAP record).
  void disarm(uintptr_t start, uintptr_t end) noexcept;
  // Records were lost: assume every registration may be gone.
  void disarm_all() noexcept;

  uint64_t watched_bytes() const noexcept { return watched_bytes_; }
  uint64_t vmas_added() const noexcept { return static_cast<uint64_t>(vmas_added_); }
  uint64_t vma_budget() const noexcept { return config_.vma_budget; }

 private:
  // Pieces in address order.
  Piece *first_overlapping(uintptr_t from, uintptr_t to) const noexcept;
  Piece *last_overlapping(uintptr_t from, uintptr_t to) const noexcept;
  Piece *piece_ending_at(uintptr_t address) const noexcept;
  Piece *piece_starting_at(uintptr_t address) const noexcept;
  [[nodiscard]] bool link(Piece *piece) noexcept;
  void unlink(Piece *piece) noexcept;

  int64_t splits_at(uintptr_t address) const noexcept;
  int64_t splits_around(const Piece *piece) const noexcept;
  void set_armed(Piece *piece, bool armed) noexcept;
  bool acceptable(const Mapping &mapping, char *why, size_t why_len) const noexcept;
  bool fill_gap(uintptr_t from, uintptr_t to, Piece **created, char *why, size_t why_len);
  bool arm(Piece *piece, uintptr_t start, uintptr_t end, char *why, size_t why_len);
  bool register_vmas(uintptr_t start, uintptr_t end, char *why, size_t why_len);
  void drop(Piece *piece) noexcept;
  void unregister(uintptr_t start, uintptr_t end) noexcept;
  void rollback(Piece *created) noexcept;
  void add_refs(uintptr_t start, uintptr_t end) noexcept;
  void destroy_all() noexcept;

  WatchConfig config_;
  BlockMap blocks_;
  uint64_t watched_bytes_ = 0;
  int64_t vmas_added_ = 0;
};

// UFFDIO_REGISTER calls since the process started (testing::registrations()).
extern std::atomic<uint64_t> g_registrations;

}  // namespace mrc::uffd::detail
