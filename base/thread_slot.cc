// SPDX-License-Identifier: BSD-3-Clause
#include "base/thread_slot.h"

#include <array>
#include <mutex>

namespace mrc::detail {

constinit thread_local ThreadSlot tls_thread_slot{0, false, false};

namespace {

// Slot ownership: a bitmap under a mutex, touched once per thread start and exit.
std::mutex g_slot_mutex;
std::array<bool, kThreadSlots> g_slot_taken{};  // guarded by g_slot_mutex
unsigned g_next_shared = 0;                     // guarded by g_slot_mutex

// Gives the slot back when the thread exits.
struct SlotReturn {
  ~SlotReturn() {
    ThreadSlot &slot = tls_thread_slot;
    if (slot.assigned && slot.exclusive) {
      std::lock_guard lock(g_slot_mutex);
      g_slot_taken[slot.index] = false;
    }
    // Should the thread count again after this (another TLS destructor), it uses a shared slot.
    slot = {0, false, true};
  }
};

}  // namespace

const ThreadSlot &assign_thread_slot() noexcept {
  thread_local SlotReturn slot_return;
  (void)&slot_return;
  ThreadSlot &slot = tls_thread_slot;
  std::lock_guard lock(g_slot_mutex);
  for (unsigned i = 0; i < kThreadSlots; ++i) {
    if (!g_slot_taken[i]) {
      g_slot_taken[i] = true;
      slot = {i, true, true};
      return slot;
    }
  }
  slot = {g_next_shared++ % kThreadSlots, false, true};
  return slot;
}

}  // namespace mrc::detail
