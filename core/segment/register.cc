// SPDX-License-Identifier: BSD-3-Clause
// Registered segments: the whole segment registered through a cache (mrc_get), and keys for heap
// allocations. Kept apart from segment.cc so that the segment code links without the cache.
//
// SYNCHRONIZATION: mrc_seg::registration_mu guards cache/region/key/release_registration of
// one handle; it is taken alone (never with the domain or heap locks), and mrc_get/mrc_put run
// under it (they take only the cache's own locks, never ours).
//
// Keys stay current: each key lookup asks the cache again (a hit costs a page-table lookup);
// when the cache hands back a different region (the old one was invalidated, e.g. by a
// MADV_REMOVE inside the segment), the segment swaps its own reference to the new one.
// Invalidation on close is the monitor's: mrc_seg_close drops the segment's reference and then
// replaces the mapping with a PROT_NONE reservation, an unmap the monitor reports.
#include "core/segment/domain.h"
#include "core/segment/internal/sys.h"

using mrc::seg::fail;

namespace {

constexpr unsigned kProt = MRC_PROT_READ | MRC_PROT_WRITE;

void release(mrc_seg *seg) {
  if (seg->region != nullptr) mrc_put(seg->cache, seg->region);
  seg->region = nullptr;
  seg->cache = nullptr;
  seg->key = 0;
}

bool registrable(const mrc_seg *seg) {
  return seg != nullptr && seg->map != nullptr && seg->map->header != nullptr &&
         seg->map->data_size != 0;
}

// Why the cache's get failed: the cause its backend recorded in this thread's last error (the
// calls here clear it first), which the segment's own message must keep.
const char *get_failure_cause() noexcept {
  const char *cause = mrc_last_error();
  return cause[0] != '\0' ? cause : "no cause recorded";
}

// The current key. REQUIRES: registration_mu held, seg registered.
mrc_status_t current_key_locked(mrc_seg *seg, uint64_t *key) {
  mrc_region_t *now = nullptr;
  const mrc_status_t st = mrc_get(seg->cache, seg->map->data, seg->map->data_size, kProt, &now);
  if (st != MRC_OK) {
    return fail(st, "re-registering the segment: {} ({})", mrc_status_string(st),
                get_failure_cause());
  }
  if (now != seg->region) {
    mrc_put(seg->cache, seg->region);
    seg->region = now;
    seg->key = mrc_region_key(now);
  } else {
    mrc_put(seg->cache, now);
  }
  *key = seg->key;
  return MRC_OK;
}

}  // namespace

extern "C" {

mrc_status_t mrc_seg_register(mrc_seg_t *seg, mrc_cache_t *cache, mrc_region_t **region) {
  mrc::seg::clear_error();
  if (cache == nullptr || region == nullptr) return fail(MRC_ERR_INVALID, "cache or region NULL");
  if (!registrable(seg)) return fail(MRC_ERR_INVALID, "segment has no memory to register");
  pthread_mutex_lock(&seg->registration_mu);
  mrc_status_t st = MRC_OK;
  if (seg->cache != nullptr && seg->cache != cache) {
    st = fail(MRC_ERR_BUSY, "segment already registered through another cache");
  } else if (seg->region == nullptr) {
    mrc_region_t *own = nullptr;
    st = mrc_get(cache, seg->map->data, seg->map->data_size, kProt, &own);
    if (st == MRC_OK) {
      seg->cache = cache;
      seg->region = own;
      seg->key = mrc_region_key(own);
      seg->release_registration = release;
    } else {
      (void)fail(st, "registering the segment: {} ({})", mrc_status_string(st),
                 get_failure_cause());
    }
  }
  if (st == MRC_OK) {
    st = mrc_get(cache, seg->map->data, seg->map->data_size, kProt, region);
    if (st == MRC_OK && *region != seg->region) {
      // The segment's own reference went stale meanwhile: follow the cache.
      mrc_put(cache, seg->region);
      seg->region = *region;
      seg->key = mrc_region_key(*region);
      st = mrc_get(cache, seg->map->data, seg->map->data_size, kProt, region);
    }
  }
  pthread_mutex_unlock(&seg->registration_mu);
  return st;
}

mrc_status_t mrc_seg_key(const mrc_seg_t *cseg, const void *addr, size_t len, uint64_t *key) {
  mrc::seg::clear_error();
  auto *seg = const_cast<mrc_seg_t *>(cseg);  // NOLINT: the key cache is not the caller's state
  if (key == nullptr || !registrable(seg)) return fail(MRC_ERR_INVALID, "bad segment or key");
  const auto a = reinterpret_cast<uintptr_t>(addr);
  const auto base = reinterpret_cast<uintptr_t>(seg->map->data);
  if (a < base || len > seg->map->data_size || a - base > seg->map->data_size - len) {
    return fail(MRC_ERR_INVALID, "[{}, +{}) is not inside the segment", addr, len);
  }
  pthread_mutex_lock(&seg->registration_mu);
  const mrc_status_t st = seg->region == nullptr
                              ? fail(MRC_ERR_NOT_FOUND, "segment is not registered")
                              : current_key_locked(seg, key);
  pthread_mutex_unlock(&seg->registration_mu);
  return st;
}

void *mrc_seg_alloc_registered(mrc_seg_t *seg, size_t size, size_t align, uint64_t *key) {
  if (key == nullptr || !registrable(seg)) {
    mrc::seg::set_error("bad segment or key");
    return nullptr;
  }
  pthread_mutex_lock(&seg->registration_mu);
  const bool registered = seg->region != nullptr;
  pthread_mutex_unlock(&seg->registration_mu);
  if (!registered) {
    mrc::seg::set_error("segment is not registered: call mrc_seg_register first");
    return nullptr;
  }
  void *p = mrc_seg_alloc(seg, size, align);
  if (p == nullptr) return nullptr;
  uint64_t k = 0;
  if (mrc_seg_key(seg, p, size == 0 ? 1 : size, &k) != MRC_OK) {
    mrc_seg_free(seg, p);
    return nullptr;
  }
  *key = k;
  return p;
}

}  // extern "C"
