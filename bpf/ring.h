// SPDX-License-Identifier: BSD-3-Clause
// The consumer side of one process's ring of address-space changes: a BPF ring buffer
// (BPF_MAP_TYPE_RINGBUF) that programs running in the changing thread fill before the kernel
// frees anything, read here with plain loads (docs/DESIGN.md, "The eBPF ring").
//
// 1. quiet() from any thread, no lock: nothing is unread (the producer position equals the
//    consumer's) and no record was dropped since the last drain (the lost counter is unmoved).
//    Acquire loads: they pair with the producer's release of its position and with drain()'s
//    release of the consumer's.
// 2. drain() one thread at a time (its caller's lock). It applies every committed record in
//    order, then publishes the position after them (release): a thread that then sees quiet()
//    also sees what the records' application changed.
// 3. drain() stops at a record reserved but not committed (Busy): a change is in flight, as
//    userfaultfd's mmap_changing says; the caller waits for it or trusts nothing.
// 4. A moved lost counter or a record no program of ours writes: Lost, and the caller purges
//    everything; the next quiet() is true only after that drain.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "bpf/abi.h"
#include "mrcache/mrcache.h"

namespace mrc::bpf {

// What the programs write, one record per change of a watched address space (abi.h, the
// layout the programs' C shares).
enum class ChangeKind : uint32_t {
  Unmap = MRC_BPF_CHANGE_UNMAP,      // munmap, brk shrink, shmdt, MAP_FIXED over, mremap's unmaps
  Remap = MRC_BPF_CHANGE_REMAP,      // mremap: the old range
  Madvise = MRC_BPF_CHANGE_MADVISE,  // a madvise that drops pages (aux: the advice)
  Purge = MRC_BPF_CHANGE_PURGE,      // a change whose range could not be read: everything
};

struct ChangeRecord {
  uint32_t kind;  // ChangeKind
  uint32_t aux;
  uint64_t start;
  uint64_t end;  // exclusive; ~0: to the top of the address space
};
static_assert(sizeof(ChangeRecord) == sizeof(mrc_bpf_change));
static_assert(offsetof(ChangeRecord, start) == offsetof(mrc_bpf_change, start));
static_assert(offsetof(ChangeRecord, end) == offsetof(mrc_bpf_change, end));

// The ring as the kernel lays it out for mmap: the consumer position on a page of its own
// (read-write), the producer position on the next (read-only), then the data area, mapped
// twice back to back so that a record that wraps reads as one piece.
struct RingLayout {
  std::atomic<uint64_t> *consumer = nullptr;
  const std::atomic<uint64_t> *producer = nullptr;
  const uint8_t *data = nullptr;  // 2 * size bytes
  size_t size = 0;                // a power of two, a multiple of the page size
  // This ring's count of dropped records (the programs' own, in a map of their own), or null.
  const std::atomic<uint64_t> *lost = nullptr;
};

class RingConsumer {
 public:
  // The ring's header: its length with two flags, and an offset the consumer does not use.
  static constexpr uint32_t kBusyBit = 1U << 31;     // reserved, not committed yet
  static constexpr uint32_t kDiscardBit = 1U << 30;  // committed as discarded: skip it
  static constexpr size_t kHeaderBytes = 8;

  RingConsumer() = default;
  explicit RingConsumer(const RingLayout &ring) noexcept { attach(ring); }
  // Starts where the kernel's consumer position is, with the lost counter as it is.
  void attach(const RingLayout &ring) noexcept;

  [[gnu::always_inline]] bool quiet() const noexcept {
    if (ring_.producer->load(std::memory_order_acquire) !=
        position_.load(std::memory_order_acquire)) {
      return false;
    }
    return ring_.lost == nullptr || ring_.lost->load(std::memory_order_acquire) ==
                                        lost_seen_.load(std::memory_order_acquire);
  }

  enum class Drained : uint8_t { Ok, Busy, Lost };
  // Applies each committed record (apply(const ChangeRecord &)), in order.
  template <typename Apply>
  Drained drain(Apply &&apply) noexcept {
    uint64_t at = position_.load(std::memory_order_relaxed);
    const uint64_t end = ring_.producer->load(std::memory_order_acquire);
    Drained result = Drained::Ok;
    while (at < end) {
      const auto *header =
          reinterpret_cast<const std::atomic<uint32_t> *>(ring_.data + (at & (ring_.size - 1)));
      const uint32_t header_word = header->load(std::memory_order_acquire);
      if ((header_word & kBusyBit) != 0) {
        if (result == Drained::Ok) result = Drained::Busy;
        break;
      }
      const uint32_t length = header_word & ~(kBusyBit | kDiscardBit);
      if ((header_word & kDiscardBit) == 0) {
        if (length != sizeof(ChangeRecord)) {
          result = Drained::Lost;  // not a record of ours: nothing can be trusted
        } else {
          ChangeRecord record;
          __builtin_memcpy(&record, reinterpret_cast<const uint8_t *>(header) + kHeaderBytes,
                           sizeof record);
          apply(static_cast<const ChangeRecord &>(record));
        }
      }
      at += (length + kHeaderBytes + 7) & ~uint64_t{7};
    }
    publish(at);
    if (ring_.lost != nullptr) {
      const uint64_t lost = ring_.lost->load(std::memory_order_acquire);
      if (lost != lost_seen_.load(std::memory_order_relaxed)) {
        // Published only after the caller purged: that is what makes quiet() true again.
        lost_pending_ = lost;
        result = Drained::Lost;
      }
    }
    return result;
  }
  // After a drain that returned Lost, once the caller purged everything.
  void purged() noexcept { lost_seen_.store(lost_pending_, std::memory_order_release); }

 private:
  void publish(uint64_t at) noexcept {
    ring_.consumer->store(at, std::memory_order_release);  // frees the space for the producer
    position_.store(at, std::memory_order_release);        // what quiet() compares with
  }

  RingLayout ring_{};
  std::atomic<uint64_t> position_{0};
  std::atomic<uint64_t> lost_seen_{0};
  uint64_t lost_pending_ = 0;
};

// The ring of a BPF_MAP_TYPE_RINGBUF map, mapped from its descriptor: the consumer page
// read-write, the rest read-only (a process may not write the producer's side).
class MappedRing {
 public:
  MappedRing() = default;
  MappedRing(const MappedRing &) = delete;
  MappedRing &operator=(const MappedRing &) = delete;
  ~MappedRing() { unmap(); }
  // data_bytes: the map's max_entries. MRC_ERR_INVALID (not a power of two, not a page
  // multiple) or MRC_ERR_IO (mmap refused; mrc_last_error() says why).
  [[nodiscard]] mrc_status_t map(int ring_fd, size_t data_bytes) noexcept;
  void unmap() noexcept;
  const RingLayout &layout() const noexcept { return layout_; }

 private:
  RingLayout layout_{};
  void *consumer_page_ = nullptr;
  void *rest_ = nullptr;
  size_t rest_bytes_ = 0;
};

}  // namespace mrc::bpf
