// The process's caches, for fork (fork_registry.h).
//
// SYNCHRONIZATION: see fork_registry.h and cache.h
#include "core/cache/fork_registry.h"

#include <pthread.h>

#include <cstddef>

#include "core/cache/cache.h"
#include "core/cache/reentry.h"

namespace mrc {

std::mutex &CacheRegistry::mutex() {
  static std::mutex m;
  return m;
}

Cache *&CacheRegistry::head() {
  static Cache *h = nullptr;
  return h;
}

void CacheRegistry::add(Cache *cache) {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(&prepare, &after, &after_in_child); });
  std::lock_guard lock(mutex());
  cache->fork_next_ = head();
  head() = cache;
}

void CacheRegistry::remove(Cache *cache) {
  std::lock_guard lock(mutex());
  for (Cache **link = &head(); *link != nullptr; link = &(*link)->fork_next_) {
    if (*link == cache) {
      *link = cache->fork_next_;
      return;
    }
  }
}

// A fork from inside a reg (the forking thread holds that cache's mutex_, reentry.h) leaves that
// mutex alone: the thread that holds it goes on in both processes and releases it when its get
// ends, and purging that cache would need it. Purges come before any cache mutex is taken: they
// run deregistrations, which may call any cache.
void CacheRegistry::prepare() {
  mutex().lock();
  for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
    cache->fork_held_ = inside(cache, Inside::Lock);
    // Best effort: refused only where waiting could deadlock (Cache::Lock::acquire).
    if ((cache->flags_ & MRC_FLAG_PURGE_ON_FORK) != 0 && !cache->fork_held_) {
      (void)cache->purge(true);
    }
  }
  for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
    if (!cache->fork_held_) cache->mutex_.lock();
  }
}

void CacheRegistry::after() {
  for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
    if (!cache->fork_held_) cache->mutex_.unlock();
    cache->fork_held_ = false;
  }
  mutex().unlock();
}

// The parent owns every registration the child inherited: mark them all before any child
// thread can put one (this handler runs while the child has a single thread). The table is
// emptied at the child's first drain (DrainResult::Forked).
void CacheRegistry::after_in_child() {
  for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
    for (Region *region = cache->live_head_; region != nullptr; region = region->live_next) {
      region->change_flags(Region::kForgotten);
    }
    for (size_t i = 0; i < cache->retiring_count_; ++i) {
      cache->retiring_[i]->change_flags(Region::kForgotten);  // their watches were the parent's
    }
  }
  after();
}

}  // namespace mrc
