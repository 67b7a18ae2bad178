// SPDX-License-Identifier: BSD-3-Clause
// RadixPageTable::check_invariants(), for tests: the canonical form, the headers, the counters,
// the kept nodes and the windows, checked against the tree. A private part of
// pgtable/definitions.h: not for other layers. Writer only.
#pragma once

#include <algorithm>

#include "pgtable/internal/nodes.h"

namespace mrc::detail {

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

}  // namespace mrc::detail
