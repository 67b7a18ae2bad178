// SPDX-License-Identifier: BSD-3-Clause
// Logging through fmt, with levels from MRC_LOG_LEVEL and a user-installable callback.
//
// SYNCHRONIZATION: the level is a relaxed atomic read on every log call; the handler is copied
// under a mutex before it is called (outside the mutex, so a handler may log).
// Never call these from the monitor thread: formatting allocates.
//
// No handler runs under a cache lock, nor while the call that logged still uses its cache
// (docs/DESIGN.md, "The C API contract", "User code"): a cache call that may log or lock holds a
// DeferScope from its start (Cache::Lock holds one too), and its messages wait in a small buffer
// of the thread's own until the outermost deferral ends, when the call is done with the cache.
// So a handler may call any mrc_* function, destroy that cache too, or fork; what it leaves in
// mrc_last_error() is undone, so the caller still reads its own call's reason.
#pragma once

#include <fmt/format.h>

#include <atomic>

#include "mrcache/mrcache.h"

namespace mrc::log {

extern std::atomic<int> g_level;

inline bool enabled(mrc_log_level_t level) noexcept {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

void emit(mrc_log_level_t level, const char *message) noexcept;
// Between defer_begin and its defer_end (nested: the outermost pair counts) this thread's
// messages are kept (up to kDeferredMax, each cut to kDeferredLength bytes; beyond that they are
// counted and one line says how many were lost) and handed to the handler by the outermost
// defer_end. Thread-local only: no lock.
void defer_begin() noexcept;
void defer_end() noexcept;
inline constexpr unsigned kDeferredMax = 8;
inline constexpr size_t kDeferredLength = 256;

// defer_begin for the scope's life.
class DeferScope {
 public:
  DeferScope() noexcept { defer_begin(); }
  ~DeferScope() { defer_end(); }
  DeferScope(const DeferScope &) = delete;
  DeferScope &operator=(const DeferScope &) = delete;
};

// Parses "error|warn|info|debug|trace" or a digit; false on anything else.
bool parse_level(const char *text, mrc_log_level_t *out) noexcept;

template <class... Args>
void write(mrc_log_level_t level, fmt::format_string<Args...> format, Args &&...args) noexcept {
  if (!enabled(level)) return;
  fmt::memory_buffer buffer;
  fmt::format_to(std::back_inserter(buffer), format, std::forward<Args>(args)...);
  buffer.push_back('\0');
  emit(level, buffer.data());
}

}  // namespace mrc::log

#define MRC_LOG_ERROR(...) ::mrc::log::write(MRC_LOG_ERROR, __VA_ARGS__)
#define MRC_LOG_WARN(...) ::mrc::log::write(MRC_LOG_WARN, __VA_ARGS__)
#define MRC_LOG_INFO(...) ::mrc::log::write(MRC_LOG_INFO, __VA_ARGS__)
#define MRC_LOG_DEBUG(...) ::mrc::log::write(MRC_LOG_DEBUG, __VA_ARGS__)
