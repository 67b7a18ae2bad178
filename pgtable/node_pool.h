// SPDX-License-Identifier: BSD-3-Clause
// Memory for one page table's nodes: carved from chunks the pool maps itself, and recycled once
// no reader can still see a node. Private to pgtable/. Why a pool, and why the rules below hold:
// docs/DESIGN.md, "The node pool".
//
// SYNCHRONIZATION
//   1. The table's writer (one thread at a time, serialised by the table's caller) calls every
//      member function; the free lists, the chunk list, the open batch and the list of batches in
//      flight are its alone.
//   2. Retire a node only after unlinking it (release store into its parent); a full batch (or
//      flush()) goes to EpochDomain::retire().
//   3. EpochDomain calls grace_period_ended(batch) on whichever thread reclaims; it touches only
//      the batch's `state` (and, when the pool is gone, frees the batch and maybe the chunks).
//   4. The callback's state.exchange(kGraceEnded, acq_rel) pairs with the writer's acquire load
//      of kGraceEnded in harvest(): a node is reused only after the readers that saw it.
//   5. Readers never touch the pool; the nodes they read stay mapped while the pool lives and
//      until every batch in flight has come back.
//   6. The pool may die with batches in flight: the orphaned batches own the chunks jointly
//      (ChunkSet's count), and each batch's state.exchange() decides who frees the batch.
//   7. Every writer call is bounded and never waits for readers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/epoch.h"

namespace mrc::detail {

class NodePool {
 public:
  // Size classes (the table's leaves, inner nodes and flat nodes), in bytes, multiples of 8. A
  // chunk is made big enough for the class that needs it.
  static constexpr unsigned kClasses = 3;
  // Unlinked nodes per batch handed to the domain (one retire() each).
  static constexpr unsigned kBatchNodes = 64;
  // Batches in flight before the pool asks the domain to start a grace period (poll()): bounds
  // the nodes waiting for readers to kPollAfter * kBatchNodes and amortises the grace period's
  // system call over as many nodes.
  static constexpr unsigned kPollAfter = 4;
  // Chunks double from kFirstChunk up to kHugeChunk; later chunks are kHugeChunk each, aligned to
  // it and advised MADV_HUGEPAGE.
  static constexpr size_t kFirstChunk = size_t{4} << 10;
  static constexpr size_t kHugeChunk = size_t{2} << 20;

  NodePool(EpochDomain &domain, const size_t (&class_bytes)[kClasses]) noexcept;
  // REQUIRES: no reader can reach a node (the table's destructor). Unmaps the chunks, or leaves
  // them to the batches still in flight.
  ~NodePool();
  NodePool(const NodePool &) = delete;
  NodePool &operator=(const NodePool &) = delete;

  // Writer. Memory for a node of class cls (8-aligned), or nullptr when no chunk could be mapped.
  // Reuses a node whose grace period has ended before carving a new one. Contents: zero when
  // fresh; for a reused node, its bytes as the table left them when it retired or released the
  // node, except the first word (the free list's link).
  [[nodiscard]] void *allocate(unsigned cls) noexcept;
  // Writer. A node from allocate() that no reader ever saw: reusable at once.
  void release_unpublished(void *node, unsigned cls) noexcept;
  // Writer. A node the table has unlinked (readers may still hold it): reusable after a grace
  // period of the domain.
  void retire(void *node, unsigned cls) noexcept;
  // Writer. Hands the open batch to the domain now (after purge(): no need to wait for it to fill).
  void flush() noexcept;

  // Writer, for tests and statistics.
  size_t mapped_bytes() const noexcept { return mapped_bytes_; }
  size_t carved_bytes() const noexcept { return carved_bytes_; }
  size_t free_nodes() const noexcept { return free_count_[0] + free_count_[1]; }
  size_t nodes_waiting() const noexcept;  // retired, not yet reusable (open batch and in flight)

 private:
  struct Batch;
  struct ChunkSet;

  void *carve(size_t bytes) noexcept;
  bool map_chunk(size_t min_bytes) noexcept;
  void harvest() noexcept;
  void submit() noexcept;
  void push_free(void *node, unsigned cls) noexcept;
  static void grace_period_ended(void *batch) noexcept;
  static void release_chunks(ChunkSet *chunks) noexcept;

  EpochDomain &domain_;
  size_t class_bytes_[kClasses];
  void *free_[kClasses] = {};  // free nodes, linked through their first word
  size_t free_count_[kClasses] = {};
  ChunkSet *chunks_ = nullptr;  // allocated with the first chunk
  char *cursor_ = nullptr;      // carving position in the newest chunk
  char *limit_ = nullptr;
  size_t next_chunk_bytes_ = kFirstChunk;
  size_t mapped_bytes_ = 0;
  size_t carved_bytes_ = 0;
  Batch *open_ = nullptr;       // collecting unlinked nodes; not yet handed to the domain
  Batch *in_flight_ = nullptr;  // handed to the domain, oldest last
  unsigned in_flight_count_ = 0;
  Batch *spare_ = nullptr;  // a harvested batch kept for the next open one
};

}  // namespace mrc::detail
