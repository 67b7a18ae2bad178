// The radix page table: maps page-aligned, non-overlapping [start, end) ranges to regions.
//
// Shape. A radix tree over page numbers with 2^kBitsPerLevel slots per node (PageTable: 64 slots,
// 6 bits per level). A slot covers an aligned block of addresses and holds one word:
//   0                 no region intersects the block;
//   region            the region covers the whole block;
//   region | partial  the region is the only one that intersects the block, without covering it
//                     (lookup then checks the region's bounds);
//   node | level | 1  two or more regions intersect the block; the node covers the smallest
//                     aligned node-sized block that holds all of them.
// The form is canonical (a function of the set of regions): every node has at least two
// non-empty slots and sees at least two regions. Consequences:
// - A region alone in its neighbourhood is one partial entry, as high as it is alone; a region
//   beside others is stored at the highest levels whose blocks it covers whole (huge entries),
//   at most 2^kBitsPerLevel entries per level and two descents (one per end): a region of N
//   pages costs O(2^b log N) entries, never O(N); a 1 TiB region is a few dozen stores.
// - Nodes are path-compressed: a node may sit several levels below its parent slot (its level is
//   in the entry's tag), so depth follows how the regions are spread, not the address width, and
//   nodes <= regions - 1 whatever the layout.
// - lookup() is at most kLevels + 1 dependent loads (one per node, plus the region's bounds for a
//   partial entry); for regions clustered in a few GiB it is 3 to 5.
//
// Address width. kAddressBits = 57: every user-space address on x86-64 with 4- or 5-level paging
// (user space below 2^47 or 2^56) and on aarch64 with 48- or 52-bit VAs. Wider addresses cannot
// be user addresses: insert() rejects them with MRC_ERR_INVALID, lookup() returns nullptr. The
// extra levels cost nothing for clustered regions (path compression skips them) and one
// shift-and-compare per lookup.
//
// SYNCHRONIZATION
//   Writer: one thread at a time calls insert(), remove(), purge() (the caller serialises them,
//     e.g. the cache's mutex). The writer may call lookup() and for_each_overlapping() without a
//     guard. The writer-only counters size_ and nodes_ are atomics so that size() and
//     memory_bytes() may be read from any thread (relaxed: statistics only).
//   Readers: lookup() and for_each_overlapping() from any thread, inside an EpochGuard of the
//     table's domain, concurrently with the writer. No lock, no write to shared memory.
//   Publication: every slot (and the root) is a std::atomic<uintptr_t>. The writer fills a new
//     node (relaxed: still private), then publishes it with a release store into its parent slot;
//     readers load slots with acquire, so a node's contents and its immutable base are visible
//     before the node is. A new region's fields (start, end) are published the same way: they
//     must not change while the region is in the table or may still be seen by a reader.
//     (jemalloc's rtree reads child pointers relaxed because its entries are never invalidated
//     under a live reader; here invalidation races with lookups by design, so loads are acquire.)
//   Linearisation: a region becomes visible slot by slot and disappears slot by slot. A lookup
//     that starts after remove(region) returned (happens-after) never returns it; one that
//     overlaps insert() or remove() returns the region or nullptr. A lookup never returns a
//     region that does not contain the address (partial entries are checked, full entries cover
//     their block).
//   Reclamation: the writer unlinks a node (release store into its parent) before retiring it to
//     the EpochDomain; it is freed after every guard that might have seen it has ended. Regions are
//     the caller's: remove() only unlinks them; the caller retires them afterwards.
//   Progress: lookup() is wait-free (bounded loop); for_each_overlapping() is wait-free and
//     bounded by the entries it visits; the writer never waits for readers.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mrcache/mrcache.h"
#include "pgtable/epoch.h"

namespace mrc {

// A mapped range. The cache's Region derives from it. start/end are immutable while the region
// is in a table (see SYNCHRONIZATION).
struct PgtRegion {
  uintptr_t start;
  uintptr_t end;
};

namespace detail {

template <unsigned kBitsPerLevel>
class RadixPageTable {
  static_assert(kBitsPerLevel >= 2 && kBitsPerLevel <= 8, "2 to 256 slots per node");

 public:
  static constexpr unsigned kPageShift = 12;
  static constexpr uintptr_t kPageSize = uintptr_t{1} << kPageShift;
  static constexpr unsigned kAddressBits = 57;
  static constexpr uintptr_t kAddressLimit = uintptr_t{1} << kAddressBits;  // exclusive
  static constexpr unsigned kFanout = 1u << kBitsPerLevel;
  // Node levels 0 (slots of one page) to kLevels - 1; the root slot sits at level kLevels.
  static constexpr unsigned kLevels =
      (kAddressBits - kPageShift + kBitsPerLevel - 1) / kBitsPerLevel;

  explicit RadixPageTable(EpochDomain &domain = epoch_domain()) noexcept : domain_(domain) {}
  // REQUIRES: no reader is inside a lookup. Frees the nodes; the regions stay the caller's.
  ~RadixPageTable();
  RadixPageTable(const RadixPageTable &) = delete;
  RadixPageTable &operator=(const RadixPageTable &) = delete;

  // Writer. MRC_ERR_INVALID: null, misaligned, empty, wrapping or beyond kAddressLimit.
  // MRC_ERR_EXISTS: overlaps a region already present. MRC_ERR_NO_MEMORY: no node could be
  // allocated. On any error the table is unchanged and no reader ever saw the region.
  [[nodiscard]] mrc_status_t insert(PgtRegion *region) noexcept;
  // Writer. MRC_ERR_NOT_FOUND when this region (this pointer) is not in the table.
  [[nodiscard]] mrc_status_t remove(PgtRegion *region) noexcept;

  // The region containing address, or nullptr. REQUIRES: inside an EpochGuard of domain(), or
  // the writer. At most kLevels + 1 dependent loads.
  PgtRegion *lookup(uintptr_t address) const noexcept;

  // Calls visit(PgtRegion *) for every region overlapping [from, to), in address order, each
  // once, while the table is not modified. Under concurrent modification (a reader inside a
  // guard): every region present throughout is visited exactly once; regions inserted or removed
  // meanwhile may be visited or not. visit may return bool: false stops the walk. visit must not
  // modify the table. REQUIRES: a guard, or the writer.
  template <class Visit>
  void for_each_overlapping(uintptr_t from, uintptr_t to, Visit &&visit) const;

  // Writer: removes every region, then calls on_region(PgtRegion *) once for each, in address
  // order (the callback may retire the region; it must not touch the table).
  template <class OnRegion>
  void purge(OnRegion &&on_region);

  size_t size() const noexcept { return size_.load(std::memory_order_relaxed); }
  // Bytes of live nodes (allocation sizes, allocator overhead excluded).
  size_t memory_bytes() const noexcept {
    return nodes_.load(std::memory_order_relaxed) * sizeof(Node);
  }
  size_t node_count() const noexcept { return nodes_.load(std::memory_order_relaxed); }
  EpochDomain &domain() const noexcept { return domain_; }

  // Writer, for tests: checks the canonical form, the tags and the counters. False on any breach.
  bool check_invariants() const noexcept;

 private:
  static constexpr unsigned kTagBits = 1 + std::bit_width(kLevels - 1);
  static constexpr size_t kNodeAlign = size_t{1} << (kTagBits < 4 ? 4 : kTagBits);
  static constexpr uintptr_t kNodeTag = 1;
  static constexpr uintptr_t kPartialTag = 2;
  static constexpr uintptr_t kIndexMask = kFanout - 1;
  static constexpr uintptr_t kLevelMask = (uintptr_t{1} << (kTagBits - 1)) - 1;

  struct alignas(kNodeAlign) Node {
    std::atomic<uintptr_t> slots[kFanout];
    uintptr_t base;  // first address of the block the node covers; immutable once published
  };

  // Nodes one insert() needs, allocated before the table changes: at most two new nodes per
  // slot level (the blocks holding the region's two ends).
  struct NodeReserve {
    Node *nodes[2 * kLevels + 2];
    unsigned count = 0;
  };
  struct Unlinked {
    Node *nodes[4 * kLevels + 4];
    unsigned count = 0;
  };

  static constexpr unsigned slot_shift(unsigned level) {
    return kPageShift + kBitsPerLevel * level;
  }
  static constexpr uintptr_t block_size(unsigned level) {
    return uintptr_t{1} << slot_shift(level);
  }
  static bool is_node(uintptr_t entry) { return (entry & kNodeTag) != 0; }
  static unsigned level_of(uintptr_t entry) {
    return static_cast<unsigned>((entry >> 1) & kLevelMask);
  }
  static Node *node_of(uintptr_t entry) {
    return reinterpret_cast<Node *>(entry & ~uintptr_t{kNodeAlign - 1});
  }
  static PgtRegion *region_of(uintptr_t entry) {
    return reinterpret_cast<PgtRegion *>(entry & ~(kNodeTag | kPartialTag));
  }
  static uintptr_t node_entry(const Node *node, unsigned level) {
    return reinterpret_cast<uintptr_t>(node) | (uintptr_t{level} << 1) | kNodeTag;
  }
  static uintptr_t entry_for(const PgtRegion *region, uintptr_t block, unsigned level);
  static unsigned level_for(uintptr_t lo, uintptr_t hi);
  static void free_node(void *node) noexcept;

  template <class Visit>
  static bool walk_range(uintptr_t entry, uintptr_t &cursor, uintptr_t to, Visit &visit);
  template <class OnRegion>
  void purge_walk(uintptr_t entry, const PgtRegion *&last, OnRegion &on_region);

  bool overlaps_any(uintptr_t from, uintptr_t to) const noexcept;
  size_t count_new_nodes(uintptr_t entry, unsigned level, uintptr_t block,
                         const PgtRegion *region) const noexcept;
  uintptr_t insert_into(uintptr_t entry, unsigned level, uintptr_t block, PgtRegion *region,
                        NodeReserve &reserve) noexcept;
  void insert_into_node(Node *node, unsigned level, PgtRegion *region,
                        NodeReserve &reserve) noexcept;
  uintptr_t remove_from(uintptr_t entry, unsigned level, const PgtRegion *region,
                        Unlinked &unlinked) noexcept;
  struct Census {
    size_t nodes = 0, regions = 0;
    uintptr_t covered = 0, region_bytes = 0;
    const PgtRegion *last = nullptr;
  };
  bool check_entry(uintptr_t entry, unsigned level, uintptr_t block, Census &census) const noexcept;
  void free_subtree(uintptr_t entry) noexcept;

  std::atomic<uintptr_t> root_{0};
  std::atomic<size_t> size_{0};
  std::atomic<size_t> nodes_{0};
  EpochDomain &domain_;
};

// ---- inline reader paths -------------------------------------------------------------------

template <unsigned kBitsPerLevel>
inline PgtRegion *RadixPageTable<kBitsPerLevel>::lookup(uintptr_t address) const noexcept {
  if (__builtin_expect(address >= kAddressLimit, 0)) return nullptr;
  uintptr_t entry = root_.load(std::memory_order_acquire);
  unsigned parent = kLevels;  // level of the slot `entry` was read from
  while (is_node(entry)) {
    const Node *node = node_of(entry);
    const unsigned level = level_of(entry);
    // A node below a skipped level covers only part of its parent slot: check the prefix.
    if (level + 1 != parent && ((address ^ node->base) >> slot_shift(level + 1)) != 0) {
      return nullptr;
    }
    entry =
        node->slots[(address >> slot_shift(level)) & kIndexMask].load(std::memory_order_acquire);
    parent = level;
  }
  PgtRegion *region = region_of(entry);
  if ((entry & kPartialTag) != 0 && address - region->start >= region->end - region->start) {
    return nullptr;
  }
  return region;
}

template <unsigned kBitsPerLevel>
template <class Visit>
bool RadixPageTable<kBitsPerLevel>::walk_range(uintptr_t entry, uintptr_t &cursor, uintptr_t to,
                                               Visit &visit) {
  if (entry == 0) return true;
  if (!is_node(entry)) {
    PgtRegion *region = region_of(entry);
    // end > cursor: not visited yet (cursor is the end of the last region visited, or from).
    if (region->end <= cursor || region->start >= to) return true;
    cursor = region->end;
    if constexpr (std::is_same_v<std::invoke_result_t<Visit &, PgtRegion *>, bool>) {
      return visit(region);
    } else {
      visit(region);
      return true;
    }
  }
  const Node *node = node_of(entry);
  const unsigned level = level_of(entry);
  const uintptr_t base = node->base;
  const uintptr_t end = base + block_size(level + 1);
  if (end <= cursor || base >= to) return true;
  const uintptr_t first = cursor > base ? (cursor - base) >> slot_shift(level) : 0;
  for (uintptr_t i = first; i < kFanout; ++i) {
    const uintptr_t block = base + (i << slot_shift(level));
    if (block >= to) break;
    if (block + block_size(level) <= cursor) continue;  // a region visited already covers it
    if (!walk_range(node->slots[i].load(std::memory_order_acquire), cursor, to, visit)) {
      return false;
    }
  }
  return true;
}

template <unsigned kBitsPerLevel>
template <class Visit>
void RadixPageTable<kBitsPerLevel>::for_each_overlapping(uintptr_t from, uintptr_t to,
                                                         Visit &&visit) const {
  if (to > kAddressLimit) to = kAddressLimit;
  if (from >= to) return;
  uintptr_t cursor = from;
  walk_range(root_.load(std::memory_order_acquire), cursor, to, visit);
}

template <unsigned kBitsPerLevel>
template <class OnRegion>
void RadixPageTable<kBitsPerLevel>::purge_walk(uintptr_t entry, const PgtRegion *&last,
                                               OnRegion &on_region) {
  if (entry == 0) return;
  if (!is_node(entry)) {
    // A region's entries are consecutive in address order: comparing pointers is enough, and
    // the callback may already have retired the region, so it is never dereferenced here.
    PgtRegion *region = region_of(entry);
    if (region != last) {
      last = region;
      on_region(region);
    }
    return;
  }
  Node *node = node_of(entry);
  for (auto &slot : node->slots) purge_walk(slot.load(std::memory_order_relaxed), last, on_region);
  domain_.retire(node, &free_node);  // unlinked already (root cleared), and never read again
}

template <unsigned kBitsPerLevel>
template <class OnRegion>
void RadixPageTable<kBitsPerLevel>::purge(OnRegion &&on_region) {
  const uintptr_t root = root_.load(std::memory_order_relaxed);
  root_.store(0, std::memory_order_release);
  size_.store(0, std::memory_order_relaxed);
  nodes_.store(0, std::memory_order_relaxed);
  const PgtRegion *last = nullptr;
  purge_walk(root, last, on_region);
}

extern template class RadixPageTable<2>;
extern template class RadixPageTable<3>;
extern template class RadixPageTable<4>;
extern template class RadixPageTable<5>;
extern template class RadixPageTable<6>;
extern template class RadixPageTable<7>;
extern template class RadixPageTable<8>;

}  // namespace detail

// The page table the cache uses. 64 slots per node: the fanout measured best for lookup depth
// against memory per region (tools/bench/bench_pgtable.cc compares 16 to 256).
class PageTable : public detail::RadixPageTable<6> {
 public:
  using RadixPageTable::RadixPageTable;
};

}  // namespace mrc
