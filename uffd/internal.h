// Private plumbing between the files of uffd/ (not for other layers).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::uffd::detail {

// maps.cc: the /proc/self/maps descriptors across fork (called by monitor.cc's atfork handlers,
// after the registry mutex in prepare, before it in parent/child).
void maps_prepare_fork() noexcept;
void maps_parent_after_fork() noexcept;
void maps_child_after_fork() noexcept;
// Closes the kept descriptors (monitor.cc, when the monitor stops; after the registry mutex).
void maps_close_descriptors() noexcept;

// Registers the pthread_atfork handlers (once): before the first subscription, and before the
// first /proc/self/maps descriptor is kept open.
void ensure_fork_handlers() noexcept;

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

// Copies text into buf (always terminated, truncated to fit); used for `why` and reasons.
void set_text(char *buf, size_t len, const char *text) noexcept;

}  // namespace mrc::uffd::detail
