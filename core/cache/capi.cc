// SPDX-License-Identifier: BSD-3-Clause
// The C API: argument checks and translation to the C++ core. Nothing here throws.
//
// Functions whose structs changed exist twice (docs/DESIGN.md, "C ABI"): *_v0 takes the 0.1
// layout and is bound by .symver to name@MRCACHE_0, which programs built against 0.1 reference;
// *_v2 is name@@MRCACHE_0.2, the default that new builds (and the static library) bind to.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "backends/backend_v0.h"
#include "backends/backends.h"
#include "base/error.h"
#include "base/sized.h"
#include "core/cache/cache.h"
#include "core/cache/config.h"
#include "core/cache/log.h"
#include "mrcache/mrcache.h"

#define MRC_SYMVER(impl, name, node) __asm__(".symver " #impl ", " #name node)

struct mrc_cache {};  // opaque to C; the object behind it is an mrc::Cache

// mrc_cache_params_t as 0.1 binaries lay it out: frozen, never edit. Its backend is a 0.1 table
// too (backends/backend_v0.h).
struct CacheParamsV0 {
  const char *name;
  const mrc::backends::BackendOpsV0 *backend;
  void *backend_ctx;
  size_t max_regions, max_bytes, max_unreleased;
  unsigned flags;
  size_t verify_pfn_pages, alignment;
  mrc_status_t env_status;
};

namespace {

// A refused call: MRC_ERR_INVALID with the reason, "<call>: <what>", in mrc_last_error()
// (docs/DESIGN.md, "The C API contract"). Cold: only error branches call it.
[[gnu::cold, gnu::noinline]] __attribute__((format(printf, 1, 2))) mrc_status_t invalid(
    const char *format, ...) noexcept {
  va_list args;
  va_start(args, format);
  mrc::set_last_error_v(format, args);
  va_end(args);
  return MRC_ERR_INVALID;
}

mrc::Cache *to_cache(mrc_cache_t *cache) { return reinterpret_cast<mrc::Cache *>(cache); }
mrc::Region *to_region(mrc_region_t *region) { return static_cast<mrc::Region *>(region); }
const mrc::Region *to_region(const mrc_region_t *region) {
  return static_cast<const mrc::Region *>(region);
}

void params_defaults(mrc_cache_params_t *params) {
  std::memset(params, 0, sizeof *params);
  params->struct_size = sizeof *params;
  params->name = "mrcache";
  params->backend = mrc_backend_null();
}

// What the init functions wrote, for a 0.1 program. Their only backend is the default, the null
// backend's table, which a 0.1 program knows as mrc_backend_null@MRCACHE_0's (its 0.1 layout).
void params_to_v0(const mrc_cache_params_t &in, CacheParamsV0 *out) {
  *out = CacheParamsV0{in.name,      mrc_backend_null_v0(), in.backend_ctx, in.max_regions,
                       in.max_bytes, in.max_unreleased,     in.flags,       in.verify_pfn_pages,
                       in.alignment, in.env_status};
}

// A 0.1 program's params, in the sized layout. Its backend table (0.1 layout) is translated into
// *backend, which must outlive the use of the result; Cache::create copies the table, so the
// caller's stack is enough.
mrc_cache_params_t params_from_v0(const CacheParamsV0 &in, mrc_backend_t *backend) {
  mrc_cache_params_t out;
  params_defaults(&out);
  out.name = in.name;
  out.backend = nullptr;  // NULL = mrc_backend_null(), in 0.1 as now
  if (in.backend != nullptr && mrc::backends::is_sized_table(in.backend)) {
    out.backend = reinterpret_cast<const mrc_backend_t *>(in.backend);  // read by its size
  } else if (in.backend != nullptr) {
    *backend = mrc::backends::ops_from_v0(*in.backend);
    out.backend = backend;
  }
  out.backend_ctx = in.backend_ctx;
  out.max_regions = in.max_regions;
  out.max_bytes = in.max_bytes;
  out.max_unreleased = in.max_unreleased;
  out.flags = in.flags;
  out.verify_pfn_pages = in.verify_pfn_pages;
  out.alignment = in.alignment;
  std::memcpy(&out.env_status, &in.env_status, sizeof out.env_status);  // any value: see create
  return out;
}

mrc_status_t create(const mrc_cache_params_t &params, mrc_cache_t **out) {
  // Read as an int: an uninitialised struct may hold any value, and loading one outside the
  // enumeration as an mrc_status_t is undefined.
  int env_status = 0;
  std::memcpy(&env_status, &params.env_status, sizeof env_status);
  if (env_status != MRC_OK) {
    if (!mrc::backends::is_status(env_status)) {
      mrc::set_last_error(
          "mrc_cache_create: env_status %d is not an mrc_status_t (fill the params with "
          "mrc_cache_params_init)",
          env_status);
      return MRC_ERR_INVALID;
    }
    mrc::set_last_error(
        "mrc_cache_create: env_status is %s: mrc_cache_params_init found a malformed MRC_* "
        "variable (mrc_cache_params_init_checked names it)",
        mrc_status_string(static_cast<mrc_status_t>(env_status)));
    return static_cast<mrc_status_t>(env_status);
  }
  mrc::Cache *cache = nullptr;
  mrc_status_t status = mrc::Cache::create(params, &cache);
  if (status == MRC_OK) *out = reinterpret_cast<mrc_cache_t *>(cache);
  return status;
}

}  // namespace

extern "C" {

// Exported (default visibility) so that .symver can bind them; the version map's `local: *`
// hides the *_v0 and *_v2 names themselves.
MRC_API mrc_status_t mrc_cache_params_init_checked_v2(mrc_cache_params_t *params, char *errbuf,
                                                      size_t errlen);
MRC_API void mrc_cache_params_init_v2(mrc_cache_params_t *params);
MRC_API mrc_status_t mrc_cache_create_v2(const mrc_cache_params_t *params, mrc_cache_t **out);
MRC_API mrc_status_t mrc_cache_params_init_checked_v0(CacheParamsV0 *params, char *errbuf,
                                                      size_t errlen);
MRC_API void mrc_cache_params_init_v0(CacheParamsV0 *params);
MRC_API mrc_status_t mrc_cache_create_v0(const CacheParamsV0 *params, mrc_cache_t **out);
MRC_API mrc_status_t mrc_cache_stats_v0(mrc_cache_t *cache, mrc_stats_t *stats);
MRC_API mrc_status_t mrc_cache_destroy_v2(mrc_cache_t *cache);
MRC_API void mrc_cache_destroy_v0(mrc_cache_t *cache);

MRC_SYMVER(mrc_cache_params_init_checked_v2, mrc_cache_params_init_checked, "@@MRCACHE_0.2");
MRC_SYMVER(mrc_cache_params_init_v2, mrc_cache_params_init, "@@MRCACHE_0.2");
MRC_SYMVER(mrc_cache_create_v2, mrc_cache_create, "@@MRCACHE_0.2");
MRC_SYMVER(mrc_cache_params_init_checked_v0, mrc_cache_params_init_checked, "@MRCACHE_0");
MRC_SYMVER(mrc_cache_params_init_v0, mrc_cache_params_init, "@MRCACHE_0");
MRC_SYMVER(mrc_cache_create_v0, mrc_cache_create, "@MRCACHE_0");
MRC_SYMVER(mrc_cache_stats_v0, mrc_cache_stats, "@MRCACHE_0");
MRC_SYMVER(mrc_cache_destroy_v2, mrc_cache_destroy, "@@MRCACHE_0.2");
MRC_SYMVER(mrc_cache_destroy_v0, mrc_cache_destroy, "@MRCACHE_0");

mrc_status_t mrc_cache_params_init_checked_v2(mrc_cache_params_t *params, char *errbuf,
                                              size_t errlen) {
  if (params == nullptr) return invalid("mrc_cache_params_init_checked: params is NULL");
  if (errbuf != nullptr && errlen != 0) errbuf[0] = '\0';
  params_defaults(params);
  char text[mrc::kLastErrorSize];
  const mrc_status_t status = mrc::config::apply_environment(params, text, sizeof text);
  if (status != MRC_OK) {
    if (errbuf != nullptr && errlen != 0) std::snprintf(errbuf, errlen, "%s", text);
    mrc::set_last_error("%s", text);
  }
  return status;
}

void mrc_cache_params_init_v2(mrc_cache_params_t *params) {
  if (params == nullptr) return;
  char error[mrc::kLastErrorSize];
  if (mrc_cache_params_init_checked_v2(params, error, sizeof error) != MRC_OK) {
    MRC_LOG_ERROR("{}; mrc_cache_create will refuse these parameters", error);
    params->env_status = MRC_ERR_INVALID;
  }
}

mrc_status_t mrc_cache_create_v2(const mrc_cache_params_t *params, mrc_cache_t **out) {
  if (params == nullptr || out == nullptr) {
    return invalid("mrc_cache_create: %s is NULL", params == nullptr ? "params" : "out");
  }
  // Fields past the caller's struct_size keep the defaults, so the copy starts from them.
  mrc_cache_params_t known;
  params_defaults(&known);
  if (!mrc::sized_input_copy(&known, sizeof known, params, params->struct_size,
                             MRC_CACHE_PARAMS_SIZE_0_2)) {
    mrc::set_last_error(
        "mrc_cache_create: struct_size %zu is not a mrc_cache_params_t this library can read "
        "(set it with mrc_cache_params_init)",
        params->struct_size);
    return MRC_ERR_INVALID;
  }
  known.struct_size = sizeof known;
  return create(known, out);
}

mrc_status_t mrc_cache_params_init_checked_v0(CacheParamsV0 *params, char *errbuf, size_t errlen) {
  if (params == nullptr) return invalid("mrc_cache_params_init_checked: params is NULL");
  mrc_cache_params_t current;
  mrc_status_t status = mrc_cache_params_init_checked_v2(&current, errbuf, errlen);
  params_to_v0(current, params);
  return status;
}

void mrc_cache_params_init_v0(CacheParamsV0 *params) {
  if (params == nullptr) return;
  mrc_cache_params_t current;
  mrc_cache_params_init_v2(&current);
  params_to_v0(current, params);
}

mrc_status_t mrc_cache_create_v0(const CacheParamsV0 *params, mrc_cache_t **out) {
  if (params == nullptr || out == nullptr) {
    return invalid("mrc_cache_create: %s is NULL", params == nullptr ? "params" : "out");
  }
  mrc_backend_t backend{};
  return create(params_from_v0(*params, &backend), out);
}

// 0.2: refused (MRC_ERR_BUSY, nothing changed) while the application holds a region, or from
// inside one of the cache's callbacks.
mrc_status_t mrc_cache_destroy_v2(mrc_cache_t *cache) {
  if (cache == nullptr) return invalid("mrc_cache_destroy: cache is NULL");
  return mrc::Cache::destroy(to_cache(cache), /*refuse_held=*/true);
}

// 0.1 returned nothing: regions still held are deregistered anyway (they become invalid). From
// inside one of the cache's callbacks, where destroying would recurse or deadlock, it logs an
// error and leaves the cache alone.
void mrc_cache_destroy_v0(mrc_cache_t *cache) {
  if (cache == nullptr) return;
  if (mrc::Cache::destroy(to_cache(cache), /*refuse_held=*/false) != MRC_OK) {
    MRC_LOG_ERROR(
        "cache {}: mrc_cache_destroy called from inside one of the cache's callbacks; the cache "
        "was not destroyed",
        to_cache(cache)->name());
  }
}

mrc_status_t mrc_get(mrc_cache_t *cache, void *addr, size_t len, unsigned prot,
                     mrc_region_t **out) {
  return mrc_get_aligned(cache, addr, len, 0, prot, out);
}

mrc_status_t mrc_get_aligned(mrc_cache_t *cache, void *addr, size_t len, size_t alignment,
                             unsigned prot, mrc_region_t **out) {
  if (cache == nullptr || addr == nullptr || out == nullptr) {
    return invalid("mrc_get: %s is NULL",
                   cache == nullptr ? "cache" : (addr == nullptr ? "addr" : "out"));
  }
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
  if (cache == nullptr || region == nullptr) {
    return invalid("mrc_invalidate: %s is NULL", cache == nullptr ? "cache" : "region");
  }
  const mrc_status_t status = to_cache(cache)->invalidate(to_region(region), done, arg);
  if (status == MRC_ERR_INVALID) {
    return invalid(
        "mrc_invalidate: the region is not one of cache %s's regions, or it is a "
        "remembered registration failure",
        to_cache(cache)->name());
  }
  return status;
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

mrc_status_t mrc_cache_stats_sized(mrc_cache_t *cache, mrc_stats_t *stats, size_t size) {
  if (cache == nullptr || stats == nullptr) {
    return invalid("mrc_cache_stats: %s is NULL", cache == nullptr ? "cache" : "stats");
  }
  if (!mrc::sized_output_fits(size, MRC_STATS_SIZE_0_1)) {
    return invalid(
        "mrc_cache_stats: size %zu is not a mrc_stats_t (at least the 0.1 layout's %zu, "
        "at most %zu)",
        size, static_cast<size_t>(MRC_STATS_SIZE_0_1), mrc::kMaxStructSize);
  }
  mrc_stats_t all{};
  if (const mrc_status_t status = to_cache(cache)->stats(&all); status != MRC_OK) return status;
  mrc::sized_output_copy(stats, size, &all, sizeof all);
  return MRC_OK;
}

// 0.1 programs pass the 0.1 mrc_stats_t, which every later layout extends.
mrc_status_t mrc_cache_stats_v0(mrc_cache_t *cache, mrc_stats_t *stats) {
  return mrc_cache_stats_sized(cache, stats, MRC_STATS_SIZE_0_1);
}

int mrc_cache_stats_json(mrc_cache_t *cache, char *buf, size_t len) {
  if (cache == nullptr || (buf == nullptr && len != 0)) {
    return invalid("mrc_cache_stats_json: %s",
                   cache == nullptr ? "cache is NULL" : "buf is NULL with a length");
  }
  return to_cache(cache)->stats_json(buf, len);
}

mrc_status_t mrc_cache_purge(mrc_cache_t *cache) {
  if (cache == nullptr) return invalid("mrc_cache_purge: cache is NULL");
  return to_cache(cache)->purge(true);
}

}  // extern "C"
