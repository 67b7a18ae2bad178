// SPDX-License-Identifier: BSD-3-Clause
// RadixPageTable::remove(): one descent along the region's start, then the nodes left with a
// single region or child collapse bottom-up (unless kept: kept_nodes.h), and the unlinked
// nodes are retired. A private part of pgtable/definitions.h: not for other layers.
// SYNCHRONIZATION: see pgtable.h.
#pragma once

#include <bit>
#include <iterator>

#include "pgtable/internal/nodes.h"

namespace mrc::detail {

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

}  // namespace mrc::detail
