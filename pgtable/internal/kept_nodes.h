// SPDX-License-Identifier: BSD-3-Clause
// RadixPageTable's kept nodes (the hysteresis of the shape notes in pgtable.h): which nodes a
// removal leaves in place with a single region, the hint to the one used last, their eviction,
// and settle(). A private part of pgtable/definitions.h: not for other layers. SYNCHRONIZATION: see
// pgtable.h.
#pragma once

#include "pgtable/internal/nodes.h"

namespace mrc::detail {

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

}  // namespace mrc::detail
