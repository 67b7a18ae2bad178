// SPDX-License-Identifier: BSD-3-Clause
// RadixPageTable's windows (see the shape notes in pgtable.h): the level-1 slots below a level-2
// node laid out as one array, which nodes get one, how each change of the tree is mirrored in
// them, and their building, replacement and retirement. A private part of pgtable/definitions.h:
// not for other layers. SYNCHRONIZATION: see pgtable.h.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <iterator>
#include <new>

#include "pgtable/internal/nodes.h"

namespace mrc::detail {

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

}  // namespace mrc::detail
