// SPDX-License-Identifier: BSD-3-Clause
// Thread identity: a small index per live thread, for per-thread shards (statistics) and for
// whatever must know whether a thread has a slot to itself (the cache's parked puts).
//
// SYNCHRONIZATION: a thread's slot is assigned on its first call (a mutex, once per thread) and
// given back when it exits (a thread_local destructor). While at most kThreadSlots threads are
// alive every slot is exclusive: exactly one live thread holds it. Past that, later threads share
// slots round-robin (exclusive == false) and must use atomic read-modify-writes on them.
#pragma once

namespace mrc {

inline constexpr unsigned kThreadSlots = 128;

struct ThreadSlot {
  unsigned index;
  bool exclusive;
  bool assigned;
};

namespace detail {
// Initial-exec TLS: one load from the thread pointer, no __tls_get_addr call in libmrcache.so.
extern constinit thread_local ThreadSlot tls_thread_slot __attribute__((tls_model("initial-exec")));
const ThreadSlot &assign_thread_slot() noexcept;
}  // namespace detail

// This thread's slot (assigned on first call).
inline const ThreadSlot &this_thread_slot() noexcept {
  const ThreadSlot &slot = detail::tls_thread_slot;
  return __builtin_expect(slot.assigned, 1) ? slot : detail::assign_thread_slot();
}

}  // namespace mrc
