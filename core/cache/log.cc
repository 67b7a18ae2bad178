// SPDX-License-Identifier: BSD-3-Clause
#include "core/cache/log.h"

#include <strings.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>

#include <pthread.h>

#include "base/error.h"

namespace mrc::log {
namespace {

struct Handler {
  mrc_log_fn fn;
  void *arg;
};

int initial_level() noexcept {
  mrc_log_level_t level = MRC_LOG_WARN;
  const char *env = std::getenv("MRC_LOG_LEVEL");  // NOLINT(concurrency-mt-unsafe): no setenv here
  if (env != nullptr && *env != '\0' && !parse_level(env, &level)) {
    std::fprintf(stderr,
                 "mrcache: MRC_LOG_LEVEL=%s is not a level (error, warn, info, debug, trace)\n",
                 env);
  }
  return static_cast<int>(level);
}

std::mutex g_handler_mutex;
Handler g_handler{nullptr, nullptr};  // guarded by g_handler_mutex

// A child must not inherit the mutex held by a thread that does not exist there.
[[maybe_unused]] const int g_fork_handlers =
    pthread_atfork([] { g_handler_mutex.lock(); }, [] { g_handler_mutex.unlock(); },
                   [] { g_handler_mutex.unlock(); });

const char *level_name(mrc_log_level_t level) noexcept {
  switch (level) {
    case MRC_LOG_ERROR: return "error";
    case MRC_LOG_WARN: return "warn";
    case MRC_LOG_INFO: return "info";
    case MRC_LOG_DEBUG: return "debug";
    case MRC_LOG_TRACE: return "trace";
  }
  return "?";
}

// Messages logged while this thread is inside a deferral (defer_begin). Their texts live on the
// heap, allocated at the thread's first deferred message: libmrcache's thread-local block must
// stay small enough for a dlopen (base/error.cc).
struct DeferredTexts {
  mrc_log_level_t levels[kDeferredMax];
  char texts[kDeferredMax][kDeferredLength];
};
struct Deferred {
  unsigned depth;
  unsigned count;
  unsigned lost;
  DeferredTexts *store;
};
constinit thread_local Deferred tls_deferred{};
// Frees the thread's store when it exits; touched only by the thread that allocates one.
struct DeferredStoreOwner {
  bool armed = false;
  DeferredStoreOwner() = default;
  DeferredStoreOwner(const DeferredStoreOwner &) = delete;
  DeferredStoreOwner &operator=(const DeferredStoreOwner &) = delete;
  ~DeferredStoreOwner() {
    delete tls_deferred.store;
    tls_deferred.store = nullptr;
  }
};
thread_local DeferredStoreOwner tls_deferred_owner;

void emit_now(mrc_log_level_t level, const char *message) noexcept {
  Handler handler;
  {
    std::lock_guard lock(g_handler_mutex);
    handler = g_handler;
  }
  if (handler.fn != nullptr) {
    // The handler runs at the end of the call that logged: its own calls must not change the
    // reason that call leaves in mrc_last_error().
    char reason[kLastErrorSize];
    std::snprintf(reason, sizeof reason, "%s", last_error());
    handler.fn(handler.arg, level, message);
    set_last_error("%s", reason);
    return;
  }
  std::fprintf(stderr, "mrcache %s: %s\n", level_name(level), message);
}

}  // namespace

std::atomic<int> g_level{initial_level()};

void defer_begin() noexcept { ++tls_deferred.depth; }

// The buffer is emptied before any handler runs: a handler may log (emitted at once, depth is
// zero) or call into a cache, whose own deferral then flushes only what it logged.
void defer_end() noexcept {
  Deferred &deferred = tls_deferred;
  if (--deferred.depth != 0) return;
  if (deferred.count == 0 && deferred.lost == 0) return;
  const unsigned count = std::exchange(deferred.count, 0U);
  const unsigned lost = std::exchange(deferred.lost, 0U);
  mrc_log_level_t levels[kDeferredMax];
  char texts[kDeferredMax][kDeferredLength];
  if (count != 0) {
    std::memcpy(levels, deferred.store->levels, count * sizeof levels[0]);
    std::memcpy(texts, deferred.store->texts, count * sizeof texts[0]);
  }
  for (unsigned i = 0; i < count; ++i) emit_now(levels[i], texts[i]);
  if (lost != 0) {
    char text[96];
    std::snprintf(text, sizeof text, "%u message(s) logged during one cache call were dropped",
                  lost);
    emit_now(MRC_LOG_WARN, text);
  }
}

bool parse_level(const char *text, mrc_log_level_t *out) noexcept {
  static constexpr const char *kNames[] = {"error", "warn", "info", "debug", "trace"};
  for (int i = 0; i < 5; ++i) {
    if (strcasecmp(text, kNames[i]) == 0 || (text[0] == '0' + i && text[1] == '\0')) {
      *out = static_cast<mrc_log_level_t>(i);
      return true;
    }
  }
  return false;
}

void emit(mrc_log_level_t level, const char *message) noexcept {
  Deferred &deferred = tls_deferred;
  if (deferred.depth == 0) {
    emit_now(level, message);
    return;
  }
  if (deferred.store == nullptr) {
    deferred.store = new (std::nothrow) DeferredTexts;
    if (deferred.store != nullptr) tls_deferred_owner.armed = true;
  }
  if (deferred.count == kDeferredMax || deferred.store == nullptr) {
    ++deferred.lost;
    return;
  }
  deferred.store->levels[deferred.count] = level;
  std::snprintf(deferred.store->texts[deferred.count], kDeferredLength, "%s", message);
  ++deferred.count;
}

}  // namespace mrc::log

extern "C" {

void mrc_set_log_handler(mrc_log_fn fn, void *arg) {
  std::lock_guard lock(mrc::log::g_handler_mutex);
  mrc::log::g_handler = {fn, fn != nullptr ? arg : nullptr};
}

void mrc_set_log_level(mrc_log_level_t level) {
  if (level < MRC_LOG_ERROR || level > MRC_LOG_TRACE) return;
  mrc::log::g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

}  // extern "C"
