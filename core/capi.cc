// The C API: argument checks and translation to the C++ core. Nothing here throws.
#include <cstring>

#include "core/cache.h"
#include "core/config.h"
#include "core/log.h"
#include "mrcache/mrcache.h"

struct mrc_cache {};  // opaque to C; the object behind it is an mrc::Cache

namespace {

mrc::Cache *to_cache(mrc_cache_t *cache) { return reinterpret_cast<mrc::Cache *>(cache); }
mrc::Region *to_region(mrc_region_t *region) { return static_cast<mrc::Region *>(region); }
const mrc::Region *to_region(const mrc_region_t *region) {
  return static_cast<const mrc::Region *>(region);
}

void params_defaults(mrc_cache_params_t *params) {
  std::memset(params, 0, sizeof *params);
  params->name = "mrcache";
  params->backend = mrc_backend_null();
}

}  // namespace

extern "C" {

mrc_status_t mrc_cache_params_init_checked(mrc_cache_params_t *params, char *errbuf,
                                           size_t errlen) {
  if (params == nullptr) return MRC_ERR_INVALID;
  if (errbuf != nullptr && errlen != 0) errbuf[0] = '\0';
  params_defaults(params);
  return mrc::config::apply_environment(params, errbuf, errlen);
}

void mrc_cache_params_init(mrc_cache_params_t *params) {
  if (params == nullptr) return;
  char error[256];
  if (mrc_cache_params_init_checked(params, error, sizeof error) != MRC_OK) {
    MRC_LOG_ERROR("{}; mrc_cache_create will refuse these parameters", error);
    params->env_status = MRC_ERR_INVALID;
  }
}

mrc_status_t mrc_cache_create(const mrc_cache_params_t *params, mrc_cache_t **out) {
  if (params == nullptr || out == nullptr) return MRC_ERR_INVALID;
  if (params->env_status != MRC_OK) return params->env_status;
  mrc::Cache *cache = nullptr;
  mrc_status_t status = mrc::Cache::create(*params, &cache);
  if (status == MRC_OK) *out = reinterpret_cast<mrc_cache_t *>(cache);
  return status;
}

void mrc_cache_destroy(mrc_cache_t *cache) { mrc::Cache::destroy(to_cache(cache)); }

mrc_status_t mrc_get(mrc_cache_t *cache, void *addr, size_t len, unsigned prot,
                     mrc_region_t **out) {
  return mrc_get_aligned(cache, addr, len, 0, prot, out);
}

mrc_status_t mrc_get_aligned(mrc_cache_t *cache, void *addr, size_t len, size_t alignment,
                             unsigned prot, mrc_region_t **out) {
  if (cache == nullptr || addr == nullptr || out == nullptr) return MRC_ERR_INVALID;
  mrc::Region *region = nullptr;
  mrc_status_t status =
      to_cache(cache)->get(reinterpret_cast<uintptr_t>(addr), len, alignment, prot, &region);
  if (status == MRC_OK) *out = region;
  return status;
}

void mrc_put(mrc_cache_t *cache, mrc_region_t *region) {
  if (cache == nullptr || region == nullptr) return;
  to_cache(cache)->put(to_region(region));
}

mrc_status_t mrc_invalidate(mrc_cache_t *cache, mrc_region_t *region, void (*done)(void *),
                            void *arg) {
  if (cache == nullptr || region == nullptr) return MRC_ERR_INVALID;
  return to_cache(cache)->invalidate(to_region(region), done, arg);
}

void *mrc_region_start(const mrc_region_t *region) {
  return region != nullptr ? reinterpret_cast<void *>(to_region(region)->start) : nullptr;
}
size_t mrc_region_length(const mrc_region_t *region) {
  return region != nullptr ? to_region(region)->length() : 0;
}
uint64_t mrc_region_key(const mrc_region_t *region) {
  return region != nullptr ? to_region(region)->key : 0;
}
void *mrc_region_handle(const mrc_region_t *region) {
  return region != nullptr ? to_region(region)->handle : nullptr;
}
unsigned mrc_region_prot(const mrc_region_t *region) {
  return region != nullptr ? to_region(region)->prot : 0;
}

mrc_status_t mrc_cache_stats(mrc_cache_t *cache, mrc_stats_t *stats) {
  if (cache == nullptr || stats == nullptr) return MRC_ERR_INVALID;
  to_cache(cache)->stats(stats);
  return MRC_OK;
}

int mrc_cache_stats_json(mrc_cache_t *cache, char *buf, size_t len) {
  if (cache == nullptr || (buf == nullptr && len != 0)) return MRC_ERR_INVALID;
  return to_cache(cache)->stats_json(buf, len);
}

mrc_status_t mrc_cache_purge(mrc_cache_t *cache) {
  if (cache == nullptr) return MRC_ERR_INVALID;
  to_cache(cache)->purge(true);
  return MRC_OK;
}

}  // extern "C"
