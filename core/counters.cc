#include "core/counters.h"

#include <mutex>

namespace mrc {
namespace {

// Slot ownership: a bitmap under a mutex, touched once per thread start and exit.
std::mutex g_slot_mutex;
std::array<bool, ShardedCounters::kSlots> g_slot_taken{};  // guarded by g_slot_mutex
unsigned g_next_shared = 0;                                // guarded by g_slot_mutex

struct SlotOwner {
  ThreadSlot slot{0, false};
  SlotOwner() {
    std::lock_guard lock(g_slot_mutex);
    for (unsigned i = 0; i < ShardedCounters::kSlots; ++i) {
      if (!g_slot_taken[i]) {
        g_slot_taken[i] = true;
        slot = {i, true};
        return;
      }
    }
    slot = {g_next_shared++ % ShardedCounters::kSlots, false};
  }
  ~SlotOwner() {
    if (!slot.exclusive) return;
    std::lock_guard lock(g_slot_mutex);
    g_slot_taken[slot.index] = false;
  }
  SlotOwner(const SlotOwner &) = delete;
  SlotOwner &operator=(const SlotOwner &) = delete;
};

}  // namespace

const ThreadSlot &this_thread_slot() noexcept {
  thread_local SlotOwner owner;
  return owner.slot;
}

}  // namespace mrc
