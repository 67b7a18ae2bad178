// SPDX-License-Identifier: BSD-3-Clause
// The radix page table: maps page-aligned, non-overlapping [start, end) ranges to regions, for
// lock-free readers and one writer. The shape notes (canonical form, kept nodes, lookup's
// critical path, windows, address width) and why the rules below hold: docs/DESIGN.md,
// "The page table".
//
// SYNCHRONIZATION (docs/DESIGN.md, "Lock-free readers, one writer")
//   1. One writer at a time: insert, remove, purge, settle (the caller serialises them, e.g. the
//      cache's mutex); the writer may also call lookup and for_each_overlapping without a guard.
//   2. Readers (lookup, for_each_overlapping) run on any thread inside an EpochGuard of the
//      table's domain, concurrently with the writer; they take no lock and store nothing shared.
//   3. The writer's alone, never read by readers: inner nodes' occupancy bitmaps and child counts,
//      the kept nodes and the hint to the last one used, the windows' bookkeeping, the node pool.
//   4. size_, nodes_, bytes_, root_level_ are atomics any thread may read relaxed: statistics,
//      and a hint that lookup checks against the root's header.
//   5. Slots, root_ and windows_[k] are published by release stores of complete nodes and
//      windows; readers load them with acquire.
//   6. A region's start and end do not change while it is in the table or a reader may hold it.
//   7. A concurrent walk is no snapshot: regions present throughout are visited once, in address
//      order; others may be visited or not, and may overlap one visited before.
//   8. A lookup after remove(region) returned never returns it; one overlapping insert or remove
//      returns the region or nullptr; none returns a region that does not contain the address.
//   9. A node is unlinked (release) before it is retired to the pool, a window before it is
//      retired to the domain; removed regions are the caller's to retire.
//  10. lookup and for_each_overlapping are wait-free; the writer never waits for readers.
//  11. Addresses at or above kAddressLimit (2^57) are no user addresses: insert refuses them
//      (MRC_ERR_INVALID), lookup returns nullptr.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>

#include "base/check.h"
#include "base/epoch.h"
#include "mrcache/mrcache.h"
#include "pgtable/node_pool.h"

namespace mrc {

// A mapped range. The cache's Region derives from it. start/end are immutable while the region is
// in a table (see SYNCHRONIZATION).
struct PgtRegion {
  uintptr_t start;
  uintptr_t end;
};

namespace detail {

template <unsigned kInnerBits, unsigned kLeafBits = kInnerBits>
class RadixPageTable {
  static_assert(kInnerBits >= 2 && kInnerBits <= 8, "4 to 256 slots per inner node");
  static_assert(kLeafBits >= 2 && kLeafBits <= kInnerBits, "leaves no wider than inner nodes");

 public:
  static constexpr unsigned kPageShift = 12;
  static constexpr uintptr_t kPageSize = uintptr_t{1} << kPageShift;
  static constexpr unsigned kAddressBits = 57;
  static constexpr uintptr_t kAddressLimit = uintptr_t{1} << kAddressBits;  // exclusive
  static constexpr unsigned kInnerFanout = 1u << kInnerBits;
  static constexpr unsigned kLeafFanout = 1u << kLeafBits;
  // Node levels 0 (leaves: slots of one page) to kLevels - 1; the root slot sits at kLevels.
  static constexpr unsigned kLevels =
      1 + (kAddressBits - kPageShift - kLeafBits + kInnerBits - 1) / kInnerBits;

  // Flat nodes: a level-1 node and its leaves as one array of page slots, used where the level-1
  // node has nearly every slot split into a leaf (densely packed small regions). The array is then
  // no bigger than the node and its leaves, and a lookup takes one load where it took two. Only for
  // shapes whose flat node stays small (PageTable: 2048 slots, 16 KiB).
  static constexpr bool kFlats = kInnerBits + kLeafBits <= 11;
  static constexpr unsigned kFlatLevel = 1;  // a flat node covers a level-1 node's block
  static constexpr unsigned kFlatFanout = kFlats ? 1u << (kInnerBits + kLeafBits) : 1;
  // Hysteresis: a level-1 node with kFlatFrom leaves becomes flat; a flat node back to a tree when
  // fewer than kFlatUntil of its groups (kLeafFanout slots) hold two regions or more.
  static constexpr unsigned kFlatFrom = kInnerFanout - kInnerFanout / 16;
  static constexpr unsigned kFlatUntil = kInnerFanout - kInnerFanout / 4;
  // kFlatUntil >= 3: a removal leaves a flat node with a group of two regions (it never collapses).
  static_assert(!kFlats || (kFlatUntil >= 3 && kFlatFrom > kFlatUntil));

  // Hysteresis (docs/DESIGN.md, "Kept nodes"): nodes a removal may leave in place with a single
  // region, and the removals that could not keep their node after which the oldest kept node is
  // evicted anyway.
  static constexpr unsigned kKeptNodes = 8;
  static constexpr unsigned kAgeRemovals = 64;

  explicit RadixPageTable(EpochDomain &domain = epoch_domain()) noexcept;
  // REQUIRES: no reader is inside a lookup. Releases the nodes; the regions stay the caller's.
  ~RadixPageTable();
  RadixPageTable(const RadixPageTable &) = delete;
  RadixPageTable &operator=(const RadixPageTable &) = delete;
  RadixPageTable(RadixPageTable &&) = delete;
  RadixPageTable &operator=(RadixPageTable &&) = delete;

  // Writer. MRC_ERR_INVALID: null, misaligned, empty, wrapping or beyond kAddressLimit.
  // MRC_ERR_EXISTS: overlaps a region already present. MRC_ERR_NO_MEMORY: no node could be
  // allocated. On any error the table is unchanged and no reader ever saw the region.
  [[nodiscard]] mrc_status_t insert(PgtRegion *region) noexcept;
  // Writer. MRC_ERR_NOT_FOUND when this region (this pointer) is not in the table.
  [[nodiscard]] mrc_status_t remove(PgtRegion *region) noexcept;

  // The region containing address, or nullptr. REQUIRES: inside an EpochGuard of domain(), or the
  // writer. At most kLevels dependent loads, then the region's bounds.
  [[gnu::always_inline]] PgtRegion *lookup(uintptr_t address) const noexcept;

  // Calls visit(PgtRegion *) for every region overlapping [from, to), in address order, each once,
  // while the table is not modified. Under concurrent modification (a reader inside a guard): every
  // region present throughout is visited exactly once; regions inserted or removed meanwhile may be
  // visited or not. visit may return bool: false stops the walk. visit must not modify the table.
  // REQUIRES: a guard, or the writer.
  template <class Visit>
  void for_each_overlapping(uintptr_t from, uintptr_t to, Visit &&visit) const;

  // Writer: removes every region, then calls on_region(PgtRegion *) once for each, in address order
  // (the callback may retire the region; it must not touch the table).
  template <class OnRegion>
  void purge(OnRegion &&on_region);

  size_t size() const noexcept { return size_.load(std::memory_order_relaxed); }
  // Bytes of live nodes (object sizes; the pool's free and waiting nodes excluded) and of the
  // windows.
  size_t memory_bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  size_t node_count() const noexcept { return nodes_.load(std::memory_order_relaxed); }
  EpochDomain &domain() const noexcept { return domain_; }
  // Writer: flat nodes in the table (see kFlats), for tests and statistics.
  size_t flat_count() const noexcept { return flats_; }
  // Writer: the node pool (free and waiting nodes, chunks mapped), for tests and statistics.
  const NodePool &pool() const noexcept { return pool_; }
  // Writer: nodes kept by the hysteresis (docs/DESIGN.md, "Kept nodes"), for tests and statistics.
  size_t kept_count() const noexcept { return kept_count_; }
  // Writer: collapses every kept node, leaving the canonical form.
  void settle() noexcept;
  // Writer: level-1 slots in the windows (0: none), for tests and statistics.
  size_t window_slots() const noexcept {
    size_t slots = 0;
    for (const std::atomic<Window *> &window : windows_) {
      const Window *w = window.load(std::memory_order_relaxed);
      slots += w == nullptr ? 0 : w->count;
    }
    return slots;
  }

  // Writer, for tests: checks the canonical form, the headers and the counters. False on any
  // breach.
  bool check_invariants() const noexcept;
  // Writer, for tests: calls fn(const void *node) for every node reachable from the root.
  template <class Fn>
  void for_each_node(Fn &&fn) const;

  static constexpr unsigned fanout(unsigned level) {
    return level == 0 ? kLeafFanout : kInnerFanout;
  }
  static constexpr unsigned slot_shift(unsigned level) {
    return level == 0 ? kPageShift : kPageShift + kLeafBits + kInnerBits * (level - 1);
  }
  static constexpr uintptr_t block_size(unsigned level) {
    return uintptr_t{1} << slot_shift(level);
  }
  static_assert(slot_shift(kLevels) < 64, "the root slot's block must fit in an address");

 private:
  // Entry tags: 00 region (or 0), 01 node, 11 node below skipped levels, 10 flat node. An entry
  // of a node below skipped levels also holds the node's level, above the address bits (nodes
  // are user memory, below kAddressLimit): lookup() computes the next index from the entry,
  // without waiting for the node's header.
  static constexpr uintptr_t kNodeTag = 1;
  static constexpr uintptr_t kSkipTag = 2;
  static constexpr uintptr_t kFlatTag = 2;
  static constexpr uintptr_t kTagMask = kNodeTag | kSkipTag;
  static constexpr unsigned kEntryLevelShift = kAddressBits;
  static_assert(kLevels <= (uintptr_t{1} << (64 - kEntryLevelShift)));
  // A header's low bits hold the node's level; its block is aligned far beyond them.
  static constexpr uintptr_t kLevelMask = 0xff;
  static_assert(kLevels <= kLevelMask && (kLevelMask >> kPageShift) == 0);
  static constexpr unsigned kLeafClass = 0, kInnerClass = 1, kFlatClass = 2;
  // The level of the nodes windows mirror (docs/DESIGN.md, "Windows"), and a window's layout: a
  // header, then count level-1 slots (the blocks from first << slot_shift(1) on).
  static constexpr unsigned kWindowLevel = 2;
  static_assert(kLevels > kWindowLevel);
  // Windows at most: the root's, or one for each level-2 node of a higher root that holds
  // nothing else (clusters far apart, e.g. the heap and the mmap area).
  static constexpr unsigned kWindows = 2;  // lookup() reads both
  struct alignas(64) Window {
    uintptr_t bias;   // the slots' address minus first slots: lookup()'s base
    uintptr_t first;  // the first slot's block number (its address >> slot_shift(1))
    uintptr_t count;
    size_t bytes;     // allocated
    uintptr_t whole;  // 1: it mirrors the root, so no region lies outside it
    std::atomic<uintptr_t> *slots() { return reinterpret_cast<std::atomic<uintptr_t> *>(this + 1); }
    const std::atomic<uintptr_t> *slots() const {
      return reinterpret_cast<const std::atomic<uintptr_t> *>(this + 1);
    }
  };

  // Header first, then the slots at the same offset in both kinds, so that a slot's address does
  // not depend on the kind of node. 8-aligned, sized exactly (the pool carves them back to back).
  struct LeafNode {
    uintptr_t header;  // base | level: immutable while a reader may reach the node
    std::atomic<uintptr_t> slots[kLeafFanout];
  };
  struct InnerNode {
    uintptr_t header;
    std::atomic<uintptr_t> slots[kInnerFanout];
    // Writer only (readers never look): which slots are non-empty, how many hold a node.
    uint64_t occupied[(kInnerFanout + 63) / 64];
    uint16_t children;
  };
  struct FlatNode {
    uintptr_t header;  // base | kFlatLevel
    std::atomic<uintptr_t> slots[kFlatFanout];
    // Writer only: which groups of kLeafFanout slots hold two regions or more (where the tree
    // has a leaf), and how many.
    uint64_t leafy[(kInnerFanout + 63) / 64];
    uint32_t leafy_count;
  };
  static_assert(offsetof(LeafNode, slots) == sizeof(uintptr_t) &&
                offsetof(InnerNode, slots) == sizeof(uintptr_t) &&
                offsetof(FlatNode, slots) == sizeof(uintptr_t));
  static constexpr uintptr_t kSlotsOffset = sizeof(uintptr_t);

  // A node as the writer handles it: its address, its level (the level whose block it covers) and
  // its kind (level 0: LeafNode; flat: FlatNode, at kFlatLevel with slots of one page; else
  // InnerNode).
  // A trivial default constructor: arrays of them (a removal's path and unlinked nodes) cost
  // nothing to set up.
  struct NodeRef {
    NodeRef() = default;
    constexpr NodeRef(uintptr_t address, unsigned node_level, bool is_flat = false)
        : ptr(address), level(node_level), flat(is_flat) {}
    uintptr_t ptr;
    unsigned level;
    bool flat;
    LeafNode *leaf() const { return reinterpret_cast<LeafNode *>(ptr); }
    InnerNode *inner() const { return reinterpret_cast<InnerNode *>(ptr); }
    FlatNode *flat_node() const { return reinterpret_cast<FlatNode *>(ptr); }
    bool is_inner() const { return level != 0 && !flat; }
    std::atomic<uintptr_t> &slot(uintptr_t i) const {
      std::atomic<uintptr_t> *slots = level == 0 ? leaf()->slots
                                      : flat     ? flat_node()->slots
                                                 : inner()->slots;
      return slots[i];
    }
    // The level of the slots inside.
    unsigned slot_level() const { return flat ? 0 : level; }
    unsigned shift() const { return slot_shift(slot_level()); }
    uintptr_t slot_size() const { return block_size(slot_level()); }
    uintptr_t base() const { return header_of(ptr) & ~kLevelMask; }
    uintptr_t end() const { return base() + block_size(level + 1); }
    unsigned fanout() const { return flat ? kFlatFanout : RadixPageTable::fanout(level); }
  };

  // Nodes one insert() needs, allocated before the table changes: at most two new nodes per slot
  // level (the blocks holding the region's two ends).
  struct NodeCount {
    size_t leaves = 0, inner = 0;
    bool overlap = false;
  };
  struct NodeReserve {
    LeafNode *leaves[2];
    InnerNode *inner[2 * kLevels];
    unsigned leaf_count = 0, inner_count = 0;
  };
  // A slot as the writer handles it: the node holding it (ptr 0: root_), its index there, the
  // slot's level and the first address of its block.
  struct SlotRef {
    NodeRef owner;
    unsigned index;
    unsigned level;
    uintptr_t block;
  };
  struct Unlinked {
    NodeRef nodes[4 * kLevels + 4];
    unsigned count = 0;
    // Whether collapse() may still keep a node (the first node it finds with one region), and the
    // kept node that keeping it displaced: settled once the removal is done (evict_ptr 0: none).
    bool may_keep = false;
    uintptr_t evict_ptr = 0, evict_base = 0;
    unsigned evict_level = 0;
  };

  // Any kind of node (the writer's and the walks' view); lookup() follows kNodeTag itself.
  static bool is_node(uintptr_t entry) { return (entry & kTagMask) != 0; }
  static bool is_flat(uintptr_t entry) { return (entry & kTagMask) == kFlatTag; }
  static uintptr_t pointer_of(uintptr_t entry) { return entry & (kAddressLimit - 1) & ~kTagMask; }
  // Both kinds start with the header word.
  static uintptr_t header_of(uintptr_t node) { return *reinterpret_cast<const uintptr_t *>(node); }
  static unsigned level_in(uintptr_t header) { return static_cast<unsigned>(header & kLevelMask); }
  static NodeRef node_of(uintptr_t entry) {
    const uintptr_t ptr = pointer_of(entry);
    if (is_flat(entry)) return {ptr, kFlatLevel, true};
    return {ptr, level_in(header_of(ptr))};
  }
  static PgtRegion *region_of(uintptr_t entry) { return reinterpret_cast<PgtRegion *>(entry); }
  static uintptr_t node_entry(NodeRef node, unsigned slot_level) {
    if (node.flat) return node.ptr | kFlatTag;  // read with its prefix checked, wherever it sits
    if (node.level + 1 == slot_level) return node.ptr | kNodeTag;
    MRC_DASSERT(node.ptr < kAddressLimit);
    return node.ptr | kNodeTag | kSkipTag | (uintptr_t{node.level} << kEntryLevelShift);
  }
  static size_t node_bytes(NodeRef node) {
    return node.level == 0 ? sizeof(LeafNode) : node.flat ? sizeof(FlatNode) : sizeof(InnerNode);
  }
  // Both kinds keep their slots at kSlotsOffset, so the choice folds away; indexing through the
  // decayed pointer keeps -fsanitize=bounds from checking the index against the other kind.
  static const std::atomic<uintptr_t> &slot_at(uintptr_t node, unsigned level, uintptr_t index) {
    const std::atomic<uintptr_t> *slots = level == 0
                                              ? reinterpret_cast<const LeafNode *>(node)->slots
                                              : reinterpret_cast<const InnerNode *>(node)->slots;
    return slots[index];
  }
  // The slots of any kind of node (all keep them at kSlotsOffset), through the decayed pointer:
  // -fsanitize=bounds then does not check an index against another kind's array.
  static const std::atomic<uintptr_t> *slots_of(uintptr_t node) {
    return reinterpret_cast<const std::atomic<uintptr_t> *>(node + kSlotsOffset);
  }
  // Bounds every address passes: where a region needs no check.
  static constexpr PgtRegion kEverywhere{0, ~uintptr_t{0}};
  // lookup()'s last steps: from the entry of a level-1 slot to the result (and the region whose
  // bounds it must pass), and that check.
  [[gnu::always_inline]] uintptr_t below_level1(uintptr_t entry, uintptr_t address,
                                                uintptr_t &bounds) const noexcept;
  [[gnu::always_inline]] static PgtRegion *checked(uintptr_t entry, uintptr_t bounds,
                                                   uintptr_t address) noexcept;
  // Slot index of the node an untagged node entry (node + kNodeTag) points to.
  [[gnu::always_inline]] static const std::atomic<uintptr_t> &linked_slot(uintptr_t link,
                                                                          uintptr_t index) {
    return *reinterpret_cast<const std::atomic<uintptr_t> *>(link + (kSlotsOffset - kNodeTag) +
                                                             index * sizeof(uintptr_t));
  }
  // if_node when entry is a node entry, else otherwise; without a branch (a conditional move),
  // for choices the predictor cannot learn.
  [[gnu::always_inline]] static uintptr_t select_if_node(uintptr_t entry, uintptr_t if_node,
                                                         uintptr_t otherwise) {
#if defined(__x86_64__)
    __asm__("test %[tag], %[entry]\n\tcmovnz %[if_node], %[result]"
            : [result] "+r"(otherwise)
            : [entry] "r"(entry), [if_node] "r"(if_node), [tag] "i"(kNodeTag)
            : "cc");
    return otherwise;
#else
    const uintptr_t mask = uintptr_t{0} - (entry & kNodeTag);
    return (if_node & mask) | (otherwise & ~mask);
#endif
  }
  static uintptr_t entry_for(const PgtRegion *region, uintptr_t block, unsigned level);
  static unsigned level_for(uintptr_t lo, uintptr_t hi);
  [[nodiscard]] LeafNode *new_leaf() noexcept;
  [[nodiscard]] InnerNode *new_inner() noexcept;
  void retire(NodeRef node) noexcept;
  void refresh_flat(uintptr_t address) noexcept;
  void update_leafy(NodeRef flat, unsigned group) noexcept;
  static bool group_is_leafy(NodeRef flat, unsigned group) noexcept;
  void flatten(const SlotRef &holder, NodeRef node) noexcept;
  void unflatten(const SlotRef &holder, NodeRef flat) noexcept;
  static NodeRef place(uintptr_t entry, unsigned slot_level, uintptr_t address,
                       uintptr_t &base) noexcept;
  void set_root(uintptr_t entry) noexcept;
  void window_follow(NodeRef node, unsigned index, uintptr_t updated) noexcept;
  template <class Fn>
  static void spell_out(uintptr_t entry, uintptr_t block, Fn &&fn);
  // The end of a change: the windows fitted to the tree if the root or a candidate changed.
  mrc_status_t changed(mrc_status_t status) noexcept {
    if (window_check_) refresh_window();
    return status;
  }
  void refresh_window() noexcept;
  unsigned window_candidates(NodeRef (&candidates)[kWindows], bool &whole) const noexcept;
  void fit_window(unsigned k, const NodeRef *node, bool whole) noexcept;
  void build_window(unsigned k, NodeRef node, unsigned lo, unsigned hi, bool whole) noexcept;
  void replace_window(unsigned k, Window *window) noexcept;
  bool check_window() const noexcept;

  template <class Visit>
  static bool walk_range(uintptr_t entry, uintptr_t &cursor, uintptr_t to, Visit &visit);
  template <class OnRegion>
  void purge_walk(uintptr_t entry, const PgtRegion *&last, OnRegion &on_region);
  template <class Fn>
  static void nodes_below(uintptr_t entry, Fn &fn);

  void set_slot(NodeRef node, unsigned index, uintptr_t old, uintptr_t updated) noexcept;
  void store(const SlotRef &at, uintptr_t old, uintptr_t updated) noexcept;
  NodeCount count_new_nodes(uintptr_t entry, unsigned level, uintptr_t block,
                            const PgtRegion *region) const noexcept;
  uintptr_t insert_into(uintptr_t entry, unsigned level, uintptr_t block, PgtRegion *region,
                        NodeReserve &reserve) noexcept;
  void insert_into_node(NodeRef node, PgtRegion *region, NodeReserve &reserve) noexcept;
  [[nodiscard]] mrc_status_t insert_beside(const SlotRef &at, PgtRegion *other,
                                           PgtRegion *region) noexcept;
  static void fill_private(NodeRef node, const PgtRegion *region, unsigned skip) noexcept;
  uintptr_t remove_from(uintptr_t entry, unsigned level, const PgtRegion *region,
                        Unlinked &unlinked) noexcept;
  uintptr_t collapse(NodeRef node, unsigned level, uintptr_t entry, Unlinked &unlinked) noexcept;
  // One step of a descent from root_: the node holding a slot (ptr 0: root_), the slot's index
  // there, and what the slot held.
  struct Step {
    NodeRef owner;
    unsigned index;
    uintptr_t entry;
  };
  void unwind(const Step *path, unsigned depth, uintptr_t updated, Unlinked &unlinked) noexcept;
  void finish_unlinked(Unlinked &unlinked) noexcept;
  static uint64_t kept_bit(uintptr_t node) noexcept { return uint64_t{1} << ((node >> 3) & 63); }
  void refilter() noexcept;
  bool is_kept(uintptr_t node) const noexcept;
  void set_hint(NodeRef node) noexcept;
  bool hinted_slot(uintptr_t start, uintptr_t end, unsigned &index) const noexcept;
  bool keep(NodeRef node, Unlinked &unlinked) noexcept;
  void forget(uintptr_t node) noexcept;
  void settle_node(uintptr_t ptr, uintptr_t base, unsigned level) noexcept;
  struct Census {
    size_t nodes = 0, regions = 0, bytes = 0;
    uintptr_t covered = 0, region_bytes = 0;
    const PgtRegion *last = nullptr;
    size_t kept = 0;  // kept nodes reached
  };
  bool check_entry(uintptr_t entry, unsigned level, uintptr_t block, Census &census) const noexcept;

  std::atomic<uintptr_t> root_{0};
  std::atomic<Window *> windows_[kWindows] = {};  // see the shape notes; on root_'s line
  std::atomic<unsigned> root_level_{0};  // the root node's level: a hint, written after root_
  std::atomic<size_t> size_{0};
  std::atomic<size_t> nodes_{0};
  std::atomic<size_t> bytes_{0};
  EpochDomain &domain_;
  NodePool pool_;
  size_t flats_ = 0;  // writer only: flat nodes in the table
  // Writer only: the kept nodes (0: a free entry), the oldest first from kept_next_, how many,
  // the evictions inserts have paid for, and the removals since the last eviction that could not
  // keep their node.
  uintptr_t kept_[kKeptNodes] = {};
  // Writer only: a bit for each kept node (kept_bit()), or more: is_kept() and forget() run for
  // every node a change touches, and mostly find nothing.
  uint64_t kept_filter_ = 0;
  unsigned kept_next_ = 0;
  unsigned kept_count_ = 0;
  unsigned keep_credit_ = 0;
  unsigned unkept_removals_ = 0;
  // Writer only: the kept node used last (0: none), its block's first address and its level. A
  // kept node is linked (forgotten when unlinked), so insert() and remove() of a region inside one
  // of its slots go straight there: no descent from the root for the cache's round trips.
  uintptr_t hint_node_ = 0;
  uintptr_t hint_base_ = 0;
  unsigned hint_level_ = 0;
  // Writer only, for each window: the level-2 node it mirrors (0: no window), the node's slots it
  // covers [lo, hi), and a copy of its header (no other cache line to read when set_slot()
  // mirrors a change). The nodes that may have windows (window_candidates()), whether any window
  // exists, and whether the root or a candidate's slot changed since the windows were last
  // fitted (refresh_window()).
  struct WindowFit {
    uintptr_t node = 0;
    unsigned lo = 0, hi = 0;
    uintptr_t first = 0, count = 0, bias = 0;
  };
  WindowFit fit_[kWindows];
  uintptr_t window_nodes_[kWindows] = {};
  bool windows_on_ = false;
  bool window_check_ = false;
};

// ---- inline reader paths ------------------------------------------------------------------------

template <unsigned kInnerBits, unsigned kLeafBits>
inline uintptr_t RadixPageTable<kInnerBits, kLeafBits>::below_level1(
    uintptr_t entry, uintptr_t address, uintptr_t &bounds) const noexcept {
  // The last inner level, where the walk ends at a region (or 0) or goes down to a leaf:
  // a coin toss for the branch predictor where small and large regions mix. The leaf's
  // slot is read without a branch: from the leaf when entry is one, else from any
  // readable word (root_, its value unused), and the result is selected. The choice is
  // made on the base of the load, so its address is still one instruction.
  const uintptr_t leaf_index = (address >> kPageShift) & (kLeafFanout - 1);
  const uintptr_t elsewhere = reinterpret_cast<uintptr_t>(&root_) - (kSlotsOffset - kNodeTag) -
                              leaf_index * sizeof(uintptr_t);
  const uintptr_t below = linked_slot(select_if_node(entry, entry, elsewhere), leaf_index)
                              .load(std::memory_order_acquire);
  // A page slot's region covers the page: its bounds are checked against kEverywhere
  // instead (a cache line already here rather than the region's).
  bounds = select_if_node(entry, reinterpret_cast<uintptr_t>(&kEverywhere), entry);
  return select_if_node(entry, below, entry);
}

template <unsigned kInnerBits, unsigned kLeafBits>
inline PgtRegion *RadixPageTable<kInnerBits, kLeafBits>::checked(uintptr_t entry, uintptr_t bounds,
                                                                 uintptr_t address) noexcept {
  if (entry == 0) return nullptr;
  // A branch, predicted taken on a hit: the caller's use of the region does not wait for it.
  const PgtRegion *region = region_of(bounds);
  if (__builtin_expect(address - region->start >= region->end - region->start, 0)) {
    return nullptr;
  }
  return region_of(entry);
}

template <unsigned kInnerBits, unsigned kLeafBits>
inline PgtRegion *RadixPageTable<kInnerBits, kLeafBits>::lookup(uintptr_t address) const noexcept {
  // No test of kAddressLimit: a wider address may index a slot (the top node's index wraps), but
  // never passes the bounds check of what it finds.
  uintptr_t entry = root_.load(std::memory_order_acquire);
  // The region whose bounds the result must pass: the entry's own, unless it comes from a slot of
  // one page (which its region covers whole).
  uintptr_t bounds = entry;
  if ((entry & kTagMask) != 0) {
    if ((entry & kNodeTag) != 0) {
      // A table with a window (docs/DESIGN.md, "Windows") has the same shape for a long time: the
      // branch predicts well, and the window's header does not wait for the address.
      if (const Window *window = windows_[0].load(std::memory_order_acquire); window != nullptr) {
        const uintptr_t block = address >> slot_shift(1);
        uintptr_t bias = window->bias;
        bool inside = block - window->first < window->count;
        if (const Window *other = windows_[1].load(std::memory_order_acquire); other != nullptr) {
          // Two clusters, a window each: the bias of the one whose blocks hold the address,
          // chosen without a branch (lookups go to either) from headers that do not wait for it.
          const bool in_other = block - other->first < other->count;
          const uintptr_t mask = uintptr_t{0} - uintptr_t{in_other};
          bias = (other->bias & mask) | (bias & ~mask);
          inside = inside || in_other;
        }
        if (inside) {
          entry = reinterpret_cast<const std::atomic<uintptr_t> *>(bias + block * sizeof(uintptr_t))
                      ->load(std::memory_order_acquire);
          entry = below_level1(entry, address, bounds);
          return checked(entry, bounds, address);
        }
        if (window->whole != 0) return nullptr;  // no region outside it
        // Elsewhere: through the tree.
      }
      const uintptr_t node = pointer_of(entry);
      // A guess of the root node's level (checked against its header below) lets the first index
      // be computed while root_ and the header are still loading.
      unsigned level = root_level_.load(std::memory_order_relaxed);
      const uintptr_t header = header_of(node);
      // Opaque to the compiler, which would otherwise use the header's level on both paths.
      bool stale = level != level_in(header);
      __asm__("" : "+r"(stale));
      if (__builtin_expect(stale, 0)) {
        level = level_in(header);
        __asm__ volatile("");  // keeps this a branch: a cmov would make the index wait for it
      }
      // The root covers its block only (unless it is the top node, whose block is everything).
      if (((address ^ header) >> slot_shift(level + 1)) != 0) return nullptr;
      // Inside that block the root's slot for address is at a fixed bias plus (address >> shift)
      // slots: the bias comes from root_ and the header, which do not wait for the address, so
      // the first load waits for one shift of the address only (unsigned arithmetic: the bias may
      // wrap, the sum does not).
      const unsigned root_shift = slot_shift(level);
      uintptr_t root_bias =
          node + kSlotsOffset - ((header >> root_shift) << std::countr_zero(sizeof(uintptr_t)));
      // Opaque: the compiler would otherwise add the address's part first and subtract the
      // header's after it (three more steps between the address and the first load).
      __asm__("" : "+r"(root_bias));
      entry = reinterpret_cast<const std::atomic<uintptr_t> *>(root_bias + (address >> root_shift) *
                                                                               sizeof(uintptr_t))
                  ->load(std::memory_order_acquire);
      // Then down: entry was read from a slot at `level`. A node entry without skipped levels is
      // its node + kNodeTag, and the node's slots are at a constant offset from it: each load's
      // address is the word loaded before, a constant and an index computed from the address
      // alone (one instruction).
      for (;;) {
        if (level == 1) {
          entry = below_level1(entry, address, bounds);
          break;
        }
        if ((entry & kNodeTag) == 0 || level == 0) {  // a region, 0 or a flat node
          bounds = entry;
          break;
        }
        uintptr_t link = entry;
        if (__builtin_expect((entry & kSkipTag) == 0, 1)) {
          --level;  // the usual case, taken as predicted
        } else {
          // A path-compressed child covers only part of the slot: its level is in the entry, its
          // prefix in its header (checked by a branch: the next load does not wait for it).
          const uintptr_t child = pointer_of(entry);
          level = static_cast<unsigned>(entry >> kEntryLevelShift);
          if (((address ^ header_of(child)) >> slot_shift(level + 1)) != 0) return nullptr;
          link = child + kNodeTag;
        }
        entry = linked_slot(link, (address >> slot_shift(level)) & (fanout(level) - 1))
                    .load(std::memory_order_acquire);
      }
    }
    if constexpr (kFlats) {
      // A flat node ends the descent (the branch follows the table's shape, so it predicts well):
      // the page's slot is at a constant offset from the loaded word and an index from the
      // address. The prefix check loads the header, but is a branch off the path to the slot.
      if ((entry & kTagMask) == kFlatTag) {
        const uintptr_t flat = entry - kFlatTag;
        if (((address ^ header_of(flat)) >> slot_shift(kFlatLevel + 1)) != 0) return nullptr;
        entry = slots_of(flat)[(address >> kPageShift) & (kFlatFanout - 1)].load(
            std::memory_order_acquire);
        return region_of(entry);  // a page slot: its region (or 0) covers the page
      }
    }
  }
  return checked(entry, bounds, address);
}

template <unsigned kInnerBits, unsigned kLeafBits>
template <class Visit>
bool RadixPageTable<kInnerBits, kLeafBits>::walk_range(uintptr_t entry, uintptr_t &cursor,
                                                       uintptr_t to, Visit &visit) {
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
  const NodeRef node = node_of(entry);
  const uintptr_t base = node.base();
  if (node.end() <= cursor || base >= to) return true;
  const unsigned shift = node.shift();
  for (uintptr_t i = cursor > base ? (cursor - base) >> shift : 0; i < node.fanout(); ++i) {
    const uintptr_t block = base + (i << shift);
    if (block >= to) break;
    if (block + node.slot_size() <= cursor) continue;  // a region visited already covers it
    const uintptr_t child = node.slot(static_cast<unsigned>(i)).load(std::memory_order_acquire);
    if (!walk_range(child, cursor, to, visit)) return false;
  }
  return true;
}

template <unsigned kInnerBits, unsigned kLeafBits>
template <class Visit>
void RadixPageTable<kInnerBits, kLeafBits>::for_each_overlapping(uintptr_t from, uintptr_t to,
                                                                 Visit &&visit) const {
  if (to > kAddressLimit) to = kAddressLimit;
  if (from >= to) return;
  uintptr_t cursor = from;
  walk_range(root_.load(std::memory_order_acquire), cursor, to, visit);
}

template <unsigned kInnerBits, unsigned kLeafBits>
template <class OnRegion>
void RadixPageTable<kInnerBits, kLeafBits>::purge_walk(uintptr_t entry, const PgtRegion *&last,
                                                       OnRegion &on_region) {
  if (entry == 0) return;
  if (!is_node(entry)) {
    // A region's entries are consecutive in address order: comparing pointers is enough, and the
    // callback may already have retired the region, so it is never dereferenced here.
    PgtRegion *region = region_of(entry);
    if (region != last) {
      last = region;
      on_region(region);
    }
    return;
  }
  const NodeRef node = node_of(entry);
  for (unsigned i = 0; i < node.fanout(); ++i) {
    purge_walk(node.slot(i).load(std::memory_order_relaxed), last, on_region);
  }
  retire(node);  // unlinked already (root cleared), and never read again by this walk
}

template <unsigned kInnerBits, unsigned kLeafBits>
template <class OnRegion>
void RadixPageTable<kInnerBits, kLeafBits>::purge(OnRegion &&on_region) {
  // The windows go before the nodes they point to are retired.
  for (unsigned k = 0; k < kWindows; ++k) replace_window(k, nullptr);
  for (uintptr_t &node : window_nodes_) node = 0;
  const uintptr_t root = root_.load(std::memory_order_relaxed);
  root_.store(0, std::memory_order_release);
  size_.store(0, std::memory_order_relaxed);
  nodes_.store(0, std::memory_order_relaxed);
  bytes_.store(0, std::memory_order_relaxed);
  flats_ = 0;
  for (uintptr_t &kept : kept_) kept = 0;  // every node goes
  kept_count_ = 0;
  kept_filter_ = 0;
  hint_node_ = 0;
  const PgtRegion *last = nullptr;
  purge_walk(root, last, on_region);
  pool_.flush();
}

template <unsigned kInnerBits, unsigned kLeafBits>
template <class Fn>
void RadixPageTable<kInnerBits, kLeafBits>::nodes_below(uintptr_t entry, Fn &fn) {
  if (!is_node(entry)) return;
  const NodeRef node = node_of(entry);
  fn(reinterpret_cast<const void *>(node.ptr));
  for (unsigned i = 0; i < node.fanout(); ++i) {
    nodes_below(node.slot(i).load(std::memory_order_relaxed), fn);
  }
}

template <unsigned kInnerBits, unsigned kLeafBits>
template <class Fn>
void RadixPageTable<kInnerBits, kLeafBits>::for_each_node(Fn &&fn) const {
  nodes_below(root_.load(std::memory_order_relaxed), fn);
}

// PageTable's shape (below) is instantiated in pgtable.cc, the library's only one. Other shapes are
// instantiated by whoever uses them, from pgtable/definitions.h (the tests, the benchmark).
extern template class RadixPageTable<7, 4>;

}  // namespace detail

// The page table the cache uses: 128-slot inner nodes, 16-slot leaves. Measured against 16 to 256
// slots (bench_pgtable.cc): 16-slot leaves cost the same bytes per region as UCX's 16-entry
// directories where regions are dense, and far less where they are mixed or sparse (a leaf only
// where two regions meet inside 64 KiB); 128-slot inner nodes resolve 7 bits per load, so 1,000
// regions in 8 MiB take 3 dependent loads (UCX: 4), 1,000 heap-like regions in 200 MiB take 2
// through the root window (UCX: 4), as do those split between the heap and the mmap area
// through two windows, and 10^6 regions in 8 GiB take 5 (UCX: 7).
class PageTable : public detail::RadixPageTable<7, 4> {
 public:
  using RadixPageTable::RadixPageTable;
};

}  // namespace mrc
