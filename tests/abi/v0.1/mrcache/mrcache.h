// SPDX-License-Identifier: BSD-3-Clause
/* mrcache — memory-registration cache driven by userfaultfd.
 *
 * The stable C API that runtimes embed. Every call is thread-safe unless it says otherwise.
 * Errors are mrc_status_t values; no call throws, aborts or prints on bad input: it returns
 * MRC_ERR_INVALID and changes nothing.
 */
#ifndef MRCACHE_MRCACHE_H
#define MRCACHE_MRCACHE_H

#include <stddef.h>
#include <stdint.h>

#if defined(MRC_BUILDING_LIBRARY)
#define MRC_API __attribute__((visibility("default")))
#else
#define MRC_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MRC_VERSION_MAJOR 0
#define MRC_VERSION_MINOR 1
#define MRC_VERSION_PATCH 0

typedef enum {
  MRC_OK = 0,
  MRC_ERR_INVALID = -1,     /* bad argument; nothing changed */
  MRC_ERR_NO_MEMORY = -2,   /* out of memory, table full, RLIMIT_MEMLOCK */
  MRC_ERR_BUSY = -3,        /* in use (a region with references, a locked segment) */
  MRC_ERR_UNSUPPORTED = -4, /* the kernel, the device or the build lacks a feature */
  MRC_ERR_BACKEND = -5,     /* the registration engine failed */
  MRC_ERR_EXISTS = -6,
  MRC_ERR_NOT_FOUND = -7,
  MRC_ERR_IO = -8
} mrc_status_t;

enum { MRC_PROT_READ = 1, MRC_PROT_WRITE = 2 };
/* Cache flags.
 *
 * Every get is exact by default: it never returns a registration of memory that was unmapped
 * (munmap, mremap, MAP_FIXED over it, brk shrink) before the memory at its address was mapped,
 * whichever thread unmapped it and however recently. The kernel may hand a freed address to
 * another thread's mmap before mrcache has read the unmap's event; each get therefore asks the
 *  kernel, with one ioctl (about two getpid calls), whether such an event is still unread, and
 * if so waits for it (a monitor round trip).
 *
 * MRC_FLAG_ORDERED_UNMAPS (MRC_ORDERED_UNMAPS=1), "fast mode", skips that ioctl. Its gets are
 * exact only for unmaps that happen-before the get: the unmapping thread returned from munmap
 * before the getting thread started its get, and the two synchronised (a lock, a join, a
 * message). That holds in processes where no thread maps memory while another unmaps it; where
 * it does not hold, a get may return the previous owner's registration for new memory at the
 * same address, which a NIC then reads and writes.
 *
 * MRC_FLAG_PURGE_ON_FORK (MRC_PURGE_ON_FORK=1): deregister every unused region before fork.
 * MRC_FLAG_VERIFY_PFN (MRC_VERIFY_PFN=N): check N page frames per hit against the registration. */
enum { MRC_FLAG_PURGE_ON_FORK = 1, MRC_FLAG_VERIFY_PFN = 2, MRC_FLAG_ORDERED_UNMAPS = 4 };

/* A registration engine (see backends/README.md for the full plugin contract).
 *
 * reg:      register [addr, addr+len) for at least `prot`; on success set *handle and *key and
 *           return MRC_OK. May be called from any application thread, concurrently with other
 *           reg/dereg calls of the same backend unless the backend's context says otherwise.
 *           Never called from the monitor thread.
 * dereg:    release a handle returned by reg. Runs on any thread except the monitor's; may
 *           munmap its own memory.
 * describe: optional (NULL = not supported); writes a human-readable description of the
 *           registration (keys, device) into buf and returns the length snprintf would. */
typedef struct mrc_backend {
  const char *name;
  mrc_status_t (*reg)(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                      uint64_t *key);
  void (*dereg)(void *ctx, void *handle);
  int (*describe)(void *ctx, void *handle, char *buf, size_t len);
} mrc_backend_t;

typedef struct mrc_cache mrc_cache_t;
typedef struct mrc_region mrc_region_t;

typedef struct {
  const char *name;             /* for logs and statistics; NULL = "mrcache" */
  const mrc_backend_t *backend; /* NULL = mrc_backend_null() */
  void *backend_ctx;
  size_t max_regions;      /* 0 = unlimited */
  size_t max_bytes;        /* 0 = unlimited */
  size_t max_unreleased;   /* bytes invalidated but still in use; 0 = default */
  unsigned flags;          /* MRC_FLAG_* */
  size_t verify_pfn_pages; /* pages checked per hit with MRC_FLAG_VERIFY_PFN; 0 = 1 */
  size_t alignment;        /* registration alignment in bytes (power of two, >= page);
                              0 = the page size */
  mrc_status_t env_status; /* set by mrc_cache_params_init when an MRC_* variable is
                              malformed; mrc_cache_create then refuses the params */
} mrc_cache_params_t;

typedef struct {
  uint64_t gets, hits_fast, hits_slow, misses, merges, unmap_events, invalidations, puts,
      registrations, deregistrations, evictions, regions, registered_bytes;
  /* additions beyond the contract */
  uint64_t registration_failures, uncacheable, pfn_mismatches, purges, unreleased_bytes;
} mrc_stats_t;

/* Defaults, then the MRC_* environment variables. */
MRC_API void mrc_cache_params_init(mrc_cache_params_t *params);
/* Like mrc_cache_params_init, but reports a malformed MRC_* variable instead of ignoring it:
 * MRC_ERR_INVALID, with the variable's name in errbuf. */
MRC_API mrc_status_t mrc_cache_params_init_checked(mrc_cache_params_t *params, char *errbuf,
                                                   size_t errlen);
MRC_API mrc_status_t mrc_cache_create(const mrc_cache_params_t *params, mrc_cache_t **out);
/* Deregisters everything still registered. Regions still referenced become invalid. */
MRC_API void mrc_cache_destroy(mrc_cache_t *cache);

/* A region covering [addr, addr+len) with at least `prot`, one reference held.
 *
 * Failed registrations: a failure that lasts until the memory changes (MRC_ERR_INVALID,
 * MRC_ERR_UNSUPPORTED, MRC_ERR_BACKEND: the backend refuses this memory) is remembered, and gets
 * of the range return it without asking the backend until the memory is unmapped or replaced
 * (only while the monitor watches it). Any other failure is not remembered: after
 * MRC_ERR_NO_MEMORY (RLIMIT_MEMLOCK, a full table), MRC_ERR_BUSY or MRC_ERR_IO the next get asks
 * the backend again. (On MRC_ERR_NO_MEMORY a get has already deregistered the cached regions no
 * one uses and retried once before it returns the failure.) */
MRC_API mrc_status_t mrc_get(mrc_cache_t *cache, void *addr, size_t len, unsigned prot,
                             mrc_region_t **out);
/* The same, with the registration aligned to `alignment` (a power of two >= the page size; 0 =
 * the cache's alignment): what a transport needs when its hardware wants aligned regions. Both
 * ends of the region are multiples of it: a cached region that is not aligned so is not handed
 * out, and a registration merged with its neighbours is rounded out to the alignment. */
MRC_API mrc_status_t mrc_get_aligned(mrc_cache_t *cache, void *addr, size_t len, size_t alignment,
                                     unsigned prot, mrc_region_t **out);
MRC_API void mrc_put(mrc_cache_t *cache, mrc_region_t *region);
/* Drop `region` from the cache now; done(arg) runs once after its deregistration (after the
 * last mrc_put when it is in use). The caller's reference, if any, stays the caller's. */
MRC_API mrc_status_t mrc_invalidate(mrc_cache_t *cache, mrc_region_t *region, void (*done)(void *),
                                    void *arg);

MRC_API void *mrc_region_start(const mrc_region_t *region);
MRC_API size_t mrc_region_length(const mrc_region_t *region);
MRC_API uint64_t mrc_region_key(const mrc_region_t *region);
MRC_API void *mrc_region_handle(const mrc_region_t *region);
MRC_API unsigned mrc_region_prot(const mrc_region_t *region);

/* The figures as of the call: invalidations the monitor has published (every unmap that returned
 * before the call) are applied first, so unmap_events (the monitor's records this cache applied),
 * invalidations, regions and the deregistrations they cause already count them. */
MRC_API mrc_status_t mrc_cache_stats(mrc_cache_t *cache, mrc_stats_t *stats);
/* Deregisters every cached region not in use; regions in use leave the cache and are
 * deregistered at their last mrc_put. */
MRC_API mrc_status_t mrc_cache_purge(mrc_cache_t *cache);
/* The statistics and the size histogram as one JSON object; returns the length snprintf
 * would (so a second call with a larger buffer gets all of it), or a negative status. */
MRC_API int mrc_cache_stats_json(mrc_cache_t *cache, char *buf, size_t len);

MRC_API const char *mrc_status_string(mrc_status_t status);
MRC_API const char *mrc_version(void);

/* Logging: levels as in MRC_LOG_LEVEL (error, warn, info, debug, trace). The callback runs on
 * the thread that logs (never the monitor thread); NULL restores the default (stderr). */
typedef enum {
  MRC_LOG_ERROR = 0,
  MRC_LOG_WARN = 1,
  MRC_LOG_INFO = 2,
  MRC_LOG_DEBUG = 3,
  MRC_LOG_TRACE = 4
} mrc_log_level_t;
typedef void (*mrc_log_fn)(void *arg, mrc_log_level_t level, const char *message);
MRC_API void mrc_set_log_handler(mrc_log_fn fn, void *arg);
MRC_API void mrc_set_log_level(mrc_log_level_t level);

/* ---- the monitor ------------------------------------------------------------------------ */
typedef enum {
  MRC_MONITOR_WP_ASYNC = 0, /* WP-only with UFFD_FEATURE_WP_ASYNC: any VMA, no faults */
  MRC_MONITOR_WP = 1,       /* WP-only: anonymous, shmem, hugetlbfs */
  MRC_MONITOR_MISSING = 2,  /* MISSING mode, every fault resolved by the monitor */
  MRC_MONITOR_UNCACHED = 3  /* no userfaultfd: register on get, deregister on last put */
} mrc_monitor_mode_t;

typedef struct {
  mrc_monitor_mode_t mode;
  const char *mode_name;  /* "wp-async", "wp", "missing", "uncached" */
  char reason[256];       /* why this mode (and what a better one would need) */
  uint64_t features;      /* UFFD_FEATURE_* granted by the kernel */
  int running;            /* the monitor thread is up */
  uint64_t events;        /* events read since start */
  uint64_t watched_bytes; /* bytes registered with the userfaultfd (idle mappings included) */
  uint64_t vmas_added;    /* upper bound of VMAs watching adds (2 per registered mapping: the
                             neighbours it keeps from merging; MISSING mode: its splits) */
  uint64_t vma_budget;    /* ceiling for vmas_added, from vm.max_map_count */
} mrc_monitor_info_t;

MRC_API mrc_status_t mrc_monitor_info(mrc_monitor_info_t *info);

/* ---- built-in backends ------------------------------------------------------------------ */

/* null: registers nothing; key = a registration serial number never reused in the process.
 * backend_ctx may be NULL, or a context from mrc_null_ctx_create for counting and faults. */
MRC_API const mrc_backend_t *mrc_backend_null(void);

#ifdef __cplusplus
}
#endif

#include "mrcache/backends.h" /* NOLINT(llvm-include-order): needs the types above */
#include "mrcache/segment.h"

#endif /* MRCACHE_MRCACHE_H */
