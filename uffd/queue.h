// SPDX-License-Identifier: BSD-3-Clause
// The invalidation queue: the monitor's output, read by every subscribed cache. Why the rules
// below hold: docs/DESIGN.md, "The invalidation queue".
//
// SYNCHRONIZATION
//   1. One producer (the monitor thread), any number of consumers, each with its own cursor. The
//      producer never blocks, waits for a consumer or allocates; it laps a slow consumer.
//   2. A lapped consumer (read() returns false) purges everything it derived from the queue.
//   3. pending_: raised (seq_cst RMW) before each read() of the userfaultfd, lowered (seq_cst RMW)
//      after that read's records are published; consumers load it with acquire.
//   4. head_: records ever published (monotonic across restarts), stored with release after the
//      slots it covers; consumers load it with acquire.
//   5. Slot seq, a seqlock: 2*i+1 while record i is written, 2*i+2 once complete. Writer: seq odd
//      (relaxed), fields (release), seq even (release). Reader: seq (acquire), fields (acquire),
//      seq again (relaxed); equal, even and 2*i+2 is an untorn copy.
//   6. waiters_ with pending_, and batch_waiters_ with batches_, are Dekker pairs: seq_cst on both
//      sides. batches_ is raised (seq_cst RMW) by end_batch() after head_'s store.
//   7. next_ is the producer's, set before its thread starts; slots_ and mask_ change only in
//      allocate() and release(), with no producer running and no consumer attached.
//   8. The producer, read() and the quiescence checks are wait-free; wait_until_idle() blocks only
//      while pending_ is raised.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::uffd {

// What went away. Unmap: munmap, brk shrink, mremap shrink, MAP_FIXED over it. Remove:
// madvise(DONTNEED/FREE/REMOVE) dropped the pages (the mapping stays). Remap: a moving mremap;
// [start, end) is the old range.
enum class InvalidationKind : uint32_t { Unmap, Remove, Remap };

struct Invalidation {
  uintptr_t start;
  uintptr_t end;
  InvalidationKind kind;
};

class InvalidationQueue {
 public:
  constexpr InvalidationQueue() = default;
  InvalidationQueue(const InvalidationQueue &) = delete;
  InvalidationQueue &operator=(const InvalidationQueue &) = delete;

  // Preallocates (and pre-faults) room for `capacity` records, a power of two >= 2.
  // REQUIRES: no producer running, no consumer reading, no storage attached.
  [[nodiscard]] mrc_status_t allocate(size_t capacity) noexcept;
  // REQUIRES: as for allocate(). Records already published stay counted in head().
  void release() noexcept;
  size_t capacity() const noexcept { return mask_ + 1; }
  bool allocated() const noexcept { return slots_ != nullptr; }
  // The storage's address range (empty when not allocated).
  uintptr_t storage_begin() const noexcept { return reinterpret_cast<uintptr_t>(slots_); }
  uintptr_t storage_end() const noexcept { return storage_begin() + bytes_; }

  // ---- producer (one thread) ----
  // Raises pending_. Why before the read(): the kernel releases the unmapping thread as soon as
  // read() has copied its message out, long before the record is appended. Because pending_ is
  // already raised at that moment, any thread that learns the munmap returned (and then loads
  // pending_) sees it raised, or sees it lowered by end_batch() after the record was published.
  void begin_batch() noexcept { pending_.fetch_add(1, std::memory_order_seq_cst); }
  void append(const Invalidation &record) noexcept;
  // Publishes the appended records (head_, release), then lowers pending_ and wakes waiters.
  void end_batch() noexcept;

  // ---- consumers ----
  uint32_t pending() const noexcept { return pending_.load(std::memory_order_acquire); }
  uint64_t head() const noexcept { return head_.load(std::memory_order_acquire); }
  // Copies record `index` (< head()). False when it was overwritten: the reader was lapped.
  [[nodiscard]] bool read(uint64_t index, Invalidation *out) const noexcept;
  // Returns once pending_ is 0: spins briefly, then sleeps on a futex.
  void wait_until_idle() const noexcept;
  // Sleeps until the producer ends its next batch, or `timeout_ns` passed (or spuriously).
  void wait_for_batch(int64_t timeout_ns) const noexcept;
  // Batches ended so far (wraps). Read it before checking for work, then wait_for_batch_after()
  // with what it returned: a batch that ends in between wakes the wait at once.
  uint32_t batches() const noexcept { return batches_.load(std::memory_order_seq_cst); }
  // Sleeps while no batch ended since batches() returned `seen`, at most `timeout_ns` (or
  // spuriously).
  void wait_for_batch_after(uint32_t seen, int64_t timeout_ns) const noexcept;
  // Wakes every wait_for_batch_after() at once (a consumer that is stopping its waiting thread).
  void wake_batch_waiters() const noexcept;

  // In a forked child: no producer exists there, whatever state the copy was caught in.
  void reset_after_fork() noexcept;

 private:
  struct Slot {
    std::atomic<uint64_t> seq;
    std::atomic<uint64_t> start;
    std::atomic<uint64_t> end;
    std::atomic<uint32_t> kind;
    uint32_t unused;
  };
  static_assert(sizeof(Slot) == 32);

  // Read on every fast-path check: one cache line, written once per batch.
  alignas(64) mutable std::atomic<uint32_t> pending_{0};
  std::atomic<uint64_t> head_{0};
  alignas(64) mutable std::atomic<uint32_t> waiters_{0};
  mutable std::atomic<uint32_t> batches_{0};
  mutable std::atomic<uint32_t> batch_waiters_{0};
  alignas(64) uint64_t next_ = 0;
  Slot *slots_ = nullptr;
  uint64_t mask_ = 0;
  size_t bytes_ = 0;
};

}  // namespace mrc::uffd
