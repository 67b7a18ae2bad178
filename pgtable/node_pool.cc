// SPDX-License-Identifier: BSD-3-Clause
// The page table's node pool; the contract is in node_pool.h.
#include "pgtable/node_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "base/check.h"

#if defined(__SANITIZE_ADDRESS__)
#define MRC_POOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MRC_POOL_ASAN 1
#endif
#endif
#if defined(MRC_POOL_ASAN)
#include <sanitizer/asan_interface.h>
#define MRC_POOL_POISON(address, bytes) ASAN_POISON_MEMORY_REGION(address, bytes)
#define MRC_POOL_UNPOISON(address, bytes) ASAN_UNPOISON_MEMORY_REGION(address, bytes)
#else
#define MRC_POOL_POISON(address, bytes) ((void)(address), (void)(bytes))
#define MRC_POOL_UNPOISON(address, bytes) ((void)(address), (void)(bytes))
#endif

namespace mrc::detail {
namespace {

enum BatchState : uint32_t { kCollecting, kInFlight, kGraceEnded, kOrphaned };

// At the start of every chunk.
struct ChunkHeader {
  ChunkHeader *next;
  size_t bytes;
};
static_assert(sizeof(ChunkHeader) % 16 == 0);

}  // namespace

struct NodePool::ChunkSet {
  // The pool while it lives, plus every batch it orphaned; the last owner unmaps the chunks.
  std::atomic<size_t> owners{1};
  ChunkHeader *head = nullptr;
};

struct NodePool::Batch {
  std::atomic<uint32_t> state{kCollecting};
  uint32_t count = 0;
  Batch *next = nullptr;         // the writer's list of batches in flight
  ChunkSet *chunks = nullptr;    // for the callback of an orphaned batch
  uintptr_t items[kBatchNodes];  // node address | size class
};

NodePool::NodePool(EpochDomain &domain, const size_t (&class_bytes)[kClasses]) noexcept
    : domain_(domain) {
  for (unsigned cls = 0; cls < kClasses; ++cls) {
    MRC_CHECK(class_bytes[cls] % 8 == 0 && class_bytes[cls] >= sizeof(void *));
    class_bytes_[cls] = class_bytes[cls];
  }
}

NodePool::~NodePool() {
  delete open_;  // collected only: no reader can reach its nodes (REQUIRES), nothing to wait for
  delete spare_;
  if (chunks_ == nullptr) return;
  // Count the orphans in before any callback can release its share.
  chunks_->owners.fetch_add(in_flight_count_, std::memory_order_relaxed);
  for (Batch *batch = in_flight_; batch != nullptr;) {
    Batch *next = batch->next;  // read first: once orphaned, the callback may free the batch
    // acq_rel: acquire pairs with the callback's exchange when it ran first (we free the batch);
    // release publishes the orphaning to the callback that runs later.
    if (batch->state.exchange(kOrphaned, std::memory_order_acq_rel) == kGraceEnded) {
      delete batch;
      release_chunks(chunks_);
    }
    batch = next;
  }
  release_chunks(chunks_);
}

void NodePool::release_chunks(ChunkSet *chunks) noexcept {
  // acq_rel: the owner that unmaps sees every other owner's accesses as done.
  if (chunks->owners.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  for (ChunkHeader *chunk = chunks->head; chunk != nullptr;) {
    ChunkHeader *next = chunk->next;
    const size_t bytes = chunk->bytes;
    // Poisoned free nodes must not leave poisoned shadow behind for a later mapping.
    MRC_POOL_UNPOISON(chunk, bytes);
    munmap(chunk, bytes);
    chunk = next;
  }
  delete chunks;
}

void NodePool::grace_period_ended(void *object) noexcept {
  auto *batch = static_cast<Batch *>(object);
  // acq_rel: release hands the grace period to the writer's acquire load in harvest(); acquire
  // pairs with the destructor's exchange when the pool is already gone.
  if (batch->state.exchange(kGraceEnded, std::memory_order_acq_rel) == kOrphaned) {
    ChunkSet *chunks = batch->chunks;
    delete batch;
    release_chunks(chunks);
  }
}

bool NodePool::map_chunk(size_t min_bytes) noexcept {
  if (chunks_ == nullptr) {
    chunks_ = new (std::nothrow) ChunkSet;
    if (chunks_ == nullptr) return false;
  }
  size_t bytes = next_chunk_bytes_;
  while (bytes < min_bytes + sizeof(ChunkHeader)) bytes *= 2;
  const bool huge = bytes >= kHugeChunk;
  // A huge chunk is mapped twice its size and trimmed to an aligned one, so that the kernel can
  // back it with huge pages from its first byte.
  const size_t mapped = huge ? bytes + kHugeChunk : bytes;
  void *memory = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return false;
  char *start = static_cast<char *>(memory);
  if (huge) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(memory);
    const uintptr_t aligned = (address + kHugeChunk - 1) & ~uintptr_t{kHugeChunk - 1};
    const size_t head = aligned - address;
    if (head != 0) munmap(memory, head);
    if (mapped - head - bytes != 0)
      munmap(reinterpret_cast<char *>(aligned) + bytes, mapped - head - bytes);
    start = reinterpret_cast<char *>(aligned);
    // Advice only: without transparent huge pages the chunk is simply made of small pages.
    (void)madvise(start, bytes, MADV_HUGEPAGE);
  }
  auto *chunk = reinterpret_cast<ChunkHeader *>(start);
  chunk->next = chunks_->head;
  chunk->bytes = bytes;
  chunks_->head = chunk;
  cursor_ = start + sizeof(ChunkHeader);
  limit_ = start + bytes;
  mapped_bytes_ += bytes;
  next_chunk_bytes_ = std::min(bytes * 2, kHugeChunk);
  return true;
}

void *NodePool::carve(size_t bytes) noexcept {
  if (static_cast<size_t>(limit_ - cursor_) < bytes && !map_chunk(bytes)) return nullptr;
  void *node = cursor_;
  cursor_ += bytes;
  carved_bytes_ += bytes;
  return node;
}

void NodePool::push_free(void *node, unsigned cls) noexcept {
  *static_cast<void **>(node) = free_[cls];
  free_[cls] = node;
  ++free_count_[cls];
  MRC_POOL_POISON(static_cast<char *>(node) + sizeof(void *), class_bytes_[cls] - sizeof(void *));
}

void *NodePool::allocate(unsigned cls) noexcept {
  if (free_[cls] == nullptr && in_flight_ != nullptr) harvest();
  void *node = free_[cls];
  if (node == nullptr) return carve(class_bytes_[cls]);
  free_[cls] = *static_cast<void **>(node);
  --free_count_[cls];
  MRC_POOL_UNPOISON(node, class_bytes_[cls]);
  return node;
}

void NodePool::release_unpublished(void *node, unsigned cls) noexcept { push_free(node, cls); }

void NodePool::harvest() noexcept {
  for (Batch **link = &in_flight_; *link != nullptr;) {
    Batch *batch = *link;
    // Acquire: pairs with grace_period_ended(); the readers that might have seen these nodes
    // have left their guards.
    if (batch->state.load(std::memory_order_acquire) != kGraceEnded) {
      link = &batch->next;
      continue;
    }
    *link = batch->next;
    --in_flight_count_;
    for (uint32_t i = 0; i < batch->count; ++i) {
      const uintptr_t item = batch->items[i];
      push_free(reinterpret_cast<void *>(item & ~uintptr_t{7}), static_cast<unsigned>(item & 7));
    }
    if (spare_ == nullptr) {
      batch->count = 0;
      batch->next = nullptr;
      batch->state.store(kCollecting, std::memory_order_relaxed);
      spare_ = batch;
    } else {
      delete batch;
    }
  }
}

void NodePool::retire(void *node, unsigned cls) noexcept {
  if (open_ == nullptr) {
    open_ = spare_ != nullptr ? spare_ : new (std::nothrow) Batch;
    spare_ = nullptr;
    // No memory for a batch: the node is never reused, and is unmapped with the pool.
    if (open_ == nullptr) return;
  }
  open_->items[open_->count++] = reinterpret_cast<uintptr_t>(node) | cls;
  if (open_->count == kBatchNodes) submit();
}

void NodePool::flush() noexcept {
  if (open_ != nullptr && open_->count != 0) submit();
}

void NodePool::submit() noexcept {
  Batch *batch = open_;
  open_ = nullptr;
  batch->chunks = chunks_;
  batch->state.store(kInFlight, std::memory_order_relaxed);
  batch->next = in_flight_;
  in_flight_ = batch;
  ++in_flight_count_;
  // The domain's mutex orders the batch's contents before the callback, on whatever thread.
  domain_.retire(batch, &grace_period_ended);
  harvest();
  // Grace periods start when the domain's own batch fills; a table that only churns nodes would
  // otherwise keep up to kBatch of ours in flight.
  if (in_flight_count_ >= kPollAfter) domain_.poll();
}

size_t NodePool::nodes_waiting() const noexcept {
  size_t count = open_ != nullptr ? open_->count : 0;
  for (const Batch *batch = in_flight_; batch != nullptr; batch = batch->next)
    count += batch->count;
  return count;
}

}  // namespace mrc::detail
