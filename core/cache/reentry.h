// SPDX-License-Identifier: BSD-3-Clause
// What this thread is doing inside which cache: holding its lock, running one of its callbacks,
// destroying it. The cache reads it to refuse, with MRC_ERR_BUSY, a call that user code makes back
// into a cache that could not serve it without deadlocking or recursing (docs/DESIGN.md, "The C
// API contract", "User code").
//
// SYNCHRONIZATION: thread-local only. Each thread keeps a stack of frames that live on its own
// stack (InsideScope, Cache::Lock), linked through tls_inside; no other thread reads it. A fork
// child's only thread inherits the forking thread's frames, which the code it returns into pops.
#pragma once

#include <cstdint>

namespace mrc {

class Cache;

enum class Inside : uint8_t {
  Lock,      // holds the cache's mutex_ (a backend's reg runs here)
  Callback,  // runs a backend's dereg or an invalidate callback, outside mutex_
  Destroy,   // inside mrc_cache_destroy (its callbacks run here)
};

struct InsideFrame {
  const Cache *cache;
  Inside kind;
  InsideFrame *prev;
};

// This thread's innermost frame.
extern constinit thread_local InsideFrame *tls_inside;

// Whether this thread is inside `cache` as `kind` (at any depth).
inline bool inside(const Cache *cache, Inside kind) noexcept {
  for (const InsideFrame *frame = tls_inside; frame != nullptr; frame = frame->prev) {
    if (frame->cache == cache && frame->kind == kind) return true;
  }
  return false;
}
// Whether this thread is inside `cache` at all (its lock, a callback of it, its destroy).
inline bool inside_any(const Cache *cache) noexcept {
  for (const InsideFrame *frame = tls_inside; frame != nullptr; frame = frame->prev) {
    if (frame->cache == cache) return true;
  }
  return false;
}
// Whether this thread holds some cache's mutex_.
inline bool inside_a_lock() noexcept {
  for (const InsideFrame *frame = tls_inside; frame != nullptr; frame = frame->prev) {
    if (frame->kind == Inside::Lock) return true;
  }
  return false;
}

class InsideScope {
 public:
  InsideScope(const Cache *cache, Inside kind) noexcept : frame_{cache, kind, tls_inside} {
    tls_inside = &frame_;
  }
  ~InsideScope() { tls_inside = frame_.prev; }
  InsideScope(const InsideScope &) = delete;
  InsideScope &operator=(const InsideScope &) = delete;

 private:
  InsideFrame frame_;
};

}  // namespace mrc
