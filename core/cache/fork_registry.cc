// SPDX-License-Identifier: BSD-3-Clause
// The process's caches, for fork (fork_registry.h).
//
// SYNCHRONIZATION: see fork_registry.h and cache.h
#include "core/cache/fork_registry.h"

#include <pthread.h>

#include <cstddef>
#include <new>

#include "base/futex.h"
#include "core/cache/cache.h"
#include "core/cache/log.h"
#include "core/cache/reentry.h"

namespace mrc {

std::recursive_mutex &CacheRegistry::mutex() {
  static std::recursive_mutex m;
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

// Purges first, before any cache mutex is taken: they run deregistrations, which may call any
// cache, create or destroy one (mutex() is recursive for that), or fork. Then every cache's
// mutex_, but two kinds: the one the forking thread holds (a fork from inside its reg: that
// thread goes on in both processes and releases it when its get ends), and one whose holder
// runs reg on another thread (a reg that forks too, or creates a cache, would wait for this
// fork: the cache is copied as it is while its reg runs, see cache.h).
void CacheRegistry::prepare() {
  mutex().lock();
  {
    log::DeferScope defer_messages;  // until the walk no longer reads the caches (log.h)
    for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
      if ((cache->flags_ & MRC_FLAG_PURGE_ON_FORK) != 0 && !inside(cache, Inside::Lock)) {
        cache->purge_before_fork();  // best effort: not while a reg runs
      }
    }
  }
  for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
    cache->fork_held_ = inside(cache, Inside::Lock);
    cache->fork_skipped_ = !cache->fork_held_ && !cache->lock_or_skip_for_fork();
  }
}

// Exempt (docs/DESIGN.md, "Contracts the compiler checks"): it releases the mutex_ of each
// cache that prepare() locked, a lock per list element, which the analysis cannot name.
void CacheRegistry::after() MRC_NO_THREAD_SAFETY_ANALYSIS {
  for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
    if (cache->fork_skipped_) {
      cache->reg_state_.store(Cache::kRegRunning, std::memory_order_seq_cst);
      os::futex_wake_all(&cache->reg_state_);
    } else if (!cache->fork_held_) {
      cache->mutex_.unlock();
    }
    cache->fork_held_ = false;
    cache->fork_skipped_ = false;
  }
  mutex().unlock();
}

// The parent owns every registration the child inherited: mark them all before any child
// thread can put one (this handler runs while the child has a single thread). The table is
// emptied at the child's first drain (DrainResult::Forked). A cache whose reg ran on another
// thread gets a new, unlocked mutex_ (its holder does not exist here); the region that reg was
// for was on no list yet, and stays unused.
// Exempt, as after(): it also reads each cache under the mutex_ prepare() took.
void CacheRegistry::after_in_child() MRC_NO_THREAD_SAFETY_ANALYSIS {
  for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
    for (Region *region = cache->retirement_.live_head(); region != nullptr;
         region = region->live_next) {
      region->change_flags(Region::kForgotten);
    }
    // Their watches were the parent's.
    cache->retirement_.for_each_retiring(
        [](Region *region) { region->change_flags(Region::kForgotten); });
    if (cache->fork_skipped_) {
      new (&cache->mutex_) Mutex();
      cache->reg_state_.store(Cache::kRegIdle, std::memory_order_relaxed);
    } else if (!cache->fork_held_) {
      cache->mutex_.unlock();
    }
    cache->fork_held_ = false;
    cache->fork_skipped_ = false;
  }
  // A recursive mutex checks its owner's thread id at unlock, and this thread has a new one.
  new (&mutex()) std::recursive_mutex();
}

}  // namespace mrc
