// SPDX-License-Identifier: BSD-3-Clause
// Process-private futex waits and wakes on a 32-bit atomic word.
//
// SYNCHRONIZATION: the kernel's; a wait returns at once when the word differs from `expected`
// and may return spuriously, so callers re-check their condition in a loop.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace mrc::os {

// Sleeps while *word == expected (returns at once if it differs; may return spuriously).
// Process-private futexes: the words live in this process's memory only.
inline void futex_wait(std::atomic<uint32_t> *word, uint32_t expected) noexcept {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  (void)syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT_PRIVATE, expected,
                nullptr, nullptr, 0);
}
// The same, for at most `timeout_ns`.
inline void futex_wait_for(std::atomic<uint32_t> *word, uint32_t expected,
                           int64_t timeout_ns) noexcept {
  const timespec timeout{static_cast<time_t>(timeout_ns / 1000000000),
                         static_cast<long>(timeout_ns % 1000000000)};
  (void)syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT_PRIVATE, expected,
                &timeout, nullptr, 0);
}
inline void futex_wake_all(std::atomic<uint32_t> *word) noexcept {
  (void)syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
                nullptr, 0);
}

}  // namespace mrc::os
