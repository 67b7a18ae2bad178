// SPDX-License-Identifier: BSD-3-Clause
// Statistics counters that cost no shared write on the hit path.
//
// SYNCHRONIZATION: every thread owns one slot index (base/thread_slot.h). While at most kSlots
// threads are alive each slot has exactly one writer, which updates it with a relaxed load+store
// (no locked instruction); past that, threads share slots and fall back to relaxed fetch_add.
// Readers sum all slots with relaxed loads: a total may lag concurrent updates but never loses an
// increment once the writer's update is visible.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/thread_slot.h"

namespace mrc {

enum class Counter : unsigned {
  HitsFast,
  Puts,
  Deregistrations,
  EndedBytes,           // bytes whose registration ended (deregistered, or forgotten after fork)
  UnreleasedBytes,      // uncached regions waiting for deregistration (max_unreleased)
  ReleasedBytes,        // unreleased bytes whose registration ended
  UnmapWaits,           // exact gets that found an unmap in flight and waited for the monitor
  UnmapWaitsOutlasted,  // of those, the ones that gave up waiting and registered uncached
  PfnMismatches,        // hits whose page frames changed (MRC_FLAG_VERIFY_PFN)
  Count
};

class ShardedCounters {
 public:
  static constexpr unsigned kSlots = kThreadSlots;

  void add(Counter counter, uint64_t value = 1) noexcept {
    add(this_thread_slot(), counter, value);
  }
  // For a caller that already holds this thread's slot (the hit path).
  void add(const ThreadSlot &slot, Counter counter, uint64_t value = 1) noexcept {
    std::atomic<uint64_t> &cell = shards_[slot.index].values[static_cast<unsigned>(counter)];
    if (slot.exclusive) {
      cell.store(cell.load(std::memory_order_relaxed) + value, std::memory_order_relaxed);
    } else {
      cell.fetch_add(value, std::memory_order_relaxed);
    }
  }

  uint64_t sum(Counter counter) const noexcept {
    uint64_t total = 0;
    for (const Shard &shard : shards_) {
      total += shard.values[static_cast<unsigned>(counter)].load(std::memory_order_relaxed);
    }
    return total;
  }

 private:
  struct alignas(64) Shard {
    std::array<std::atomic<uint64_t>, static_cast<unsigned>(Counter::Count)> values{};
  };
  std::array<Shard, kSlots> shards_{};
};

}  // namespace mrc
