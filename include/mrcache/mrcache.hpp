// SPDX-License-Identifier: BSD-3-Clause
// mrcache — a thin C++ layer over the C API: RAII owners for caches and region references.
// No exceptions: fallible calls return mrc_status_t, as the C API does.
#ifndef MRCACHE_MRCACHE_HPP
#define MRCACHE_MRCACHE_HPP

#include <cstddef>
#include <cstdint>
#include <utility>

#include "mrcache/mrcache.h"

namespace mrcache {

// One reference to a region; released (mrc_put) when destroyed.
class RegionRef {
 public:
  RegionRef() noexcept = default;
  RegionRef(mrc_cache_t *cache, mrc_region_t *region) noexcept : cache_(cache), region_(region) {}
  RegionRef(RegionRef &&other) noexcept
      : cache_(std::exchange(other.cache_, nullptr)),
        region_(std::exchange(other.region_, nullptr)) {}
  RegionRef &operator=(RegionRef &&other) noexcept {
    if (this != &other) {
      reset();
      cache_ = std::exchange(other.cache_, nullptr);
      region_ = std::exchange(other.region_, nullptr);
    }
    return *this;
  }
  RegionRef(const RegionRef &) = delete;
  RegionRef &operator=(const RegionRef &) = delete;
  ~RegionRef() { reset(); }

  void reset() noexcept {
    if (region_ != nullptr) mrc_put(cache_, region_);
    region_ = nullptr;
    cache_ = nullptr;
  }
  explicit operator bool() const noexcept { return region_ != nullptr; }
  mrc_region_t *get() const noexcept { return region_; }
  void *start() const noexcept { return mrc_region_start(region_); }
  size_t length() const noexcept { return mrc_region_length(region_); }
  uint64_t key() const noexcept { return mrc_region_key(region_); }
  void *handle() const noexcept { return mrc_region_handle(region_); }
  // Drops the region from the cache; this reference stays valid until reset.
  mrc_status_t invalidate(void (*done)(void *) = nullptr, void *arg = nullptr) const noexcept {
    return mrc_invalidate(cache_, region_, done, arg);
  }

 private:
  mrc_cache_t *cache_ = nullptr;
  mrc_region_t *region_ = nullptr;
};

// Owns an mrc_cache_t; destroys it (deregistering everything) when destroyed. mrc_cache_destroy
// refuses (MRC_ERR_BUSY) while a region of the cache is still held (a RegionRef, a registered
// segment): reset() then keeps the cache, so it can be called again once they are released, and
// the destructor leaves the cache alive and unowned (leaked, never freed under a RegionRef that
// outlives this owner; such a RegionRef still puts its region safely).
class Cache {
 public:
  Cache() noexcept = default;
  Cache(Cache &&other) noexcept : cache_(std::exchange(other.cache_, nullptr)) {}
  // The cache owned before is destroyed, or left alive unowned when that is refused (above).
  Cache &operator=(Cache &&other) noexcept {
    if (this != &other) {
      if (reset() != MRC_OK) release();
      cache_ = std::exchange(other.cache_, nullptr);
    }
    return *this;
  }
  Cache(const Cache &) = delete;
  Cache &operator=(const Cache &) = delete;
  ~Cache() {
    if (reset() != MRC_OK) release();
  }

  // Creates a cache from params (default: mrc_cache_params_init's). MRC_ERR_BUSY when the cache
  // owned before cannot be destroyed yet (reset()).
  [[nodiscard]] mrc_status_t open(const mrc_cache_params_t *params = nullptr) noexcept {
    if (const mrc_status_t status = reset(); status != MRC_OK) return status;
    mrc_cache_params_t defaults;
    if (params == nullptr) {
      mrc_cache_params_init(&defaults);
      params = &defaults;
    }
    return mrc_cache_create(params, &cache_);
  }
  // Destroys the cache (MRC_OK, nothing owned any more), or keeps owning it when mrc_cache_destroy
  // refuses (MRC_ERR_BUSY: a region is still held).
  [[nodiscard]] mrc_status_t reset() noexcept {
    if (cache_ == nullptr) return MRC_OK;
    const mrc_status_t status = mrc_cache_destroy(cache_);
    if (status == MRC_OK) cache_ = nullptr;
    return status;
  }
  // Gives the cache up without destroying it; the caller owns the result.
  mrc_cache_t *release() noexcept { return std::exchange(cache_, nullptr); }

  [[nodiscard]] mrc_status_t get(void *address, size_t length, unsigned prot,
                                 RegionRef *out) noexcept {
    mrc_region_t *region = nullptr;
    mrc_status_t status = mrc_get(cache_, address, length, prot, &region);
    if (status == MRC_OK) *out = RegionRef(cache_, region);
    return status;
  }
  [[nodiscard]] mrc_status_t stats(mrc_stats_t *out) const noexcept {
    return mrc_cache_stats(cache_, out);
  }
  mrc_cache_t *get() const noexcept { return cache_; }
  explicit operator bool() const noexcept { return cache_ != nullptr; }

 private:
  mrc_cache_t *cache_ = nullptr;
};

}  // namespace mrcache

#endif  // MRCACHE_MRCACHE_HPP
