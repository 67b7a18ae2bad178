// SPDX-License-Identifier: BSD-3-Clause
// RadixPageTable's flat nodes (see kFlats in pgtable.h): a level-1 node and its leaves as one
// array of page slots; when a level-1 node becomes flat and when it goes back to a tree. A private
// part of pgtable/definitions.h: not for other layers. SYNCHRONIZATION: see pgtable.h.
#pragma once

#include <new>

#include "pgtable/internal/nodes.h"

namespace mrc::detail {

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

}  // namespace mrc::detail
