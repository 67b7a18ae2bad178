// SPDX-License-Identifier: BSD-3-Clause
// The shared heap. SYNCHRONIZATION and CRASH CONSISTENCY: see heap.h. In short: everything under
// HeapHeader::lock; the chain of block sizes changes by single 8-byte stores separated by
// compiler fences; everything else is rebuilt by repair_locked() after EOWNERDEAD.
//
// Shared memory is input (internal/validate.h): the heap's size is the one this process mapped
// (data_size_), never the header's word; the header is checked when the lock is taken, and each
// offset read from a block (a size, a free-list link) is checked before it is followed, so a
// scribbled word makes the call fail with MRC_ERR_IO and nothing outside the mapping is touched.
// Free-list walks are bounded by the number of blocks the heap can hold (a cycle ends them).
#include "core/segment/heap.h"

#include <atomic>
#include <cstring>
#include <new>

#include "core/segment/internal/sys.h"
#include "core/segment/internal/validate.h"

namespace mrc::seg {

namespace {

constexpr uint64_t kNil = kHeapNil;
constexpr uint64_t kUsed = 1;
constexpr uint64_t kGrain = kHeapGrain;
constexpr uint64_t kHeader = 16;
constexpr uint64_t kMinBlock = kHeapMinBlock;
constexpr uint32_t kUsedCheck = 0x5a17c0deU;
constexpr uint64_t kLockTimeoutNs = 10ULL * 1000 * 1000 * 1000;

struct Block {
  uint64_t size_used;
  uint32_t prev_units;  // size of the previous block / 16; 0 for the first block
  uint32_t check;       // kUsedCheck ^ (offset / 16) while used: a cheap "is a block start"
};
static_assert(sizeof(Block) == kHeader);

struct Links {
  uint64_t next, prev;
};

// A kill can land between any two instructions: keep the compiler from moving stores across.
inline void commit() noexcept { std::atomic_signal_fence(std::memory_order_seq_cst); }

inline uint64_t round_up(uint64_t v, uint64_t a) noexcept { return (v + a - 1) & ~(a - 1); }

// Block access for a heap of heap_size bytes (process-local, validated). REQUIRES for block():
// off + 16 <= heap_size; for links(): is_block(off).
class View {
 public:
  View(HeapHeader *h, char *data, uint64_t heap_size) noexcept
      : h_(h), data_(data), heap_size_(heap_size) {}

  Block *block(uint64_t off) const noexcept {
    return reinterpret_cast<Block *>(data_ + off);  // NOLINT: shared memory
  }
  Links *links(uint64_t off) const noexcept {
    return reinterpret_cast<Links *>(data_ + off + kHeader);  // NOLINT
  }
  uint64_t word(uint64_t off) const noexcept {
    return std::atomic_ref<uint64_t>(block(off)->size_used).load(std::memory_order_relaxed);
  }
  uint64_t size_of(uint64_t off) const noexcept { return word(off) & ~(kGrain - 1); }
  bool used(uint64_t off) const noexcept { return (word(off) & kUsed) != 0; }
  static uint32_t check_for(uint64_t off) noexcept {
    return kUsedCheck ^ static_cast<uint32_t>(off / kGrain);
  }

  // The one store that changes the chain.
  void set_word(uint64_t off, uint64_t size, bool is_used) const noexcept {
    commit();
    std::atomic_ref<uint64_t>(block(off)->size_used)
        .store(size | (is_used ? kUsed : 0), std::memory_order_relaxed);
    commit();
  }
  // A header not yet reachable through the chain (inside a block being split).
  void write_block(uint64_t off, uint64_t size, bool is_used, uint64_t prev_size) const noexcept {
    block(off)->prev_units = static_cast<uint32_t>(prev_size / kGrain);
    block(off)->check = is_used ? check_for(off) : 0;
    set_word(off, size, is_used);
  }
  void set_next_prev(uint64_t off, uint64_t size) const noexcept {
    const uint64_t next = off + size;
    if (next < heap_size_) block(next)->prev_units = static_cast<uint32_t>(size / kGrain);
  }

  // A possible block start: aligned, with room for a header and the links.
  bool is_block(uint64_t off) const noexcept {
    return off < heap_size_ && off % kGrain == 0 && heap_size_ - off >= kMinBlock;
  }
  bool link_ok(uint64_t off) const noexcept { return off == kNil || is_block(off); }
  // A block whose size word fits the heap from `off` on.
  bool size_ok(uint64_t off) const noexcept {
    if (!is_block(off)) return false;
    const uint64_t size = size_of(off);
    return size >= kMinBlock && size <= heap_size_ - off;
  }

  // REQUIRES: is_block(off). Both links of a free block are none or possible blocks.
  bool links_ok(uint64_t off) const noexcept {
    const Links *l = links(off);
    return link_ok(l->prev) && link_ok(l->next);
  }

  // Each link is read once, checked, then used. false (nothing written) when one is not a block.
  [[nodiscard]] bool push(uint64_t off) const noexcept {
    const uint64_t head = h_->free_head;
    if (!link_ok(head)) return false;
    Links *l = links(off);
    l->next = head;
    l->prev = kNil;
    if (head != kNil) links(head)->prev = off;
    h_->free_head = off;
    return true;
  }
  [[nodiscard]] bool remove(uint64_t off) const noexcept {
    Links *l = links(off);
    const uint64_t prev = l->prev;
    const uint64_t next = l->next;
    if (!link_ok(prev) || !link_ok(next)) return false;
    if (prev != kNil) {
      links(prev)->next = next;
    } else {
      h_->free_head = next;
    }
    if (next != kNil) links(next)->prev = prev;
    return true;
  }

 private:
  HeapHeader *h_;
  char *data_;
  uint64_t heap_size_;
};

}  // namespace

mrc_status_t SharedHeap::init(HeapHeader *header, char *data, uint64_t data_size) noexcept {
  const uint64_t size = heap_size_for(data_size);
  if (size < kMinBlock) return fail(MRC_ERR_INVALID, "segment too small for a heap");
  const int rc = robust_mutex_init(&header->lock);
  if (rc != 0) return fail(MRC_ERR_IO, "heap mutex init: {}", errno_text(rc));
  header->heap_size = size;
  header->free_head = kNil;
  header->bytes_used = header->used_blocks = header->free_blocks = 0;
  header->allocs = header->frees = header->repairs = 0;
  header->state = kHeapOk;
  View v(header, data, size);
  v.write_block(0, size, false, 0);
  (void)v.push(0);  // the list is empty: nothing to check
  header->free_blocks = 1;
  return MRC_OK;
}

mrc_status_t SharedHeap::lock(bool *repaired) noexcept {
  if (repaired != nullptr) *repaired = false;
  // The header as it is now: checked once locked (a dead owner's repair rebuilds the derived
  // fields, so they are checked after it).
  auto checked = [&]() noexcept {
    const mrc_status_t st = check_heap_header(*header_, data_size_);
    if (st != MRC_OK) pthread_mutex_unlock(&header_->lock);
    return st;
  };
  switch (robust_lock(&header_->lock, monotonic_ns() + kLockTimeoutNs)) {
    case LockResult::Acquired: return checked();
    case LockResult::OwnerDied:
      if (header_->heap_size == heap_size_for(data_size_)) repair_locked();
      pthread_mutex_consistent(&header_->lock);
      if (repaired != nullptr) *repaired = true;
      return checked();
    case LockResult::Timeout: {
      const MutexState s = mutex_state(&header_->lock);
      return fail(MRC_ERR_BUSY, "heap lock held for 10 s by live thread {}", s.owner_tid);
    }
    case LockResult::Unrecoverable: return fail(MRC_ERR_IO, "heap lock is not recoverable");
    case LockResult::Error: break;
  }
  return fail(MRC_ERR_IO, "heap lock failed");
}

void SharedHeap::unlock() noexcept { pthread_mutex_unlock(&header_->lock); }

void SharedHeap::repair_locked() noexcept {
  const uint64_t heap_size = heap_size_for(data_size_);
  View v(header_, data_, heap_size);
  header_->free_head = kNil;
  uint64_t used_blocks = 0, free_blocks = 0, bytes_used = 0;
  uint64_t prev = kNil, prev_size = 0, tail = kNil;
  bool prev_free = false;
  uint64_t off = 0;
  header_->repairs++;
  while (off < heap_size) {
    const uint64_t size = v.size_of(off);
    if (size < kMinBlock || size > heap_size - off) {
      header_->state = kHeapCorrupt;
      set_error("heap chain broken at offset {} (size {})", off, size);
      return;
    }
    const bool is_used = v.used(off);
    if (!is_used && prev_free) {
      // A free neighbour a dead process had not merged yet.
      prev_size += size;
      v.set_word(prev, prev_size, false);
      off += size;
      continue;
    }
    v.block(off)->prev_units = prev == kNil ? 0 : static_cast<uint32_t>(prev_size / kGrain);
    if (is_used) {
      ++used_blocks;
      bytes_used += size;
      v.block(off)->check = View::check_for(off);
    } else {
      // Appended, so that the list is in address order (first fit prefers low addresses).
      ++free_blocks;
      v.links(off)->next = kNil;
      v.links(off)->prev = tail;
      if (tail == kNil) {
        header_->free_head = off;
      } else {
        v.links(tail)->next = off;
      }
      tail = off;
    }
    prev = off;
    prev_size = size;
    prev_free = !is_used;
    off += size;
  }
  header_->used_blocks = used_blocks;
  header_->free_blocks = free_blocks;
  header_->bytes_used = bytes_used;
  header_->state = kHeapOk;
}

void *SharedHeap::alloc(size_t size, size_t align) noexcept {
  if (align == 0) align = kGrain;
  if ((align & (align - 1)) != 0) {
    set_error("alignment {} is not a power of two", align);
    return nullptr;
  }
  if (align < kGrain) align = kGrain;
  const uint64_t heap_size = heap_size_for(data_size_);
  if (size > heap_size || align > heap_size) {
    set_error("{} bytes (alignment {}) do not fit a heap of {} bytes", size, align, heap_size);
    return nullptr;
  }
  uint64_t need = round_up(size == 0 ? 1 : size, kGrain) + kHeader;
  if (need < kMinBlock) need = kMinBlock;

  if (lock(nullptr) != MRC_OK) return nullptr;
  if (header_->state != kHeapOk) {
    unlock();
    set_error("heap is corrupt");
    return nullptr;
  }
  View v(header_, data_, heap_size);
  const auto data_addr = reinterpret_cast<uintptr_t>(data_);
  uint64_t found = kNil, lead = 0, found_size = 0;
  // Only a scribble from outside the heap code makes this fail: refuse to allocate from then on.
  auto corrupt = [&](const char *what, uint64_t off) {
    header_->state = kHeapCorrupt;
    unlock();
    set_error("heap {} at offset {}", what, off);
    return nullptr;
  };
  // A heap holds at most heap_size / kMinBlock blocks: a longer walk went round a cycle.
  uint64_t budget = heap_size / kMinBlock + 1;
  for (uint64_t f = header_->free_head; f != kNil; f = v.links(f)->next) {
    if (budget-- == 0 || !v.size_ok(f) || v.used(f)) return corrupt("free list corrupt", f);
    const uint64_t s = v.size_of(f);
    uint64_t payload = round_up(data_addr + f + kHeader, align) - data_addr;
    uint64_t l = payload - kHeader - f;
    while (l != 0 && l < kMinBlock) l += align;
    if (l <= s && need <= s - l) {
      found = f;
      lead = l;
      found_size = s;
      break;
    }
  }
  if (found == kNil) {
    unlock();
    set_error("heap full: no free block of {} bytes (alignment {})", need, align);
    return nullptr;
  }

  uint64_t b = found;
  uint64_t bsize = found_size;
  if (lead != 0) {
    // Carve the aligned block out of the tail; `found` keeps the lead and its list place.
    b = found + lead;
    bsize = found_size - lead;
    v.write_block(b, bsize, false, lead);
    v.set_word(found, lead, false);
    v.set_next_prev(b, bsize);
  } else if (!v.remove(found)) {
    return corrupt("free-list link corrupt", found);
  }
  const uint64_t rest = bsize - need;
  if (rest >= kMinBlock) {
    const uint64_t r = b + need;
    // The list head is checked before the chain changes: a bad one changes nothing.
    if (!v.link_ok(header_->free_head)) return corrupt("free_head corrupt", header_->free_head);
    v.write_block(r, rest, false, need);
    v.block(b)->check = View::check_for(b);
    v.set_word(b, need, true);
    if (!v.push(r)) return corrupt("free_head corrupt", header_->free_head);
    v.set_next_prev(r, rest);
    header_->free_blocks += lead != 0 ? 1U : 0U;
    bsize = need;
  } else {
    v.block(b)->check = View::check_for(b);
    v.set_word(b, bsize, true);
    header_->free_blocks -= lead != 0 ? 0 : 1;
  }
  header_->used_blocks++;
  header_->bytes_used += bsize;
  header_->allocs++;
  unlock();
  return data_ + b + kHeader;
}

bool SharedHeap::free(void *ptr) noexcept {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  const auto d = reinterpret_cast<uintptr_t>(data_);
  const uint64_t heap_size = heap_size_for(data_size_);
  if (p < d + kHeader || (p - d) % kGrain != 0 || p - d - kHeader >= heap_size) {
    set_error("free: {} is not inside this heap", ptr);
    return false;
  }
  uint64_t off = p - d - kHeader;
  if (lock(nullptr) != MRC_OK) return false;
  View v(header_, data_, heap_size);
  const uint64_t w = v.word(off);
  uint64_t size = w & ~(kGrain - 1);
  if (header_->state != kHeapOk || (w & kUsed) == 0 ||
      v.block(off)->check != View::check_for(off) || size < kMinBlock || size > heap_size - off) {
    unlock();
    set_error("free: {} is not a live block (double free?)", ptr);
    return false;
  }
  // Everything the free will follow is checked before the first store: the next block's size and
  // links, the list head. A scribble fails it with nothing changed.
  const uint64_t next = off + size;
  const bool merge_next = next < heap_size && !v.used(next);
  if ((merge_next && (!v.size_ok(next) || !v.links_ok(next))) || !v.link_ok(header_->free_head)) {
    header_->state = kHeapCorrupt;
    unlock();
    set_error("free: heap corrupt next to {}", ptr);
    return false;
  }
  header_->used_blocks--;
  header_->bytes_used -= size;
  header_->frees++;
  v.block(off)->check = 0;
  v.set_word(off, size, false);
  if (merge_next) {
    if (!v.remove(next)) {
      // The chain is consistent (a free block next to a free block; repair merges them), the
      // list is not: refuse further allocations.
      header_->state = kHeapCorrupt;
      unlock();
      set_error("free: free-list link of the block after {} is corrupt", ptr);
      return true;
    }
    size += v.size_of(next);
    v.set_word(off, size, false);
    header_->free_blocks--;
  }
  const uint64_t prev_units = v.block(off)->prev_units;
  const uint64_t prev_size = prev_units * kGrain;
  if (prev_units != 0 && prev_size <= off && !v.used(off - prev_size) &&
      v.size_of(off - prev_size) == prev_size) {
    off -= prev_size;
    size += prev_size;
    v.set_word(off, size, false);  // the previous block is in the list already
  } else if (v.push(off)) {
    header_->free_blocks++;
  } else {
    header_->state = kHeapCorrupt;  // the head changed under us: only a scribble does that
  }
  v.set_next_prev(off, size);
  unlock();
  return true;
}

mrc_status_t SharedHeap::verify_locked(mrc_seg_heap_stats_t *stats) noexcept {
  const uint64_t heap_size = heap_size_for(data_size_);
  View v(header_, data_, heap_size);
  if (header_->state != kHeapOk) return fail(MRC_ERR_IO, "heap marked corrupt");
  const uint64_t units = heap_size / kGrain;
  auto *is_free = new (std::nothrow) uint64_t[(units + 63) / 64]();
  if (is_free == nullptr) return fail(MRC_ERR_NO_MEMORY, "heap check: no memory");
  mrc_status_t status = MRC_OK;
  uint64_t used_blocks = 0, free_blocks = 0, bytes_used = 0, largest = 0, prev_size = 0;
  bool prev_free = false;
  uint64_t off = 0;
  while (off < heap_size) {
    const uint64_t size = v.size_of(off);
    if (size < kMinBlock || size > heap_size - off) {
      status = fail(MRC_ERR_IO, "heap: block at {} has size {}", off, size);
      break;
    }
    if (v.block(off)->prev_units * kGrain != prev_size) {
      status = fail(MRC_ERR_IO, "heap: block at {} records previous size {}, actual {}", off,
                    v.block(off)->prev_units * kGrain, prev_size);
      break;
    }
    const bool is_used = v.used(off);
    if (is_used) {
      ++used_blocks;
      bytes_used += size;
      if (v.block(off)->check != View::check_for(off)) {
        status = fail(MRC_ERR_IO, "heap: used block at {} has a bad check word", off);
        break;
      }
    } else {
      if (prev_free) {
        status = fail(MRC_ERR_IO, "heap: free blocks touch at {}", off);
        break;
      }
      ++free_blocks;
      if (size > largest) largest = size;
      is_free[off / kGrain / 64] |= uint64_t{1} << (off / kGrain % 64);
    }
    prev_free = !is_used;
    prev_size = size;
    off += size;
  }
  if (status == MRC_OK && off != heap_size) {
    status = fail(MRC_ERR_IO, "heap: blocks end at {}, heap at {}", off, heap_size);
  }
  if (status == MRC_OK) {
    uint64_t listed = 0, prev = kNil;
    for (uint64_t f = header_->free_head; f != kNil; f = v.links(f)->next) {
      const uint64_t bit = uint64_t{1} << (f / kGrain % 64);
      if (f >= heap_size || f % kGrain != 0 || (is_free[f / kGrain / 64] & bit) == 0) {
        status = fail(MRC_ERR_IO, "heap: free list holds {}, not a free block (or twice)", f);
        break;
      }
      if (v.links(f)->prev != prev) {
        status = fail(MRC_ERR_IO, "heap: free list back link of {} is wrong", f);
        break;
      }
      is_free[f / kGrain / 64] &= ~bit;
      prev = f;
      ++listed;
    }
    if (status == MRC_OK && listed != free_blocks) {
      status = fail(MRC_ERR_IO, "heap: {} free blocks, {} on the free list", free_blocks, listed);
    }
  }
  if (status == MRC_OK &&
      (used_blocks != header_->used_blocks || free_blocks != header_->free_blocks ||
       bytes_used != header_->bytes_used)) {
    status = fail(MRC_ERR_IO,
                  "heap: counters ({} used, {} free, {} bytes) differ from the walk "
                  "({}, {}, {})",
                  header_->used_blocks, header_->free_blocks, header_->bytes_used, used_blocks,
                  free_blocks, bytes_used);
  }
  delete[] is_free;
  if (stats != nullptr) {
    stats->heap_size = heap_size;
    stats->bytes_used = bytes_used;
    stats->bytes_free = heap_size - bytes_used;
    stats->largest_free = largest;
    stats->used_blocks = used_blocks;
    stats->free_blocks = free_blocks;
    stats->allocs = header_->allocs;
    stats->frees = header_->frees;
    stats->repairs = header_->repairs;
  }
  return status;
}

mrc_status_t SharedHeap::check(mrc_seg_heap_stats_t *stats) noexcept {
  const mrc_status_t st = lock(nullptr);
  if (st != MRC_OK) return st;
  const mrc_status_t result = verify_locked(stats);
  unlock();
  return result;
}

mrc_status_t SharedHeap::recover(bool *repaired) noexcept {
  const mrc_status_t st = lock(repaired);
  if (st != MRC_OK) return st;
  unlock();
  return MRC_OK;
}

}  // namespace mrc::seg
