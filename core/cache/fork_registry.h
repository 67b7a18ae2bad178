// SPDX-License-Identifier: BSD-3-Clause
// The process's caches, for fork: every cache joins this list at creation and leaves it at
// destruction; pthread_atfork handlers walk it.
//
// SYNCHRONIZATION: the list is guarded by CacheRegistry::mutex() (recursive: a deregistration
// that a fork's purge runs may create or destroy a cache). prepare() takes it, then every
// cache's mutex_ but the one the forking thread holds (a fork inside reg: Cache::fork_held_) and
// those whose holder runs reg on another thread (Cache::fork_skipped_, see cache.h), and the
// parent and child handlers release them; see docs/DESIGN.md ("Fork handlers", "The C API
// contract") for the order of handlers and fork from user code.
#pragma once

#include <mutex>

namespace mrc {

class Cache;

// Keeps fork safe: prepare takes every cache mutex (after purging caches that asked for it) so
// that the child never inherits a mutex held by a thread that does not exist there, or, for one
// held across a reg, re-creates it in the child.
struct CacheRegistry {
  static void add(Cache *cache);
  static void remove(Cache *cache);

 private:
  static std::recursive_mutex &mutex();
  static Cache *&head();
  static void prepare();
  static void after();
  static void after_in_child();
};

}  // namespace mrc
