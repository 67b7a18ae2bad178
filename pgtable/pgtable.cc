// The radix page table's writer side; the shape and the contract are in pgtable.h.
#include "pgtable/pgtable.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <iterator>
#include <new>

#include "base/check.h"

namespace mrc::detail {
namespace {

// Calls fn(index, block_start) for every slot of a node (base, fanout slots of 2^shift bytes) whose
// block intersects region, in address order.
template <class Fn>
void for_each_slot_of(uintptr_t base, unsigned shift, unsigned fanout, const PgtRegion *region,
                      Fn &&fn) {
  const uintptr_t end = base + (uintptr_t{fanout} << shift);
  const uintptr_t lo = std::max(region->start, base);
  const uintptr_t hi = std::min(region->end, end);
  if (lo >= hi) return;
  const uintptr_t last = (hi - 1 - base) >> shift;
  for (uintptr_t i = (lo - base) >> shift; i <= last; ++i) {
    fn(static_cast<unsigned>(i), base + (i << shift));
  }
}

}  // namespace

#define MRC_TABLE template <unsigned kInnerBits, unsigned kLeafBits>
#define MRC_SELF RadixPageTable<kInnerBits, kLeafBits>

MRC_TABLE MRC_SELF::RadixPageTable(EpochDomain &domain) noexcept
    : domain_(domain), pool_(domain, {sizeof(LeafNode), sizeof(InnerNode), sizeof(FlatNode)}) {}

// No reader is left (see the contract): the windows go at once; the pool unmaps the nodes.
MRC_TABLE MRC_SELF::~RadixPageTable() {
  for (std::atomic<Window *> &window : windows_) std::free(window.load(std::memory_order_relaxed));
}

// A node from the pool with every slot empty. Pool memory is zero when fresh, and a recycled node
// is as the table left it when it retired the node (node_pool.h), so only the slots that held
// something need clearing: all 16 of a leaf, the occupied ones of an inner node. Under
// ThreadSanitizer the whole node is re-created with plain stores instead, so that reusing a node
// under a live reader would be reported as a data race.
MRC_TABLE typename MRC_SELF::LeafNode *MRC_SELF::new_leaf() noexcept {
  void *memory = pool_.allocate(kLeafClass);
  if (memory == nullptr) return nullptr;
#if defined(MRC_TSAN)
  return new (memory) LeafNode();
#else
  LeafNode *leaf = std::launder(static_cast<LeafNode *>(memory));
  for (std::atomic<uintptr_t> &slot : leaf->slots) slot.store(0, std::memory_order_relaxed);
  return leaf;
#endif
}

MRC_TABLE typename MRC_SELF::InnerNode *MRC_SELF::new_inner() noexcept {
  void *memory = pool_.allocate(kInnerClass);
  if (memory == nullptr) return nullptr;
#if defined(MRC_TSAN)
  return new (memory) InnerNode();
#else
  InnerNode *inner = std::launder(static_cast<InnerNode *>(memory));
  for (unsigned w = 0; w < std::size(inner->occupied); ++w) {
    for (uint64_t bits = inner->occupied[w]; bits != 0; bits &= bits - 1) {
      inner->slots[64 * w + static_cast<unsigned>(std::countr_zero(bits))].store(
          0, std::memory_order_relaxed);
    }
    inner->occupied[w] = 0;
  }
  inner->children = 0;
  return inner;
#endif
}

MRC_TABLE void MRC_SELF::retire(NodeRef node) noexcept {
  // A window goes with the node it mirrors (before the node's memory can be reused, even within
  // this change).
  if (windows_on_ && node.level == kWindowLevel) {
    for (unsigned k = 0; k < kWindows; ++k) {
      if (fit_[k].node == node.ptr) replace_window(k, nullptr);
      if (window_nodes_[k] == node.ptr) window_nodes_[k] = 0;
    }
  }
  pool_.retire(reinterpret_cast<void *>(node.ptr), node.level == 0 ? kLeafClass
                                                   : node.flat     ? kFlatClass
                                                                   : kInnerClass);
}

MRC_TABLE void MRC_SELF::set_root(uintptr_t entry) noexcept {
  root_.store(entry, std::memory_order_release);
  // Only a hint for lookup(), which checks it against the header: relaxed is enough.
  if (is_node(entry)) root_level_.store(node_of(entry).level, std::memory_order_relaxed);
  window_check_ = true;  // refresh_window() fits the windows to the new root
}

// Every writer store into a node goes through here, to keep the inner nodes' counts. Release: a
// node stored here is complete before a reader can reach it (for a node still private the ordering
// is not needed, and on x86 costs nothing).
MRC_TABLE [[gnu::always_inline]] inline void MRC_SELF::set_slot(NodeRef node, unsigned index,
                                                                uintptr_t old,
                                                                uintptr_t updated) noexcept {
  if (node.is_inner()) {
    InnerNode *inner = node.inner();
    const uint64_t bit = uint64_t{1} << (index % 64);
    inner->occupied[index / 64] =
        updated != 0 ? inner->occupied[index / 64] | bit : inner->occupied[index / 64] & ~bit;
    inner->children = static_cast<uint16_t>(inner->children + is_node(updated) - is_node(old));
  }
  node.slot(index).store(updated, std::memory_order_release);
  if (windows_on_ || node.level >= kWindowLevel) window_follow(node, index, updated);
}

// set_slot()'s part for the windows: the same change in a window (a level-1 slot it covers, or a
// slot of the level-2 node it mirrors, whose block is spelled out anew), and whether the root's
// or a candidate's slots changed (refresh_window() decides then which windows there are). A
// level-1 node still private (being built) may be mirrored already: it is complete before its
// parent is stored, and its slots are what the window holds once that happens. Slots of a
// mirrored node outside the window's span are left to refresh_window().
MRC_TABLE void MRC_SELF::window_follow(NodeRef node, unsigned index, uintptr_t updated) noexcept {
  if (node.level >= kWindowLevel) {
    window_check_ = window_check_ ||
                    node.ptr == pointer_of(root_.load(std::memory_order_relaxed)) ||
                    std::find(std::begin(window_nodes_), std::end(window_nodes_), node.ptr) !=
                        std::end(window_nodes_);
  }
  if (!windows_on_) return;
  if (node.level == 1 && !node.flat) {
    const uintptr_t block = (node.base() >> slot_shift(1)) + index;
    for (const WindowFit &fit : fit_) {
      if (block - fit.first < fit.count) {  // count 0 without a window; windows are disjoint
        reinterpret_cast<std::atomic<uintptr_t> *>(fit.bias + block * sizeof(uintptr_t))
            ->store(updated, std::memory_order_release);
        return;
      }
    }
    return;
  }
  for (const WindowFit &fit : fit_) {
    if (node.ptr != fit.node || index < fit.lo || index >= fit.hi) continue;
    auto *slots = reinterpret_cast<std::atomic<uintptr_t> *>(
        fit.bias + (fit.first + uintptr_t{index - fit.lo} * kInnerFanout) * sizeof(uintptr_t));
    spell_out(updated, node.base() + (uintptr_t{index} << slot_shift(kWindowLevel)),
              [slots](unsigned i, uintptr_t entry) {
                if (slots[i].load(std::memory_order_relaxed) != entry) {
                  slots[i].store(entry, std::memory_order_release);
                }
              });
  }
}

MRC_TABLE inline void MRC_SELF::store(const SlotRef &at, uintptr_t old,
                                      uintptr_t updated) noexcept {
  if (at.owner.ptr == 0) {
    set_root(updated);
  } else {
    set_slot(at.owner, at.index, old, updated);
  }
}

// The node `entry` points to, read from a slot at slot_level whose block holds address, and the
// first address of the node's block. Without skipped levels both follow from the slot, and the
// node's header (another cache line) is not read.
MRC_TABLE inline typename MRC_SELF::NodeRef MRC_SELF::place(uintptr_t entry, unsigned slot_level,
                                                            uintptr_t address,
                                                            uintptr_t &base) noexcept {
  if ((entry & kTagMask) == kNodeTag) {
    base = address & ~(block_size(slot_level) - 1);
    return {pointer_of(entry), slot_level - 1};
  }
  const NodeRef node = node_of(entry);
  base = node.base();
  return node;
}

// The entry a slot at `level` covering `block` holds for region when region is the only one there:
// 0 (disjoint) or the region.
MRC_TABLE uintptr_t MRC_SELF::entry_for(const PgtRegion *region, uintptr_t block, unsigned level) {
  const uintptr_t end = block + block_size(level);
  if (region->end <= block || region->start >= end) return 0;
  return reinterpret_cast<uintptr_t>(region);
}

// The level of the lowest node whose aligned block holds both lo and hi - 1 (which lie in different
// pages).
MRC_TABLE unsigned MRC_SELF::level_for(uintptr_t lo, uintptr_t hi) {
  const unsigned top_bit = static_cast<unsigned>(std::bit_width(lo ^ (hi - 1))) - 1;
  MRC_DASSERT(top_bit >= kPageShift && top_bit < 64);
  if (top_bit < kPageShift + kLeafBits) return 0;
  return 1 + (top_bit - kPageShift - kLeafBits) / kInnerBits;
}

// ---- insert -------------------------------------------------------------------------------------

// Dry run of insert_into(): the nodes inserting region below this entry will create, or an overlap
// with a region already there.
MRC_TABLE typename MRC_SELF::NodeCount MRC_SELF::count_new_nodes(
    uintptr_t entry, unsigned level, uintptr_t block, const PgtRegion *region) const noexcept {
  NodeCount count;
  if (entry == 0) return count;
  const uintptr_t block_end = block + block_size(level);
  const uintptr_t lo = std::max(region->start, block);
  const uintptr_t hi = std::min(region->end, block_end);
  count.overlap = lo == block && hi == block_end;  // covers a block that is not empty
  if (count.overlap) return count;
  auto add = [&count](const NodeCount &more) {
    count.leaves += more.leaves;
    count.inner += more.inner;
    count.overlap = count.overlap || more.overlap;
  };
  auto one_more = [&count](unsigned node_level) {
    ++(node_level == 0 ? count.leaves : count.inner);
  };

  if (!is_node(entry)) {
    const PgtRegion *other = region_of(entry);
    count.overlap = other->start < hi && other->end > lo;
    if (count.overlap) return count;
    const uintptr_t other_lo = std::max(other->start, block);
    const uintptr_t other_hi = std::min(other->end, block_end);
    const unsigned node_level = level_for(std::min(lo, other_lo), std::max(hi, other_hi));
    const uintptr_t base = std::min(lo, other_lo) & ~(block_size(node_level + 1) - 1);
    one_more(node_level);
    for_each_slot_of(
        base, slot_shift(node_level), fanout(node_level), region, [&](unsigned, uintptr_t sub) {
          add(count_new_nodes(entry_for(other, sub, node_level), node_level, sub, region));
        });
    return count;
  }
  const NodeRef node = node_of(entry);
  const uintptr_t base = node.base();
  const uintptr_t end = node.end();
  if (lo >= base && hi <= end) {
    for_each_slot_of(base, node.shift(), node.fanout(), region, [&](unsigned i, uintptr_t sub) {
      add(count_new_nodes(node.slot(i).load(std::memory_order_relaxed), node.slot_level(), sub,
                          region));
    });
    return count;
  }
  const unsigned parent_level = level_for(std::min(lo, base), std::max(hi, end));
  const uintptr_t parent_base = std::min(lo, base) & ~(block_size(parent_level + 1) - 1);
  const uintptr_t node_index = (base - parent_base) >> slot_shift(parent_level);
  const uintptr_t moved = node_entry(node, parent_level);
  one_more(parent_level);
  for_each_slot_of(parent_base, slot_shift(parent_level), fanout(parent_level), region,
                   [&](unsigned i, uintptr_t sub) {
                     add(count_new_nodes(i == node_index ? moved : 0, parent_level, sub, region));
                   });
  return count;
}

// Returns what the slot at `level` covering `block` must hold once region is inserted. A live node
// is updated in place (each slot store publishes a finished value); a new node is filled while
// private and published by the caller's store.
MRC_TABLE uintptr_t MRC_SELF::insert_into(uintptr_t entry, unsigned level, uintptr_t block,
                                          PgtRegion *region, NodeReserve &reserve) noexcept {
  const uintptr_t block_end = block + block_size(level);
  const uintptr_t lo = std::max(region->start, block);
  const uintptr_t hi = std::min(region->end, block_end);
  if (lo == block && hi == block_end) {
    MRC_DASSERT(entry == 0);  // overlaps were rejected
    return reinterpret_cast<uintptr_t>(region);
  }
  if (entry == 0) return reinterpret_cast<uintptr_t>(region);

  auto take = [&reserve](unsigned node_level, uintptr_t base) {
    NodeRef node{0, node_level};
    if (node_level == 0) {
      MRC_CHECK(reserve.leaf_count > 0);  // count_new_nodes() and insert_into() disagree
      LeafNode *leaf = reserve.leaves[--reserve.leaf_count];
      leaf->header = base | node_level;
      node.ptr = reinterpret_cast<uintptr_t>(leaf);
    } else {
      MRC_CHECK(reserve.inner_count > 0);
      InnerNode *inner = reserve.inner[--reserve.inner_count];
      inner->header = base | node_level;
      node.ptr = reinterpret_cast<uintptr_t>(inner);
    }
    return node;
  };

  if (!is_node(entry)) {
    // The slot's only region meets a second one: a node at the level where they part.
    const PgtRegion *other = region_of(entry);
    MRC_DASSERT(other->start > block || other->end < block_end);  // else an overlap
    const uintptr_t other_lo = std::max(other->start, block);
    const uintptr_t other_hi = std::min(other->end, block_end);
    const unsigned node_level = level_for(std::min(lo, other_lo), std::max(hi, other_hi));
    MRC_DASSERT(node_level < level);
    const NodeRef node =
        take(node_level, std::min(lo, other_lo) & ~(block_size(node_level + 1) - 1));
    for_each_slot_of(node.base(), slot_shift(node_level), node.fanout(), other,
                     [&](unsigned i, uintptr_t sub) {
                       set_slot(node, i, 0, entry_for(other, sub, node_level));
                     });
    insert_into_node(node, region, reserve);
    return node_entry(node, level);
  }

  const NodeRef node = node_of(entry);
  const uintptr_t base = node.base();
  const uintptr_t end = node.end();
  if (lo >= base && hi <= end) {
    insert_into_node(node, region, reserve);
    return entry;
  }
  // The region falls outside a path-compressed node: a new node above both.
  const unsigned parent_level = level_for(std::min(lo, base), std::max(hi, end));
  MRC_DASSERT(parent_level > node.level && parent_level < level);
  const NodeRef parent =
      take(parent_level, std::min(lo, base) & ~(block_size(parent_level + 1) - 1));
  set_slot(parent, static_cast<unsigned>((base - parent.base()) >> slot_shift(parent_level)), 0,
           node_entry(node, parent_level));
  insert_into_node(parent, region, reserve);
  return node_entry(parent, level);
}

MRC_TABLE void MRC_SELF::insert_into_node(NodeRef node, PgtRegion *region,
                                          NodeReserve &reserve) noexcept {
  for_each_slot_of(
      node.base(), node.shift(), node.fanout(), region, [&](unsigned i, uintptr_t sub) {
        const uintptr_t old = node.slot(i).load(std::memory_order_relaxed);
        const uintptr_t updated = insert_into(old, node.slot_level(), sub, region, reserve);
        // Release: a node created below is complete before readers can reach it.
        if (updated != old) set_slot(node, i, old, updated);
      });
}

MRC_TABLE mrc_status_t MRC_SELF::insert(PgtRegion *region) noexcept {
  if (region == nullptr) return MRC_ERR_INVALID;
  const uintptr_t start = region->start;
  const uintptr_t end = region->end;
  if (((start | end) & (kPageSize - 1)) != 0 || start >= end || end > kAddressLimit) {
    return MRC_ERR_INVALID;
  }
  if ((reinterpret_cast<uintptr_t>(region) & kTagMask) != 0) return MRC_ERR_INVALID;
  // Back into an empty slot of the kept node used last (see hint_node_): no region intersects the
  // slot's block, and the descent would end there.
  unsigned hinted;
  if (hinted_slot(start, end, hinted)) {
    const NodeRef node{hint_node_, hint_level_};
    if (node.slot(hinted).load(std::memory_order_relaxed) == 0) {
      set_slot(node, hinted, 0, reinterpret_cast<uintptr_t>(region));
      size_.store(size_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      if (keep_credit_ < kKeptNodes) ++keep_credit_;
      return changed(MRC_OK);
    }
  }

  // Down to the slot where the region stops fitting in one slot of a node: the nodes above it do
  // not change (the recursion below would pass through them one slot at a time).
  // Scalars while descending, the SlotRefs built once below: copying those structs (partly written
  // field by field, read back whole) stalled every step on store forwarding.
  NodeRef owner{0, kLevels};  // the node holding the slot (ptr 0: root_)
  NodeRef above{0, kLevels};  // the node holding owner's slot
  unsigned index = 0, above_index = 0;
  uintptr_t block = 0;
  uintptr_t entry = root_.load(std::memory_order_relaxed);
  while (is_node(entry)) {
    uintptr_t base;
    const NodeRef node = place(entry, owner.slot_level(), start, base);
    const unsigned shift = node.shift();
    const uintptr_t slot = (start - base) >> shift;
    // start inside the node's block, end - 1 in the same slot.
    if (start < base || slot >= node.fanout() || (end - 1 - base) >> shift != slot) break;
    above = owner;
    above_index = index;
    owner = node;
    index = static_cast<unsigned>(slot);
    block = base + (slot << shift);
    entry = node.slot(slot).load(std::memory_order_relaxed);
  }
  const SlotRef at{owner, index, owner.slot_level(), block};
  // A region back in a kept node: keeping pays, and earns an eviction (see keep()).
  if (kept_count_ != 0 && owner.ptr != 0 && is_kept(owner.ptr)) {
    if (keep_credit_ < kKeptNodes) ++keep_credit_;
    set_hint(owner);
  }
  // The usual cases, without the general recursion: an empty slot, or one holding a single region.
  if (entry == 0) {
    store(at, 0, reinterpret_cast<uintptr_t>(region));
    size_.store(size_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (kFlats && at.owner.flat) update_leafy(at.owner, at.index / kLeafFanout);
    return changed(MRC_OK);
  }
  if (!is_node(entry)) {
    const mrc_status_t status = insert_beside(at, region_of(entry), region);
    // A leaf more in a level-1 node.
    if (kFlats && status == MRC_OK && at.owner.is_inner() && at.owner.level == kFlatLevel &&
        at.owner.inner()->children >= kFlatFrom) {
      flatten({above, above_index, above.slot_level(), 0}, at.owner);
    }
    return changed(status);
  }

  const NodeCount needed = count_new_nodes(entry, at.level, at.block, region);
  if (needed.overlap) return MRC_ERR_EXISTS;
  NodeReserve reserve;
  MRC_CHECK(needed.leaves <= std::size(reserve.leaves) && needed.inner <= std::size(reserve.inner));
  bool allocated = true;
  while (allocated && reserve.leaf_count < needed.leaves) {
    LeafNode *leaf = new_leaf();
    allocated = leaf != nullptr;
    if (allocated) reserve.leaves[reserve.leaf_count++] = leaf;
  }
  while (allocated && reserve.inner_count < needed.inner) {
    InnerNode *inner = new_inner();
    allocated = inner != nullptr;
    if (allocated) reserve.inner[reserve.inner_count++] = inner;
  }
  if (!allocated) {
    while (reserve.leaf_count > 0) {
      pool_.release_unpublished(reserve.leaves[--reserve.leaf_count], kLeafClass);
    }
    while (reserve.inner_count > 0) {
      pool_.release_unpublished(reserve.inner[--reserve.inner_count], kInnerClass);
    }
    return MRC_ERR_NO_MEMORY;
  }
  const uintptr_t updated = insert_into(entry, at.level, at.block, region, reserve);
  MRC_CHECK(reserve.leaf_count == 0 && reserve.inner_count == 0);
  if (updated != entry) store(at, entry, updated);
  const size_t new_nodes = needed.leaves + needed.inner;
  const size_t new_bytes = needed.leaves * sizeof(LeafNode) + needed.inner * sizeof(InnerNode);
  nodes_.store(nodes_.load(std::memory_order_relaxed) + new_nodes, std::memory_order_relaxed);
  bytes_.store(bytes_.load(std::memory_order_relaxed) + new_bytes, std::memory_order_relaxed);
  size_.store(size_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // Level-1 nodes and flat nodes change only where the region's ends are.
  if (kFlats) {
    refresh_flat(start);
    refresh_flat(end - 1);
  }
  return changed(MRC_OK);
}

// insert() where the slot `at` holds one region, other, and region lies inside the slot's block:
// a chain of new nodes separates the two. Each node is the lowest holding both pieces inside the
// block above it; they share at most one of its slots (the one holding the boundary between
// them), and the next node goes there. The chain is built while private and published by one store.
MRC_TABLE mrc_status_t MRC_SELF::insert_beside(const SlotRef &at, PgtRegion *other,
                                               PgtRegion *region) noexcept {
  const uintptr_t start = region->start;
  const uintptr_t end = region->end;
  if (other->start < end && other->end > start) return MRC_ERR_EXISTS;
  struct Link {
    unsigned level;
    uintptr_t base;
    unsigned shared;  // the slot holding the next link, or kNone
  };
  constexpr unsigned kNone = ~0u;
  Link chain[kLevels];
  unsigned length = 0;
  uintptr_t block = at.block;
  uintptr_t block_end = block + block_size(at.level);
  for (;;) {
    const uintptr_t other_lo = std::max(other->start, block);
    const uintptr_t other_hi = std::min(other->end, block_end);
    const uintptr_t lo = std::max(start, block);
    const uintptr_t hi = std::min(end, block_end);
    const unsigned level = level_for(std::min(lo, other_lo), std::max(hi, other_hi));
    MRC_DASSERT(length < kLevels && level < (length == 0 ? at.level : chain[length - 1].level));
    const uintptr_t base = std::min(lo, other_lo) & ~(block_size(level + 1) - 1);
    const unsigned shift = slot_shift(level);
    // The last page of the lower piece and the first page of the upper one.
    const uintptr_t last_below = (other_lo < lo ? other_hi : hi) - 1;
    const uintptr_t first_above = other_lo < lo ? lo : other_lo;
    const uintptr_t below_slot = (last_below - base) >> shift;
    const bool shared = below_slot == (first_above - base) >> shift;
    chain[length++] = {level, base, shared ? static_cast<unsigned>(below_slot) : kNone};
    if (!shared) break;
    block = base + (below_slot << shift);
    block_end = block + block_size(level);
  }

  uintptr_t nodes[kLevels];
  unsigned leaves = 0;
  for (unsigned i = 0; i < length; ++i) {
    void *node =
        chain[i].level == 0 ? static_cast<void *>(new_leaf()) : static_cast<void *>(new_inner());
    if (node == nullptr) {
      while (i-- > 0) {
        pool_.release_unpublished(reinterpret_cast<void *>(nodes[i]),
                                  chain[i].level == 0 ? kLeafClass : kInnerClass);
      }
      return MRC_ERR_NO_MEMORY;
    }
    nodes[i] = reinterpret_cast<uintptr_t>(node);
    leaves += chain[i].level == 0;
  }
  // Bottom-up, each node complete before its parent points to it; all private until the store.
  uintptr_t child = 0;
  for (unsigned i = length; i-- > 0;) {
    const NodeRef node{nodes[i], chain[i].level};
    if (node.level == 0) {
      node.leaf()->header = chain[i].base | node.level;
    } else {
      node.inner()->header = chain[i].base | node.level;
    }
    fill_private(node, other, chain[i].shared);
    fill_private(node, region, chain[i].shared);
    if (chain[i].shared != kNone) {
      set_slot(node, chain[i].shared, 0,
               node_entry(NodeRef{child, chain[i + 1].level}, node.level));
    }
    child = node.ptr;
  }
  store(at, reinterpret_cast<uintptr_t>(other),
        node_entry(NodeRef{child, chain[0].level}, at.level));
  nodes_.store(nodes_.load(std::memory_order_relaxed) + length, std::memory_order_relaxed);
  bytes_.store(bytes_.load(std::memory_order_relaxed) + leaves * sizeof(LeafNode) +
                   (length - leaves) * sizeof(InnerNode),
               std::memory_order_relaxed);
  size_.store(size_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return MRC_OK;
}

// Stores region into every slot of a private node that it intersects, except slot `skip` (an inner
// node's slot that will hold a child).
MRC_TABLE void MRC_SELF::fill_private(NodeRef node, const PgtRegion *region,
                                      unsigned skip) noexcept {
  const uintptr_t base = node.base();
  const unsigned shift = slot_shift(node.level);
  const uintptr_t first = (std::max(region->start, base) - base) >> shift;
  const uintptr_t last = (std::min(region->end, node.end()) - 1 - base) >> shift;
  const uintptr_t entry = reinterpret_cast<uintptr_t>(region);
  if (node.level == 0) {
    for (uintptr_t i = first; i <= last; ++i) {
      node.leaf()->slots[i].store(entry, std::memory_order_relaxed);
    }
    return;
  }
  InnerNode *inner = node.inner();
  for (uintptr_t i = first; i <= last; ++i) {
    if (i != skip) inner->slots[i].store(entry, std::memory_order_relaxed);
  }
  // The bits first..last, minus skip, word by word.
  for (uintptr_t w = first / 64; w <= last / 64; ++w) {
    const unsigned from = w == first / 64 ? static_cast<unsigned>(first % 64) : 0;
    const unsigned to = w == last / 64 ? static_cast<unsigned>(last % 64) : 63;
    uint64_t bits = (~uint64_t{0} >> (63 - to)) & (~uint64_t{0} << from);
    if (skip / 64 == w) bits &= ~(uint64_t{1} << (skip % 64));
    inner->occupied[w] |= bits;
  }
}

// ---- remove -------------------------------------------------------------------------------------

// Returns what the slot at `level` (whose block intersects region) holds once region is gone. Nodes
// left with a single region or a single child are replaced by it and queued in unlinked, to be
// retired after the caller has stored the replacement.
MRC_TABLE uintptr_t MRC_SELF::remove_from(uintptr_t entry, unsigned level, const PgtRegion *region,
                                          Unlinked &unlinked) noexcept {
  if (!is_node(entry)) {
    MRC_DASSERT(region_of(entry) == region);
    return 0;
  }
  const NodeRef node = node_of(entry);
  for_each_slot_of(node.base(), node.shift(), node.fanout(), region, [&](unsigned i, uintptr_t) {
    const uintptr_t old = node.slot(i).load(std::memory_order_relaxed);
    const uintptr_t updated = remove_from(old, node.slot_level(), region, unlinked);
    if (updated != old) set_slot(node, i, old, updated);
  });
  return collapse(node, level, entry, unlinked);
}

// After a slot of node (held as entry by a slot at `level`) was emptied or replaced: what that slot
// holds now. The node itself while it still separates two regions; else its only child, or its
// only region, and the node is queued in unlinked.
MRC_TABLE uintptr_t MRC_SELF::collapse(NodeRef node, unsigned level, uintptr_t entry,
                                       Unlinked &unlinked) noexcept {
  // A flat node keeps a group of two regions after any removal (kFlatUntil >= 3); it goes back to
  // a tree in refresh_flat(), never straight to one region.
  if (node.flat) return entry;
  // Still separating two regions: a child node sees two, and so does a node with another slot.
  unsigned first = 0, last = node.fanout() - 1;
  bool has_child = false, empty = false;
  if (node.level == 0) {
    while (first <= last && node.slot(first).load(std::memory_order_relaxed) == 0) ++first;
    empty = first > last;
    while (!empty && node.slot(last).load(std::memory_order_relaxed) == 0) --last;
  } else {
    const InnerNode *inner = node.inner();
    has_child = inner->children != 0;
    bool two_or_more = false;  // non-empty slots, counted only as far as two
    unsigned seen = 0;
    for (uint64_t word : inner->occupied) {
      two_or_more = two_or_more || (word & (word - 1)) != 0 || (word != 0 && seen != 0);
      seen += word != 0;
    }
    if (has_child && two_or_more) return entry;
    empty = seen == 0;
    if (!empty) {
      constexpr unsigned kWords = std::size(decltype(inner->occupied){});
      unsigned w = 0;
      while (inner->occupied[w] == 0) ++w;
      first = 64 * w + static_cast<unsigned>(std::countr_zero(inner->occupied[w]));
      w = kWords - 1;
      while (inner->occupied[w] == 0) --w;
      last = 64 * w + 63 - static_cast<unsigned>(std::countl_zero(inner->occupied[w]));
    }
  }
  auto slot = [&node](unsigned i) { return node.slot(i).load(std::memory_order_relaxed); };
  uintptr_t replacement;
  if (empty) {
    // Only a kept node loses its last region (any other node sees two).
    replacement = 0;
  } else if (first == last && is_node(slot(first))) {
    // Path compression: the child takes the node's place, its tag counted from our slot.
    replacement = node_entry(node_of(slot(first)), level);
  } else if (!has_child && slot(first) == slot(last)) {
    // One region left (its entries are consecutive, so first and last tell): one entry for the
    // block (the survivor is the only region intersecting it), unless the node is kept.
    if (unlinked.may_keep && keep(node, unlinked)) return entry;
    replacement = slot(first);
  } else {
    return entry;
  }
  MRC_CHECK(unlinked.count < std::size(unlinked.nodes));
  unlinked.nodes[unlinked.count++] = node;
  return replacement;
}

MRC_TABLE mrc_status_t MRC_SELF::remove(PgtRegion *region) noexcept {
  if (region == nullptr) return MRC_ERR_INVALID;
  // start/end are immutable while the region is in the table.
  const uintptr_t start = region->start;
  const uintptr_t end = region->end;
  // Out of a slot of the kept node used last, which keeps another region (so it stays as it is,
  // kept): no descent, nothing above changes.
  unsigned hinted;
  if (hinted_slot(start, end, hinted)) {
    const NodeRef node{hint_node_, hint_level_};
    if (node.slot(hinted).load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(region)) {
      bool another = false;
      if (node.level == 0) {
        for (unsigned i = 0; i < kLeafFanout; ++i) {
          another = another || (i != hinted && node.slot(i).load(std::memory_order_relaxed) != 0);
        }
      } else {
        const InnerNode *inner = node.inner();
        for (unsigned w = 0; w < std::size(inner->occupied); ++w) {
          const uint64_t mine = w == hinted / 64 ? uint64_t{1} << (hinted % 64) : 0;
          another = another || (inner->occupied[w] & ~mine) != 0;
        }
      }
      if (another) {
        set_slot(node, hinted, reinterpret_cast<uintptr_t>(region), 0);
        size_.store(size_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
        return changed(MRC_OK);
      }
    }
  }
  // One descent along start, as lookup() takes, remembering the way: it finds the region if it is
  // there, and the deepest slot whose block holds all of it (`split`). Below that slot
  // remove_from() does the work; above it only a node that collapses changes its parent.
  Step path[kLevels + 1];
  unsigned depth = 0, split = 0;
  path[0] = {NodeRef{0, kLevels}, 0, root_.load(std::memory_order_relaxed)};
  while (is_node(path[depth].entry)) {
    uintptr_t base;
    const NodeRef node = place(path[depth].entry, path[depth].owner.slot_level(), start, base);
    const unsigned shift = node.shift();
    const uintptr_t index = (start - base) >> shift;
    if (start < base || index >= node.fanout()) return MRC_ERR_NOT_FOUND;
    if (split == depth && (end - 1 - base) >> shift == index) ++split;
    MRC_DASSERT(depth < kLevels);
    path[++depth] = {node, static_cast<unsigned>(index),
                     node.slot(index).load(std::memory_order_relaxed)};
  }
  if (path[depth].entry != reinterpret_cast<uintptr_t>(region)) return MRC_ERR_NOT_FOUND;
  const unsigned deepest = depth;

  Unlinked unlinked;
  unlinked.may_keep = true;
  unwind(path, split,
         remove_from(path[split].entry, path[split].owner.slot_level(), region, unlinked),
         unlinked);
  finish_unlinked(unlinked);
  size_.store(size_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  // A removal only thins level-1 nodes out; flat nodes may have to go back to a tree. A flat node
  // never collapses, so one on the descent's path still sits in the slot above it.
  if (kFlats && flats_ != 0) {
    unsigned at = 1;
    while (at <= deepest && !path[at].owner.flat) ++at;
    if (at <= deepest && start >= path[at].owner.base() && end <= path[at].owner.end()) {
      const NodeRef flat = path[at].owner;
      const uintptr_t base = flat.base();
      const auto first = static_cast<unsigned>((start - base) >> slot_shift(1));
      const auto last = static_cast<unsigned>((end - 1 - base) >> slot_shift(1));
      update_leafy(flat, first);
      if (last != first) update_leafy(flat, last);
      if (flat.flat_node()->leafy_count < kFlatUntil) {
        unflatten({path[at - 1].owner, path[at - 1].index, path[at - 1].owner.slot_level(), 0},
                  flat);
      }
    } else {
      refresh_flat(start);
      refresh_flat(end - 1);
    }
  }
  // Last: the table is whole again, and the displaced node is looked for afresh.
  if (unlinked.evict_ptr != 0) {
    settle_node(unlinked.evict_ptr, unlinked.evict_base, unlinked.evict_level);
  }
  return changed(MRC_OK);
}

// The slot path[depth] now holds `updated`: stores it, and every replacement of a node above that
// collapses in turn, bottom-up as a recursion would (a replacement is complete before its parent
// points to it).
MRC_TABLE void MRC_SELF::unwind(const Step *path, unsigned depth, uintptr_t updated,
                                Unlinked &unlinked) noexcept {
  uintptr_t entry = path[depth].entry;
  while (updated != entry) {
    const Step &step = path[depth];
    if (step.owner.ptr == 0) {
      set_root(updated);
      return;
    }
    set_slot(step.owner, step.index, entry, updated);
    entry = path[--depth].entry;
    updated = collapse(step.owner, path[depth].owner.slot_level(), entry, unlinked);
  }
}

// Retires the nodes a change unlinked, once every replacement has been stored.
MRC_TABLE void MRC_SELF::finish_unlinked(Unlinked &unlinked) noexcept {
  size_t bytes = 0;
  for (unsigned i = 0; i < unlinked.count; ++i) {
    bytes += node_bytes(unlinked.nodes[i]);
    if (kept_count_ != 0) forget(unlinked.nodes[i].ptr);
    retire(unlinked.nodes[i]);
  }
  nodes_.store(nodes_.load(std::memory_order_relaxed) - unlinked.count, std::memory_order_relaxed);
  bytes_.store(bytes_.load(std::memory_order_relaxed) - bytes, std::memory_order_relaxed);
}

// ---- kept nodes (hysteresis) --------------------------------------------------------------------

MRC_TABLE void MRC_SELF::refilter() noexcept {
  kept_filter_ = 0;
  for (const uintptr_t kept : kept_) {
    if (kept != 0) kept_filter_ |= kept_bit(kept);
  }
}

MRC_TABLE bool MRC_SELF::is_kept(uintptr_t node) const noexcept {
  if ((kept_filter_ & kept_bit(node)) == 0) return false;
  for (const uintptr_t kept : kept_) {
    if (kept == node) return true;
  }
  return false;
}

MRC_TABLE void MRC_SELF::forget(uintptr_t node) noexcept {
  if (node == hint_node_) hint_node_ = 0;
  if ((kept_filter_ & kept_bit(node)) == 0) return;
  for (uintptr_t &kept : kept_) {
    if (kept == node) {
      kept = 0;
      --kept_count_;
      refilter();
      return;
    }
  }
}

// Whether node, left with one region by a removal, stays (see the shape notes in pgtable.h). Only
// the first such node of a removal is asked. When keeping it displaces the oldest kept node, that
// node is recorded in unlinked, to be settled once the removal is done (the removal's path must not
// change under it).
MRC_TABLE bool MRC_SELF::keep(NodeRef node, Unlinked &unlinked) noexcept {
  unlinked.may_keep = false;
  if (kept_count_ != 0 && is_kept(node.ptr)) {
    set_hint(node);
    return true;
  }
  unsigned at = kept_next_;
  if (kept_count_ < kKeptNodes) {
    while (kept_[at] != 0) at = (at + 1) % kKeptNodes;
  } else {
    if (keep_credit_ != 0) {
      --keep_credit_;
    } else if (++unkept_removals_ == kAgeRemovals) {
      unkept_removals_ = 0;
    } else {
      return false;
    }
    const uintptr_t header = header_of(kept_[at]);  // linked still: forgotten when unlinked
    unlinked.evict_ptr = kept_[at];
    unlinked.evict_base = header & ~kLevelMask;
    unlinked.evict_level = level_in(header);
    --kept_count_;
  }
  kept_[at] = node.ptr;
  ++kept_count_;
  kept_next_ = (at + 1) % kKeptNodes;
  if (unlinked.evict_ptr != 0) refilter();  // the displaced node's bit goes
  kept_filter_ |= kept_bit(node.ptr);
  set_hint(node);  // after the displaced node's header was read: it may have been the hint
  return true;
}

MRC_TABLE void MRC_SELF::set_hint(NodeRef node) noexcept {
  MRC_DASSERT(!node.flat);
  hint_node_ = node.ptr;
  hint_base_ = node.base();
  hint_level_ = node.level;
}

// Whether [start, end) lies inside one slot of the hinted kept node, and which.
MRC_TABLE inline bool MRC_SELF::hinted_slot(uintptr_t start, uintptr_t end,
                                            unsigned &index) const noexcept {
  if (hint_node_ == 0 || start < hint_base_) return false;
  const unsigned shift = slot_shift(hint_level_);
  const uintptr_t slot = (start - hint_base_) >> shift;
  if (slot >= fanout(hint_level_) || (end - 1 - hint_base_) >> shift != slot) return false;
  index = static_cast<unsigned>(slot);
  return true;
}

// Collapses the node at ptr if it still sits where it sat (its block starting at base, at level)
// and a removal would collapse it now, with whatever collapses above it in turn.
MRC_TABLE void MRC_SELF::settle_node(uintptr_t ptr, uintptr_t base, unsigned level) noexcept {
  Step path[kLevels + 1];
  unsigned depth = 0;
  path[0] = {NodeRef{0, kLevels}, 0, root_.load(std::memory_order_relaxed)};
  for (;;) {
    const uintptr_t entry = path[depth].entry;
    if (!is_node(entry) || is_flat(entry)) return;  // a flat node holds no nodes
    uintptr_t node_base;
    const NodeRef node = place(entry, path[depth].owner.slot_level(), base, node_base);
    if (node.ptr == ptr) {
      if (node.level != level || node_base != base) return;
      Unlinked unlinked;  // may_keep is false: nothing is kept on the way up either
      unwind(path, depth, collapse(node, path[depth].owner.slot_level(), entry, unlinked),
             unlinked);
      finish_unlinked(unlinked);
      return;
    }
    if (node.level <= level || base < node_base || base >= node.end()) return;
    const uintptr_t index = (base - node_base) >> node.shift();
    MRC_DASSERT(depth < kLevels);
    path[++depth] = {node, static_cast<unsigned>(index),
                     node.slot(index).load(std::memory_order_relaxed)};
  }
}

MRC_TABLE void MRC_SELF::settle() noexcept {
  for (uintptr_t &kept : kept_) {
    const uintptr_t node = kept;  // settling one may unlink (and forget) a later one
    if (node == 0) continue;
    const uintptr_t header = header_of(node);
    kept = 0;
    --kept_count_;
    if (node == hint_node_) hint_node_ = 0;
    refilter();
    settle_node(node, header & ~kLevelMask, level_in(header));
  }
  changed(MRC_OK);
}

// ---- flat nodes ---------------------------------------------------------------------------------

// Whether the tree would hold a leaf for group g of a flat node: two regions or more in its slots
// (a region's entries are consecutive, so two different non-empty entries tell).
MRC_TABLE bool MRC_SELF::group_is_leafy(NodeRef flat, unsigned group) noexcept {
  uintptr_t seen = 0;
  for (unsigned i = group * kLeafFanout; i < (group + 1) * kLeafFanout; ++i) {
    const uintptr_t entry = flat.slot(i).load(std::memory_order_relaxed);
    if (entry == 0) continue;
    if (seen != 0 && entry != seen) return true;
    seen = entry;
  }
  return false;
}

MRC_TABLE void MRC_SELF::update_leafy(NodeRef flat, unsigned group) noexcept {
  FlatNode *node = flat.flat_node();
  const uint64_t bit = uint64_t{1} << (group % 64);
  const bool was = (node->leafy[group / 64] & bit) != 0;
  const bool is = group_is_leafy(flat, group);
  if (was == is) return;
  node->leafy[group / 64] ^= bit;
  node->leafy_count = is ? node->leafy_count + 1 : node->leafy_count - 1;
}

// After a change whose end lies at address: the level-1 node or flat node holding address (if any)
// becomes flat or goes back to a tree when it crossed its threshold. Allocation failures leave the
// table as it is (both forms are valid).
MRC_TABLE void MRC_SELF::refresh_flat(uintptr_t address) noexcept {
  SlotRef holder{NodeRef{0, kLevels}, 0, kLevels, 0};
  uintptr_t entry = root_.load(std::memory_order_relaxed);
  while (is_node(entry)) {
    uintptr_t base;
    const NodeRef node = place(entry, holder.level, address, base);
    if (address < base || address >= node.end()) return;
    if (node.flat) {
      update_leafy(node, static_cast<unsigned>((address - base) >> slot_shift(1)));
      if (node.flat_node()->leafy_count < kFlatUntil) unflatten(holder, node);
      return;
    }
    if (node.level == kFlatLevel) {
      if (node.inner()->children >= kFlatFrom) flatten(holder, node);
      return;
    }
    if (node.level < kFlatLevel) return;
    const uintptr_t index = (address - base) >> node.shift();
    holder = {node, static_cast<unsigned>(index), node.level, base + (index << node.shift())};
    entry = node.slot(index).load(std::memory_order_relaxed);
  }
}

// Replaces the level-1 node held by holder with a flat node: built while private, published by one
// store, the node and its leaves retired after.
MRC_TABLE void MRC_SELF::flatten(const SlotRef &holder, NodeRef node) noexcept {
  // A flat node marks a group for each leaf, which must hold two regions: kept leaves collapse
  // first (the node, with many children still, does not; holder stays valid), and the node may
  // then be too sparse to be flat.
  if (kept_count_ != 0) {
    for (unsigned g = 0; g < kInnerFanout; ++g) {
      const uintptr_t entry = node.inner()->slots[g].load(std::memory_order_relaxed);
      if (!is_node(entry) || !is_kept(pointer_of(entry))) continue;
      forget(pointer_of(entry));
      settle_node(pointer_of(entry), node.base() + (uintptr_t{g} << slot_shift(1)), 0);
    }
    if (node.inner()->children < kFlatFrom) return;
  }
  void *memory = pool_.allocate(kFlatClass);
  if (memory == nullptr) return;
  FlatNode *flat = new (memory) FlatNode();
  const uintptr_t base = node.base();
  flat->header = base | kFlatLevel;
  const InnerNode *inner = node.inner();
  size_t leaves = 0;
  for (unsigned g = 0; g < kInnerFanout; ++g) {
    const uintptr_t entry = inner->slots[g].load(std::memory_order_relaxed);
    std::atomic<uintptr_t> *group = flat->slots + g * kLeafFanout;
    if (is_node(entry)) {
      const NodeRef leaf = node_of(entry);
      MRC_DASSERT(leaf.level == 0);
      for (unsigned i = 0; i < kLeafFanout; ++i) {
        group[i].store(leaf.slot(i).load(std::memory_order_relaxed), std::memory_order_relaxed);
      }
      flat->leafy[g / 64] |= uint64_t{1} << (g % 64);
      ++leaves;
    } else if (entry != 0) {
      const PgtRegion *region = region_of(entry);
      const uintptr_t block = base + (uintptr_t{g} << slot_shift(1));
      for (unsigned i = 0; i < kLeafFanout; ++i) {
        group[i].store(entry_for(region, block + (uintptr_t{i} << kPageShift), 0),
                       std::memory_order_relaxed);
      }
    }
  }
  flat->leafy_count = static_cast<uint32_t>(leaves);
  const NodeRef flat_ref{reinterpret_cast<uintptr_t>(flat), kFlatLevel, true};
  store(holder, node_entry(node, holder.level), node_entry(flat_ref, holder.level));
  // Unlinked now: the node and its leaves wait out the readers in the pool.
  for (unsigned g = 0; g < kInnerFanout; ++g) {
    const uintptr_t entry = inner->slots[g].load(std::memory_order_relaxed);
    if (!is_node(entry)) continue;
    if (kept_count_ != 0) forget(pointer_of(entry));
    retire(node_of(entry));
  }
  if (kept_count_ != 0) forget(node.ptr);
  retire(node);
  ++flats_;
  nodes_.store(nodes_.load(std::memory_order_relaxed) - leaves, std::memory_order_relaxed);
  bytes_.store(bytes_.load(std::memory_order_relaxed) + sizeof(FlatNode) - sizeof(InnerNode) -
                   leaves * sizeof(LeafNode),
               std::memory_order_relaxed);
}

// The reverse: a level-1 node with a leaf for each group that holds two regions or more. The
// groups are looked at afresh: the marks of a change's other end may not be updated yet.
MRC_TABLE void MRC_SELF::unflatten(const SlotRef &holder, NodeRef flat) noexcept {
  const FlatNode *node = flat.flat_node();
  bool leafy[kInnerFanout];
  size_t leaves = 0;
  for (unsigned g = 0; g < kInnerFanout; ++g) {
    leafy[g] = group_is_leafy(flat, g);
    leaves += leafy[g];
  }
  InnerNode *inner = new_inner();
  if (inner == nullptr) return;
  LeafNode *made[kInnerFanout];
  for (size_t i = 0; i < leaves; ++i) {
    made[i] = new_leaf();
    if (made[i] == nullptr) {
      while (i-- > 0) pool_.release_unpublished(made[i], kLeafClass);
      pool_.release_unpublished(inner, kInnerClass);
      return;
    }
  }
  const uintptr_t base = flat.base();
  inner->header = base | kFlatLevel;
  const NodeRef inner_ref{reinterpret_cast<uintptr_t>(inner), kFlatLevel};
  size_t used = 0;
  for (unsigned g = 0; g < kInnerFanout; ++g) {
    const std::atomic<uintptr_t> *group = node->slots + g * kLeafFanout;
    if (leafy[g]) {
      LeafNode *leaf = made[used++];
      leaf->header = (base + (uintptr_t{g} << slot_shift(1))) | 0;
      for (unsigned i = 0; i < kLeafFanout; ++i) {
        leaf->slots[i].store(group[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
      }
      set_slot(inner_ref, g, 0, node_entry(NodeRef{reinterpret_cast<uintptr_t>(leaf), 0}, 1));
      continue;
    }
    for (unsigned i = 0; i < kLeafFanout; ++i) {
      const uintptr_t entry = group[i].load(std::memory_order_relaxed);
      if (entry != 0) {  // the group's only region
        set_slot(inner_ref, g, 0, entry);
        break;
      }
    }
  }
  MRC_DASSERT(used == leaves);
  store(holder, node_entry(flat, holder.level), node_entry(inner_ref, holder.level));
  retire(flat);
  --flats_;
  nodes_.store(nodes_.load(std::memory_order_relaxed) + leaves, std::memory_order_relaxed);
  bytes_.store(bytes_.load(std::memory_order_relaxed) + sizeof(InnerNode) +
                   leaves * sizeof(LeafNode) - sizeof(FlatNode),
               std::memory_order_relaxed);
}

// ---- the windows --------------------------------------------------------------------------------

// Calls fn(i, entry) for each level-1 slot i of the block a root slot covers, with what that slot
// would hold were the root slot's entry a level-1 node: the entry's slots, the slots a region
// intersects, a leaf below skipped levels in its block's slot, or the groups of a flat node's page
// slots, each read as a leaf's slots (the group's address less the header, tagged as a node).
MRC_TABLE template <class Fn>
void MRC_SELF::spell_out(uintptr_t entry, uintptr_t block, Fn &&fn) {
  if (!is_node(entry)) {
    for (unsigned i = 0; i < kInnerFanout; ++i) {
      fn(i,
         entry == 0 ? 0 : entry_for(region_of(entry), block + (uintptr_t{i} << slot_shift(1)), 1));
    }
    return;
  }
  const NodeRef node = node_of(entry);
  if (node.flat) {
    for (unsigned i = 0; i < kInnerFanout; ++i) {
      fn(i, node.ptr + uintptr_t{i} * kLeafFanout * sizeof(uintptr_t) + kNodeTag);
    }
    return;
  }
  if (node.level == 1) {
    for (unsigned i = 0; i < kInnerFanout; ++i) fn(i, node.slot(i).load(std::memory_order_relaxed));
    return;
  }
  MRC_DASSERT(node.level == 0);
  const uintptr_t at = (node.base() - block) >> slot_shift(1);
  for (unsigned i = 0; i < kInnerFanout; ++i) fn(i, i == at ? node_entry(node, 1) : 0);
}

// The level-2 nodes that may have a window: the root, when it is one (its window then holds every
// region), else the level-2 nodes right below the root when the root holds nothing else and at
// most kWindows of them (clusters far apart). Windows for only some of a root's children would
// make every other lookup check them in vain.
MRC_TABLE unsigned MRC_SELF::window_candidates(NodeRef (&candidates)[kWindows],
                                               bool &whole) const noexcept {
  whole = false;
  const uintptr_t root = root_.load(std::memory_order_relaxed);
  if (!is_node(root) || is_flat(root)) return 0;
  const NodeRef node = node_of(root);
  if (node.level == kWindowLevel) {
    candidates[0] = node;
    whole = true;
    return 1;
  }
  if (node.level < kWindowLevel) return 0;
  unsigned count = 0;
  const InnerNode *inner = node.inner();
  for (unsigned w = 0; w < std::size(inner->occupied); ++w) {
    for (uint64_t bits = inner->occupied[w]; bits != 0; bits &= bits - 1) {
      const uintptr_t entry = node.slot(64 * w + static_cast<unsigned>(std::countr_zero(bits)))
                                  .load(std::memory_order_relaxed);
      if (count == kWindows || !is_node(entry) || is_flat(entry)) return 0;
      const NodeRef child = node_of(entry);
      if (child.level != kWindowLevel) return 0;
      candidates[count++] = child;
    }
  }
  return count;
}

// Fits the windows to the tree after a change of the root or of a candidate's slots (see
// window_candidates()).
MRC_TABLE void MRC_SELF::refresh_window() noexcept {
  window_check_ = false;
  NodeRef candidates[kWindows];
  bool whole;
  const unsigned count = window_candidates(candidates, whole);
  for (unsigned k = 0; k < kWindows; ++k) {
    window_nodes_[k] = k < count ? candidates[k].ptr : 0;
    fit_window(k, k < count ? &candidates[k] : nullptr, whole);
  }
}

// Window k for node (none for nullptr): kept while it covers the node's occupied slots and at
// least a quarter of those it covers hold a node (a level-1 node, a flat node or a leaf), else
// rebuilt if at least half of the occupied span holds one, else dropped.
MRC_TABLE void MRC_SELF::fit_window(unsigned k, const NodeRef *node, bool whole) noexcept {
  if (node == nullptr) {
    replace_window(k, nullptr);
    return;
  }
  const InnerNode *inner = node->inner();
  unsigned lo = kInnerFanout, hi = 0;
  for (unsigned w = 0; w < std::size(inner->occupied); ++w) {
    const uint64_t word = inner->occupied[w];
    if (word == 0) continue;
    lo = std::min(lo, 64 * w + static_cast<unsigned>(std::countr_zero(word)));
    hi = 64 * w + 64 - static_cast<unsigned>(std::countl_zero(word));
  }
  const unsigned children = inner->children;
  const WindowFit &fit = fit_[k];
  const Window *window = windows_[k].load(std::memory_order_relaxed);
  if (fit.node == node->ptr && lo >= fit.lo && hi <= fit.hi && fit.hi - fit.lo <= 4 * children &&
      window->whole == uintptr_t{whole}) {
    return;
  }
  if (children == 0 || hi - lo > 2 * children) {
    replace_window(k, nullptr);
    return;
  }
  build_window(k, *node, lo, hi, whole);
}

// Window k for node's slots [lo, hi), filled from the tree while private, then published.
MRC_TABLE void MRC_SELF::build_window(unsigned k, NodeRef node, unsigned lo, unsigned hi,
                                      bool whole) noexcept {
  const size_t count = size_t{hi - lo} * kInnerFanout;
  const size_t bytes = (sizeof(Window) + count * sizeof(uintptr_t) + 63) & ~size_t{63};
  void *memory = std::aligned_alloc(alignof(Window), bytes);
  if (memory == nullptr) {  // lookups go through the tree instead
    replace_window(k, nullptr);
    return;
  }
  Window *window = new (memory) Window{};
  window->first = (node.base() >> slot_shift(1)) + uintptr_t{lo} * kInnerFanout;
  window->count = count;
  window->bytes = bytes;
  window->whole = whole ? 1 : 0;
  window->bias = reinterpret_cast<uintptr_t>(window->slots()) - window->first * sizeof(uintptr_t);
  for (unsigned b = lo; b < hi; ++b) {
    std::atomic<uintptr_t> *slots = window->slots() + size_t{b - lo} * kInnerFanout;
    spell_out(
        node.slot(b).load(std::memory_order_relaxed),
        node.base() + (uintptr_t{b} << slot_shift(kWindowLevel)),
        [slots](unsigned i, uintptr_t entry) { new (&slots[i]) std::atomic<uintptr_t>(entry); });
  }
  replace_window(k, window);
  fit_[k] = {node.ptr, lo, hi, window->first, window->count, window->bias};
  windows_on_ = true;
}

// Publishes window k (or none) in place of the current one, which readers may still hold: retired.
MRC_TABLE void MRC_SELF::replace_window(unsigned k, Window *window) noexcept {
  Window *old = windows_[k].load(std::memory_order_relaxed);
  fit_[k] = {};
  windows_on_ = std::any_of(std::begin(fit_), std::end(fit_),
                            [](const WindowFit &fit) { return fit.node != 0; });
  if (old == nullptr && window == nullptr) return;
  windows_[k].store(window, std::memory_order_release);
  size_t bytes = bytes_.load(std::memory_order_relaxed);
  if (window != nullptr) bytes += window->bytes;
  if (old != nullptr) {
    bytes -= old->bytes;
    domain_.retire(old, [](void *object) { std::free(object); });
  }
  bytes_.store(bytes, std::memory_order_relaxed);
}

// ---- invariants (tests) -------------------------------------------------------------------------

MRC_TABLE bool MRC_SELF::check_entry(uintptr_t entry, unsigned level, uintptr_t block,
                                     Census &census) const noexcept {
  if (entry == 0) return true;
  if (!is_node(entry)) {
    if ((entry & kTagMask) != 0) return false;
    const PgtRegion *region = region_of(entry);
    if (entry_for(region, block, level) != entry) return false;  // disjoint
    const uintptr_t block_end = block + block_size(level);
    census.covered += std::min(region->end, block_end) - std::max(region->start, block);
    if (region != census.last) {
      // Entries of one region are consecutive; regions come in address order, disjoint.
      if (census.last != nullptr && region->start < census.last->end) return false;
      census.last = region;
      ++census.regions;
      census.region_bytes += region->end - region->start;
    }
    return true;
  }
  if (pointer_of(entry) == 0) return false;
  const NodeRef node = node_of(entry);
  // Below the slot, and tagged as skipping levels exactly when it does.
  if (node.level >= level || node_entry(node, level) != entry) return false;
  const uintptr_t base = node.base();
  if ((base & (block_size(node.level + 1) - 1)) != 0) return false;
  if (base < block || node.end() > block + block_size(level)) return false;
  ++census.nodes;
  census.bytes += node_bytes(node);
  const bool kept = is_kept(node.ptr);
  const size_t kept_before = census.kept;
  census.kept += kept;
  unsigned used = 0, children = 0;
  const PgtRegion *only = nullptr;
  bool several = false;
  for (unsigned i = 0; i < node.fanout(); ++i) {
    const uintptr_t e = node.slot(i).load(std::memory_order_relaxed);
    if (e == 0) continue;
    ++used;
    if (is_node(e)) {
      ++children;
      several = true;
    } else {
      if (only != nullptr && region_of(e) != only) several = true;
      only = region_of(e);
    }
    if (!check_entry(e, node.slot_level(), base + (uintptr_t{i} << node.shift()), census)) {
      return false;
    }
  }
  if (node.flat) {
    // The groups' marks are right, and there are enough of them (else it would be a tree).
    const FlatNode *flat = node.flat_node();
    unsigned marked = 0;
    for (unsigned g = 0; g < kInnerFanout; ++g) {
      const bool bit = ((flat->leafy[g / 64] >> (g % 64)) & 1) != 0;
      if (bit != group_is_leafy(node, g)) return false;
      marked += bit;
    }
    if (marked != flat->leafy_count || marked < kFlatUntil) return false;
  }
  if (node.is_inner()) {
    const InnerNode *inner = node.inner();
    unsigned marked = 0;
    for (unsigned i = 0; i < node.fanout(); ++i) {
      const bool bit = ((inner->occupied[i / 64] >> (i % 64)) & 1) != 0;
      if (bit != (node.slot(i).load(std::memory_order_relaxed) != 0)) return false;
      marked += bit;
    }
    if (marked != used || children != inner->children) return false;
    if (kFlats && node.level == kFlatLevel && children >= kFlatFrom) return false;  // flat by now
  }
  // Canonical: a node separates at least two regions; a kept node holds one at least, and a node
  // above a kept node may see one region only.
  const bool holds_up_kept = children != 0 && census.kept > kept_before + kept;
  return (used >= 2 && several) || (kept && used >= 1) || holds_up_kept;
}

MRC_TABLE bool MRC_SELF::check_invariants() const noexcept {
  Census census;
  if (!check_entry(root_.load(std::memory_order_relaxed), kLevels, 0, census)) return false;
  // Every byte of every region is covered by exactly one entry.
  // Every kept node is in the table (a node is forgotten when unlinked).
  size_t kept = 0;
  for (const uintptr_t node : kept_) kept += node != 0;
  size_t window_bytes = 0;
  for (const std::atomic<Window *> &window : windows_) {
    const Window *w = window.load(std::memory_order_relaxed);
    window_bytes += w == nullptr ? 0 : w->bytes;
  }
  return census.covered == census.region_bytes && census.nodes == node_count() &&
         census.bytes + window_bytes == memory_bytes() && census.regions == size() &&
         kept == kept_count_ && census.kept == kept_count_ && check_window();
}

// A window exists for each candidate for which fit_window() wants one (allocation failures
// aside) and for no other node, covers the candidate's occupied slots, and holds what the tree
// spells out, slot by slot.
MRC_TABLE bool MRC_SELF::check_window() const noexcept {
  NodeRef candidates[kWindows];
  bool whole;
  const unsigned count = window_candidates(candidates, whole);
  for (unsigned k = 0; k < kWindows; ++k) {
    const Window *window = windows_[k].load(std::memory_order_relaxed);
    const WindowFit &fit = fit_[k];
    if ((window == nullptr) != (fit.node == 0)) return false;
    if (window_nodes_[k] != (k < count ? candidates[k].ptr : 0)) return false;
    if (k >= count) {
      if (window != nullptr) return false;
      continue;
    }
    const NodeRef node = candidates[k];
    unsigned lo = kInnerFanout, hi = 0;
    for (unsigned i = 0; i < kInnerFanout; ++i) {
      if (node.slot(i).load(std::memory_order_relaxed) == 0) continue;
      lo = std::min(lo, i);
      hi = i + 1;
    }
    const unsigned children = node.inner()->children;
    if (window == nullptr) {
      if (!(children == 0 || hi - lo > 2 * children)) return false;
      continue;
    }
    if (fit.node != node.ptr || lo < fit.lo || hi > fit.hi || fit.hi - fit.lo > 4 * children ||
        window->whole != uintptr_t{whole}) {
      return false;
    }
    const uintptr_t first = (node.base() >> slot_shift(1)) + uintptr_t{fit.lo} * kInnerFanout;
    if (window->first != first || window->count != size_t{fit.hi - fit.lo} * kInnerFanout ||
        fit.first != first || fit.count != window->count || fit.bias != window->bias ||
        window->bias + first * sizeof(uintptr_t) != reinterpret_cast<uintptr_t>(window->slots())) {
      return false;
    }
    bool same = true;
    for (unsigned b = fit.lo; b < fit.hi; ++b) {
      const std::atomic<uintptr_t> *slots = window->slots() + size_t{b - fit.lo} * kInnerFanout;
      spell_out(node.slot(b).load(std::memory_order_relaxed),
                node.base() + (uintptr_t{b} << slot_shift(kWindowLevel)),
                [&](unsigned i, uintptr_t entry) {
                  same = same && slots[i].load(std::memory_order_relaxed) == entry;
                });
    }
    if (!same) return false;
  }
  return true;
}

#undef MRC_TABLE
#undef MRC_SELF

#define MRC_PGTABLE_INSTANTIATE(inner, leaf) template class RadixPageTable<inner, leaf>;
MRC_PGTABLE_SHAPES(MRC_PGTABLE_INSTANTIATE)
#undef MRC_PGTABLE_INSTANTIATE

}  // namespace mrc::detail
