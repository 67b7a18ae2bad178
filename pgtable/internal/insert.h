// SPDX-License-Identifier: BSD-3-Clause
// RadixPageTable::insert(): the descent to the slot where the region stops fitting in one slot,
// the usual cases (an empty slot, a slot holding one region) without the general recursion, and
// the general case, whose new nodes are counted and allocated before the table changes. A private
// part of pgtable/definitions.h: not for other layers. SYNCHRONIZATION: see pgtable.h.
#pragma once

#include <algorithm>
#include <iterator>

#include "pgtable/internal/nodes.h"

namespace mrc::detail {

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

}  // namespace mrc::detail
