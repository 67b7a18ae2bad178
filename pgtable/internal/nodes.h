// SPDX-License-Identifier: BSD-3-Clause
// The nodes and slots of RadixPageTable as its writer handles them, what every mechanism uses:
// construction, node allocation and retirement, the stores every change of a slot or of root_ goes
// through, and the arithmetic that places a region or a node in a block. A private part of
// pgtable/definitions.h: not for other layers. SYNCHRONIZATION: see pgtable.h.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <iterator>
#include <new>

#include "base/check.h"
#include "pgtable/pgtable.h"

namespace mrc::detail {

// Internal linkage, as when this lived in one .cc: the compiler then inlines each use (the
// writer's recursions call it for every node they pass).
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

// Shorthands for the out-of-class definitions in the internal/*.h parts; definitions.h undefines
// them after the last part.
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

}  // namespace mrc::detail
