// The radix page table's writer side; the shape and the contract are in pgtable.h.
#include "pgtable/pgtable.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <new>

#include "pgtable/check.h"

namespace mrc::detail {
namespace {

// Calls fn(index, block_start) for every slot of a node (base, slots of 2^shift bytes, fanout
// slots) whose block intersects region, in address order.
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

template <unsigned kBitsPerLevel>
RadixPageTable<kBitsPerLevel>::~RadixPageTable() {
  free_subtree(root_.load(std::memory_order_relaxed));
}

template <unsigned kBitsPerLevel>
void RadixPageTable<kBitsPerLevel>::free_subtree(uintptr_t entry) noexcept {
  if (!is_node(entry)) return;
  Node *node = node_of(entry);
  for (auto &slot : node->slots) free_subtree(slot.load(std::memory_order_relaxed));
  delete node;
}

template <unsigned kBitsPerLevel>
void RadixPageTable<kBitsPerLevel>::free_node(void *node) noexcept {
  delete static_cast<Node *>(node);
}

// The entry a slot at `level` covering `block` holds for region when region is the only one
// there: 0 (disjoint), the region (covers the block) or the region tagged partial.
template <unsigned kBitsPerLevel>
uintptr_t RadixPageTable<kBitsPerLevel>::entry_for(const PgtRegion *region, uintptr_t block,
                                                   unsigned level) {
  const uintptr_t end = block + block_size(level);
  if (region->end <= block || region->start >= end) return 0;
  uintptr_t entry = reinterpret_cast<uintptr_t>(region);
  if (region->start > block || region->end < end) entry |= kPartialTag;
  return entry;
}

// The level of the lowest node whose aligned block holds both lo and hi - 1 (which lie in
// different pages).
template <unsigned kBitsPerLevel>
unsigned RadixPageTable<kBitsPerLevel>::level_for(uintptr_t lo, uintptr_t hi) {
  const unsigned top_bit = static_cast<unsigned>(std::bit_width(lo ^ (hi - 1))) - 1;
  MRC_DASSERT(top_bit >= kPageShift && top_bit < 64);
  return (top_bit - kPageShift) / kBitsPerLevel;
}

// ---- insert ----------------------------------------------------------------------------------

template <unsigned kBitsPerLevel>
bool RadixPageTable<kBitsPerLevel>::overlaps_any(uintptr_t from, uintptr_t to) const noexcept {
  bool found = false;
  for_each_overlapping(from, to, [&found](PgtRegion *) {
    found = true;
    return false;
  });
  return found;
}

// Dry run of insert_into(): how many nodes inserting region below this entry will create.
template <unsigned kBitsPerLevel>
size_t RadixPageTable<kBitsPerLevel>::count_new_nodes(uintptr_t entry, unsigned level,
                                                      uintptr_t block,
                                                      const PgtRegion *region) const noexcept {
  const uintptr_t block_end = block + block_size(level);
  const uintptr_t lo = std::max(region->start, block);
  const uintptr_t hi = std::min(region->end, block_end);
  if ((lo == block && hi == block_end) || entry == 0) return 0;
  size_t count = 1;
  if (!is_node(entry)) {
    const PgtRegion *other = region_of(entry);
    const uintptr_t other_lo = std::max(other->start, block);
    const uintptr_t other_hi = std::min(other->end, block_end);
    const unsigned node_level = level_for(std::min(lo, other_lo), std::max(hi, other_hi));
    const uintptr_t base = std::min(lo, other_lo) & ~(block_size(node_level + 1) - 1);
    for_each_slot_of(base, slot_shift(node_level), kFanout, region, [&](unsigned, uintptr_t sub) {
      count += count_new_nodes(entry_for(other, sub, node_level), node_level, sub, region);
    });
    return count;
  }
  const Node *node = node_of(entry);
  const unsigned node_level = level_of(entry);
  const uintptr_t base = node->base;
  const uintptr_t end = base + block_size(node_level + 1);
  if (lo >= base && hi <= end) {
    count = 0;
    for_each_slot_of(base, slot_shift(node_level), kFanout, region, [&](unsigned i, uintptr_t sub) {
      count +=
          count_new_nodes(node->slots[i].load(std::memory_order_relaxed), node_level, sub, region);
    });
    return count;
  }
  const unsigned parent_level = level_for(std::min(lo, base), std::max(hi, end));
  const uintptr_t parent_base = std::min(lo, base) & ~(block_size(parent_level + 1) - 1);
  const uintptr_t node_index = (base >> slot_shift(parent_level)) & kIndexMask;
  for_each_slot_of(
      parent_base, slot_shift(parent_level), kFanout, region, [&](unsigned i, uintptr_t sub) {
        count += count_new_nodes(i == node_index ? entry : 0, parent_level, sub, region);
      });
  return count;
}

// Returns what the slot at `level` covering `block` must hold once region is inserted. A live
// node is updated in place (each slot store publishes a finished value); a new node is filled
// while private and published by the caller's store.
template <unsigned kBitsPerLevel>
uintptr_t RadixPageTable<kBitsPerLevel>::insert_into(uintptr_t entry, unsigned level,
                                                     uintptr_t block, PgtRegion *region,
                                                     NodeReserve &reserve) noexcept {
  const uintptr_t block_end = block + block_size(level);
  const uintptr_t lo = std::max(region->start, block);
  const uintptr_t hi = std::min(region->end, block_end);
  if (lo == block && hi == block_end) {
    MRC_DASSERT(entry == 0);  // overlaps were rejected
    return reinterpret_cast<uintptr_t>(region);
  }
  if (entry == 0) return reinterpret_cast<uintptr_t>(region) | kPartialTag;

  auto take = [&reserve](uintptr_t base) {
    MRC_CHECK(reserve.count > 0);  // count_new_nodes() and insert_into() disagree
    Node *node = reserve.nodes[--reserve.count];
    node->base = base;
    return node;
  };

  if (!is_node(entry)) {
    // The slot's only region meets a second one: a node at the level where they part.
    const PgtRegion *other = region_of(entry);
    MRC_DASSERT((entry & kPartialTag) != 0);
    const uintptr_t other_lo = std::max(other->start, block);
    const uintptr_t other_hi = std::min(other->end, block_end);
    const unsigned node_level = level_for(std::min(lo, other_lo), std::max(hi, other_hi));
    MRC_DASSERT(node_level < level);
    Node *node = take(std::min(lo, other_lo) & ~(block_size(node_level + 1) - 1));
    for (unsigned i = 0; i < kFanout; ++i) {
      const uintptr_t sub = node->base + (uintptr_t{i} << slot_shift(node_level));
      node->slots[i].store(entry_for(other, sub, node_level), std::memory_order_relaxed);
    }
    insert_into_node(node, node_level, region, reserve);
    return node_entry(node, node_level);
  }

  Node *node = node_of(entry);
  const unsigned node_level = level_of(entry);
  const uintptr_t base = node->base;
  const uintptr_t end = base + block_size(node_level + 1);
  if (lo >= base && hi <= end) {
    insert_into_node(node, node_level, region, reserve);
    return entry;
  }
  // The region falls outside a path-compressed node: a new node above both.
  const unsigned parent_level = level_for(std::min(lo, base), std::max(hi, end));
  MRC_DASSERT(parent_level > node_level && parent_level < level);
  Node *parent = take(std::min(lo, base) & ~(block_size(parent_level + 1) - 1));
  parent->slots[(base >> slot_shift(parent_level)) & kIndexMask].store(entry,
                                                                       std::memory_order_relaxed);
  insert_into_node(parent, parent_level, region, reserve);
  return node_entry(parent, parent_level);
}

template <unsigned kBitsPerLevel>
void RadixPageTable<kBitsPerLevel>::insert_into_node(Node *node, unsigned level, PgtRegion *region,
                                                     NodeReserve &reserve) noexcept {
  for_each_slot_of(node->base, slot_shift(level), kFanout, region, [&](unsigned i, uintptr_t sub) {
    const uintptr_t old = node->slots[i].load(std::memory_order_relaxed);
    const uintptr_t updated = insert_into(old, level, sub, region, reserve);
    // Release: a node created below is complete before readers can reach it.
    if (updated != old) node->slots[i].store(updated, std::memory_order_release);
  });
}

template <unsigned kBitsPerLevel>
mrc_status_t RadixPageTable<kBitsPerLevel>::insert(PgtRegion *region) noexcept {
  if (region == nullptr) return MRC_ERR_INVALID;
  const uintptr_t start = region->start;
  const uintptr_t end = region->end;
  if (((start | end) & (kPageSize - 1)) != 0 || start >= end || end > kAddressLimit) {
    return MRC_ERR_INVALID;
  }
  if ((reinterpret_cast<uintptr_t>(region) & (kNodeTag | kPartialTag)) != 0) return MRC_ERR_INVALID;
  if (overlaps_any(start, end)) return MRC_ERR_EXISTS;

  const uintptr_t root = root_.load(std::memory_order_relaxed);
  NodeReserve reserve;
  const size_t needed = count_new_nodes(root, kLevels, 0, region);
  MRC_CHECK(needed <= std::size(reserve.nodes));
  while (reserve.count < needed) {
    Node *node = new (std::nothrow) Node();
    if (node == nullptr) {
      while (reserve.count > 0) delete reserve.nodes[--reserve.count];
      return MRC_ERR_NO_MEMORY;
    }
    reserve.nodes[reserve.count++] = node;
  }
  const uintptr_t updated = insert_into(root, kLevels, 0, region, reserve);
  MRC_CHECK(reserve.count == 0);
  if (updated != root) root_.store(updated, std::memory_order_release);
  nodes_.store(nodes_.load(std::memory_order_relaxed) + needed, std::memory_order_relaxed);
  size_.store(size_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return MRC_OK;
}

// ---- remove ----------------------------------------------------------------------------------

// Returns what the slot at `level` (whose block intersects region) holds once region is gone.
// Nodes left with a single region or a single child are replaced by it and queued in unlinked,
// to be retired after the caller has stored the replacement.
template <unsigned kBitsPerLevel>
uintptr_t RadixPageTable<kBitsPerLevel>::remove_from(uintptr_t entry, unsigned level,
                                                     const PgtRegion *region,
                                                     Unlinked &unlinked) noexcept {
  (void)level;
  if (!is_node(entry)) {
    MRC_DASSERT(region_of(entry) == region);
    return 0;
  }
  Node *node = node_of(entry);
  const unsigned node_level = level_of(entry);
  for_each_slot_of(node->base, slot_shift(node_level), kFanout, region, [&](unsigned i, uintptr_t) {
    const uintptr_t old = node->slots[i].load(std::memory_order_relaxed);
    const uintptr_t updated = remove_from(old, node_level, region, unlinked);
    if (updated != old) node->slots[i].store(updated, std::memory_order_release);
  });

  unsigned used = 0;
  uintptr_t survivor = 0;
  const PgtRegion *only = nullptr;
  bool several = false;  // two regions, or a node (which sees two)
  for (const auto &slot : node->slots) {
    const uintptr_t e = slot.load(std::memory_order_relaxed);
    if (e == 0) continue;
    ++used;
    survivor = e;
    if (is_node(e)) {
      several = true;
    } else {
      const PgtRegion *r = region_of(e);
      if (only != nullptr && r != only) several = true;
      only = r;
    }
  }
  MRC_DASSERT(used > 0);
  if (used == 1 && is_node(survivor)) {
    MRC_CHECK(unlinked.count < std::size(unlinked.nodes));
    unlinked.nodes[unlinked.count++] = node;
    return survivor;  // path compression: the child takes the node's place
  }
  if (!several) {
    MRC_CHECK(unlinked.count < std::size(unlinked.nodes));
    unlinked.nodes[unlinked.count++] = node;
    // The removed region shared the parent block, so the survivor does not cover it.
    return reinterpret_cast<uintptr_t>(only) | kPartialTag;
  }
  return entry;
}

template <unsigned kBitsPerLevel>
mrc_status_t RadixPageTable<kBitsPerLevel>::remove(PgtRegion *region) noexcept {
  if (region == nullptr) return MRC_ERR_INVALID;
  // start/end are immutable while the region is in the table, so this finds it if it is there.
  if (lookup(region->start) != region) return MRC_ERR_NOT_FOUND;
  const uintptr_t root = root_.load(std::memory_order_relaxed);
  Unlinked unlinked;
  const uintptr_t updated = remove_from(root, kLevels, region, unlinked);
  if (updated != root) root_.store(updated, std::memory_order_release);
  // Retire only now: every unlinked node's replacement has been stored.
  for (unsigned i = 0; i < unlinked.count; ++i) domain_.retire(unlinked.nodes[i], &free_node);
  nodes_.store(nodes_.load(std::memory_order_relaxed) - unlinked.count, std::memory_order_relaxed);
  size_.store(size_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  return MRC_OK;
}

// ---- invariants (tests) ----------------------------------------------------------------------

template <unsigned kBitsPerLevel>
bool RadixPageTable<kBitsPerLevel>::check_entry(uintptr_t entry, unsigned level, uintptr_t block,
                                                Census &census) const noexcept {
  if (entry == 0) return true;
  if (!is_node(entry)) {
    const PgtRegion *region = region_of(entry);
    if (entry_for(region, block, level) != entry) return false;  // wrong tag or disjoint
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
  const Node *node = node_of(entry);
  const unsigned node_level = level_of(entry);
  const uintptr_t base = node->base;
  if (node_level >= level) return false;
  if ((base & (block_size(node_level + 1) - 1)) != 0) return false;
  if (base < block || base + block_size(node_level + 1) > block + block_size(level)) return false;
  ++census.nodes;
  unsigned used = 0;
  const PgtRegion *only = nullptr;
  bool several = false;
  for (unsigned i = 0; i < kFanout; ++i) {
    const uintptr_t e = node->slots[i].load(std::memory_order_relaxed);
    if (e == 0) continue;
    ++used;
    if (is_node(e)) {
      several = true;
    } else {
      if (only != nullptr && region_of(e) != only) several = true;
      only = region_of(e);
    }
    if (!check_entry(e, node_level, base + (uintptr_t{i} << slot_shift(node_level)), census)) {
      return false;
    }
  }
  return used >= 2 && several;  // canonical: a node separates at least two regions
}

template <unsigned kBitsPerLevel>
bool RadixPageTable<kBitsPerLevel>::check_invariants() const noexcept {
  Census census;
  if (!check_entry(root_.load(std::memory_order_relaxed), kLevels, 0, census)) return false;
  // Every byte of every region is covered by exactly one entry.
  return census.covered == census.region_bytes && census.nodes == node_count() &&
         census.regions == size();
}

template class RadixPageTable<2>;
template class RadixPageTable<3>;
template class RadixPageTable<4>;
template class RadixPageTable<5>;
template class RadixPageTable<6>;
template class RadixPageTable<7>;
template class RadixPageTable<8>;

}  // namespace mrc::detail
