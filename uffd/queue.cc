// SPDX-License-Identifier: BSD-3-Clause
// The invalidation queue (see queue.h for the synchronization contract).
#include "uffd/queue.h"

#include <sys/mman.h>

#include "base/check.h"
#include "base/futex.h"

namespace mrc::uffd {
namespace {

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

mrc_status_t InvalidationQueue::allocate(size_t capacity) noexcept {
  MRC_CHECK(slots_ == nullptr);
  if (capacity < 2 || (capacity & (capacity - 1)) != 0) return MRC_ERR_INVALID;
  const size_t bytes = capacity * sizeof(Slot);
  // Our own mapping, populated now: the producer must never fault on it (in MISSING mode a fault
  // on watched memory would wait for the producer itself), and allocating later is not allowed.
  void *memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (memory == MAP_FAILED) return MRC_ERR_NO_MEMORY;
  // A forked child never reads it; and the distinct VMA flag keeps the kernel from merging an
  // application's adjacent mapping into ours (which watch() would then have to refuse).
  (void)madvise(memory, bytes, MADV_DONTFORK);
  slots_ = static_cast<Slot *>(memory);  // zero-filled: seq 0 matches no record (2*i+2 >= 2)
  mask_ = capacity - 1;
  bytes_ = bytes;
  next_ = head_.load(std::memory_order_relaxed);
  return MRC_OK;
}

void InvalidationQueue::release() noexcept {
  if (slots_ != nullptr) munmap(slots_, bytes_);
  slots_ = nullptr;
  mask_ = 0;
  bytes_ = 0;
}

void InvalidationQueue::append(const Invalidation &record) noexcept {
  MRC_DASSERT(slots_ != nullptr);
  Slot &slot = slots_[next_ & mask_];
  slot.seq.store(2 * next_ + 1, std::memory_order_relaxed);
  slot.start.store(record.start, std::memory_order_release);
  slot.end.store(record.end, std::memory_order_release);
  slot.kind.store(static_cast<uint32_t>(record.kind), std::memory_order_release);
  slot.seq.store(2 * next_ + 2, std::memory_order_release);
  ++next_;
}

void InvalidationQueue::end_batch() noexcept {
  if (head_.load(std::memory_order_relaxed) != next_) {
    head_.store(next_, std::memory_order_release);
  }
  batches_.fetch_add(1, std::memory_order_seq_cst);
  pending_.fetch_sub(1, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) != 0) {
    os::futex_wake_all(&pending_);
  }
  if (batch_waiters_.load(std::memory_order_seq_cst) != 0) {
    os::futex_wake_all(&batches_);
  }
}

bool InvalidationQueue::read(uint64_t index, Invalidation *out) const noexcept {
  const Slot &slot = slots_[index & mask_];
  const uint64_t complete = 2 * index + 2;
  if (slot.seq.load(std::memory_order_acquire) != complete) return false;
  out->start = slot.start.load(std::memory_order_acquire);
  out->end = slot.end.load(std::memory_order_acquire);
  out->kind = static_cast<InvalidationKind>(slot.kind.load(std::memory_order_acquire));
  return slot.seq.load(std::memory_order_relaxed) == complete;
}

void InvalidationQueue::wait_until_idle() const noexcept {
  // pending_ is raised for one non-blocking read() and a few stores: usually spinning a little
  // is enough. If the monitor was preempted meanwhile, sleep instead of burning a shared core.
  for (int spin = 0; spin < 256; ++spin) {
    if (pending_.load(std::memory_order_acquire) == 0) return;
    cpu_relax();
  }
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  for (;;) {
    const uint32_t seen = pending_.load(std::memory_order_seq_cst);
    if (seen == 0) break;
    os::futex_wait(&pending_, seen);  // returns at once if pending_ != seen
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

void InvalidationQueue::wait_for_batch(int64_t timeout_ns) const noexcept {
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  os::futex_wait_for(&pending_, pending_.load(std::memory_order_seq_cst), timeout_ns);
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

void InvalidationQueue::wait_for_batch_after(uint32_t seen, int64_t timeout_ns) const noexcept {
  batch_waiters_.fetch_add(1, std::memory_order_seq_cst);
  os::futex_wait_for(&batches_, seen, timeout_ns);  // returns at once if batches_ != seen
  batch_waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

void InvalidationQueue::wake_batch_waiters() const noexcept { os::futex_wake_all(&batches_); }

void InvalidationQueue::reset_after_fork() noexcept {
  pending_.store(0, std::memory_order_relaxed);
  waiters_.store(0, std::memory_order_relaxed);
  batch_waiters_.store(0, std::memory_order_relaxed);
  next_ = head_.load(std::memory_order_relaxed);
}

}  // namespace mrc::uffd
