// SPDX-License-Identifier: BSD-3-Clause
// Creating and destroying a cache: checking and copying the parameters, subscribing to the
// monitor, joining the process's list of caches (fork_registry.h); at the end, deregistering
// what is left and giving region memory back.
//
// SYNCHRONIZATION: see cache.h
#include "core/cache/cache.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>

#include "backends/backends.h"
#include "base/check.h"
#include "base/epoch.h"
#include "base/error.h"
#include "base/pagemap.h"
#include "core/cache/alignment.h"
#include "core/cache/config.h"
#include "core/cache/fork_registry.h"
#include "core/cache/log.h"

namespace mrc {

mrc_status_t Cache::create(const mrc_cache_params_t &params, Cache **out) noexcept {
  if (out == nullptr) return MRC_ERR_INVALID;
  constexpr unsigned kKnownFlags =
      MRC_FLAG_PURGE_ON_FORK | MRC_FLAG_VERIFY_PFN | MRC_FLAG_ORDERED_UNMAPS | MRC_FLAG_CACHE_CHURN;
  // Each refusal says why in mrc_last_error() (docs/DESIGN.md, "The C API contract").
  if ((params.flags & ~kKnownFlags) != 0) {
    set_last_error("mrc_cache_create: unknown flags %#x", params.flags & ~kKnownFlags);
    return MRC_ERR_INVALID;
  }
  if (params.alignment != 0 &&
      (!is_power_of_two(params.alignment) || params.alignment < kPageSize)) {
    set_last_error("mrc_cache_create: alignment %zu is not a power of two of at least %zu",
                   params.alignment, kPageSize);
    return MRC_ERR_INVALID;
  }
  if (params.name != nullptr && std::strlen(params.name) >= sizeof(name_)) {
    set_last_error("mrc_cache_create: the name is longer than %zu characters", sizeof(name_) - 1);
    return MRC_ERR_INVALID;
  }
  mrc_backend_t backend{};
  // A plugin may leave operations out: they get not-supported defaults, never NULL checks here.
  // The caller's table is read by its struct_size and copied: the cache keeps no pointer to it.
  if (backends::complete_caller_ops(params.backend != nullptr ? params.backend : mrc_backend_null(),
                                    &backend) != MRC_OK) {
    return MRC_ERR_INVALID;
  }

  Cache *cache = new (std::nothrow) Cache();
  if (cache == nullptr) return MRC_ERR_NO_MEMORY;
  if (params.name != nullptr) std::snprintf(cache->name_, sizeof(cache->name_), "%s", params.name);
  cache->backend_ = backends::CheckedOps(backend);
  cache->backend_ctx_ = params.backend_ctx;
  cache->max_regions_ = params.max_regions;
  cache->max_bytes_ = params.max_bytes;
  cache->dereg_batch_.set_limit(params.max_unreleased);
  cache->flags_ = params.flags;
  cache->exact_ = (params.flags & MRC_FLAG_ORDERED_UNMAPS) == 0;
  cache->churn_.set_enabled((params.flags & MRC_FLAG_CACHE_CHURN) == 0);
  cache->alignment_ = params.alignment != 0 ? params.alignment : kPageSize;
  cache->print_stats_ = config::stats_at_destroy();
  if ((params.flags & MRC_FLAG_VERIFY_PFN) != 0) {
    char why[160];
    if (!os::pagemap::available(why, sizeof why)) {
      MRC_LOG_WARN("cache {}: PFN verification disabled: {}", cache->name_, why);
      cache->flags_ &= ~static_cast<unsigned>(MRC_FLAG_VERIFY_PFN);
    } else {
      cache->verify_pfn_pages_ = params.verify_pfn_pages != 0 ? params.verify_pfn_pages : 1;
    }
  }
  epoch_domain().decide_mode();  // before the monitor's thread (EpochDomain::decide_mode)
  mrc_status_t status = uffd::subscribe(&cache->subscription_);
  if (status != MRC_OK) {
    delete cache;
    return status;
  }
  CacheRegistry::add(cache);
  MRC_LOG_DEBUG("cache {} created (backend {}, monitor {})", cache->name_, backend.name,
                cache->subscription_->mode() == MRC_MONITOR_UNCACHED ? "uncached" : "watching");
  *out = cache;
  return MRC_OK;
}

Cache::~Cache() {
  if (subscription_ != nullptr) uffd::unsubscribe(subscription_);
}

bool Cache::held_locked() noexcept {
  unpark_all_locked();  // parked references are the cache's own, not the application's
  for (Region *region = retirement_.live_head(); region != nullptr; region = region->live_next) {
    const uint64_t count = region->refcount.load(std::memory_order_acquire);
    if ((count & Region::kDead) != 0) continue;  // deferred, batched or finished: no holder
    if (count > (region->has(Region::kInTable) ? 1U : 0U)) return true;
  }
  return false;
}

mrc_status_t Cache::destroy(Cache *cache, bool refuse_held) noexcept {
  if (cache == nullptr) return MRC_OK;
  // From its reg (under mutex_), a dereg or an invalidate callback, or a callback its own destroy
  // runs: destroying would deadlock, recurse, or free the cache under the code that called back.
  if (inside_any(cache)) {
    set_last_error(
        "mrc_cache_destroy: cache %s is running the code that called it (its reg, a "
        "dereg, an invalidate callback or its own destroy)",
        cache->name_);
    return MRC_ERR_BUSY;
  }
  if (refuse_held) {
    bool held = false;
    Region *deferred = nullptr;
    {
      Lock lock(*cache);
      if (!lock.acquire()) return MRC_ERR_BUSY;
      held = cache->held_locked();
      deferred = cache->take_deferred_locked();
    }
    cache->finish_all(deferred);
    if (held) {
      set_last_error(
          "mrc_cache_destroy: cache %s: the application still holds a region (put it, "
          "or close the segment registered with it, first)",
          cache->name_);
      return MRC_ERR_BUSY;
    }
  }
  // Messages reach the handler once the cache is gone (log.h), so it may use every other cache.
  log::DeferScope defer_messages;
  // The callbacks destroy runs (deregistrations batched by max_unreleased, regions still held for
  // the 0.1 call) find the cache being destroyed: a get from them is refused (get_slow).
  InsideScope scope(cache, Inside::Destroy);
  CacheRegistry::remove(cache);
  // Reclaims every parked reference too: only cached regions are parked. Never refused here
  // (inside Destroy it waits for mutex_).
  MRC_CHECK(cache->purge(true) == MRC_OK);
  MRC_DASSERT(cache->parking_.all_empty());
  cache->finish_dereg_batch();
  // Whatever is left is still referenced by the application: deregister it anyway.
  size_t in_use = 0;
  Region *leftover = nullptr;
  {
    Lock lock(*cache);
    MRC_CHECK(lock.acquire(/*wait=*/true));
    cache->reap_finished_locked();
    leftover = cache->retirement_.live_head();
  }
  for (Region *region = leftover; region != nullptr; region = region->live_next) {
    ++in_use;
    region->refcount.store(Region::kDead, std::memory_order_relaxed);
    cache->finish(region);  // pushes it on finished_; the live list is walked, not changed
  }
  Region *free_regions = nullptr;
  {
    Lock lock(*cache);
    MRC_CHECK(lock.acquire(/*wait=*/true));
    cache->reap_finished_locked();
    cache->retirement_.retire_batch(&Cache::recycle_regions);
    free_regions = cache->pool_.take_all();
  }
  if (in_use != 0) {
    MRC_LOG_WARN("cache {} destroyed with {} region(s) still in use; they were deregistered",
                 cache->name_, in_use);
  }
  if (cache->print_stats_) {
    char buffer[4096];
    if (cache->stats_json(buffer, sizeof buffer) > 0) std::fprintf(stderr, "%s\n", buffer);
  }
  epoch_domain().synchronize();  // every retired region is back in the pool
  for (Region *list : {free_regions, cache->recycled_.take_all()}) {
    for_each_in_chain(list, [](Region *region) { delete region; });
  }
  delete cache;
  return MRC_OK;
}

}  // namespace mrc
