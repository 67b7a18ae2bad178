// SPDX-License-Identifier: BSD-3-Clause
/* mrcache — memory-registration cache driven by userfaultfd.
 *
 * The stable C API that runtimes embed. Every call is thread-safe unless it says otherwise.
 * Errors are mrc_status_t values; no call throws or aborts on bad input: it returns
 * MRC_ERR_INVALID, changes nothing, and says why in mrc_last_error(). No call prints: what the
 * library has to say goes to the log handler (mrc_set_log_handler; only the default handler
 * writes to stderr). A call that returns nothing (mrc_put) reports the misuse it detects through
 * that handler at MRC_LOG_ERROR, and changes nothing.
 *
 * How the ABI grows (docs/DESIGN.md, "C ABI"): a program built against an older mrcache.h keeps
 * running on a newer libmrcache.so.0. Symbols carry versions (MRCACHE_0 = 0.1, MRCACHE_0.2, ...):
 * a function whose arguments changed keeps its old version for old programs. Structs that
 * grow say how large the caller's copy is:
 *   - structs the caller fills (mrc_cache_params_t, mrc_seg_domain_params_t, mrc_seg_params_t)
 *     start with `size_t struct_size`, which the *_init function sets to sizeof; so does a
 *     plugin's ops table (mrc_backend_t), which has no *_init: its author sets
 *     `.struct_size = sizeof(mrc_backend_t)`;
 *   - structs the library fills (mrc_stats_t, mrc_monitor_info_t) are passed with their size
 *     (mrc_cache_stats_sized, mrc_monitor_info_sized; mrc_cache_stats and mrc_monitor_info are
 *     inline wrappers that pass sizeof).
 * The rule for a size: below the struct's first sized version (MRC_*_SIZE_*), MRC_ERR_INVALID
 * and nothing changed. Smaller than the library's struct: only the fields that fit are read or
 * written (fields a caller's older struct lacks take their defaults). Larger than the library's
 * struct: an output struct's unknown tail is zeroed; an input struct is refused with
 * MRC_ERR_INVALID unless its unknown tail is all zero (a field this library does not know must
 * not be silently ignored). A struct_size or an output size above 4096 is refused as
 * uninitialised.
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
#define MRC_VERSION_MINOR 3
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
 * MRC_FLAG_ORDERED_UNMAPS (MRC_ORDERED_UNMAPS=1), "fast mode", skips that ioctl on hits (a get
 * that misses still makes it before it registers). Its gets are exact only for unmaps that
 * happen-before the get: the unmapping thread returned from munmap before the getting thread
 * started its get, and the two synchronised (a lock, a join, a message). That holds in
 * processes where no thread maps memory while another unmaps it; where it does not hold, a get
 * that hits while another thread's unmap of the address is still in flight may return the
 * previous owner's registration for new memory at the same address, which a NIC then reads and
 * writes.
 *
 * MRC_FLAG_PURGE_ON_FORK (MRC_PURGE_ON_FORK=1): deregister every unused region before fork
 * (except while a reg of this cache runs: it holds the lock a purge needs). The deregistrations
 * run in the fork's prepare handler, on the forking thread; they may call any mrc_* function.
 * MRC_FLAG_VERIFY_PFN (MRC_VERIFY_PFN=N): check N page frames per hit against the registration.
 *
 * By default a cache learns which ranges churn: when two registrations in a row of a range (by
 * its first page) ended by an unmap or madvise before caching them paid (the registrations and
 * deregistrations their reuses saved cost less than watching the mapping and the unmap's wait
 * for the monitor; a registration never used again never pays), later misses there register
 * uncached (deregistered at the last put, the mapping not watched), so that the application's
 * munmap of such memory does not wait for the monitor; one miss in 16 (then fewer, down to one
 * in 1024 while they keep churning) is cached anyway, and caching is back once one of those
 * pays. Exactness does not depend on it. MRC_FLAG_CACHE_CHURN (MRC_CACHE_CHURN=1) caches every
 * registration instead. */
enum {
  MRC_FLAG_PURGE_ON_FORK = 1,
  MRC_FLAG_VERIFY_PFN = 2,
  MRC_FLAG_ORDERED_UNMAPS = 4,
  MRC_FLAG_CACHE_CHURN = 8
};

/* A registration engine (see backends/README.md for the full plugin contract).
 *
 * struct_size is sizeof(mrc_backend_t) as the plugin's mrcache.h defines it. A table is usually
 * static and has no *_init function: its author sets the size with designated initialisers,
 *   static const mrc_backend_t my_ops = {.struct_size = sizeof(mrc_backend_t),
 *                                        .name = "mine", .reg = my_reg, .dereg = my_dereg};
 * (or zeroes the table and sets struct_size first). Every call that reads a table
 * (mrc_cache_create through params.backend, mrc_backend_complete) applies the size rule above:
 * struct_size 0, below MRC_BACKEND_SIZE_0_2 or with an unknown non-zero tail is refused with
 * MRC_ERR_INVALID, the reason in mrc_last_error(). A table built against 0.1 headers (no
 * struct_size) works only through the 0.1 symbol versions its program was linked against.
 *
 * name:     for messages; NULL = "plugin".
 * reg:      register [addr, addr+len) for at least `prot`; on success set *handle and *key and
 *           return MRC_OK. May be called from any application thread, concurrently with other
 *           reg/dereg calls of the same backend unless the backend's context says otherwise.
 *           Never called from the monitor thread. It runs under the calling cache's lock: calls
 *           back into that cache which need the lock return MRC_ERR_BUSY instead of deadlocking
 *           (a get that misses, mrc_invalidate, mrc_cache_stats(_json), mrc_cache_purge,
 *           mrc_cache_destroy); a get that hits and mrc_put work (a region a put ends is
 *           deregistered after the lock). Calls on another cache work, but return MRC_ERR_BUSY
 *           when that cache's lock is held at that moment (two regs, each calling the other's
 *           cache, would otherwise wait for each other). reg may fork, create and destroy
 *           caches, also while other threads run regs or fork: the child goes on as any fork
 *           child (its caches forget what they inherited).
 * dereg:    release a handle returned by reg. Runs on any thread except the monitor's, never
 *           under a cache lock: it may call any mrc_* function but mrc_cache_destroy of its own
 *           cache (MRC_ERR_BUSY), and may munmap its own memory.
 * describe: optional (NULL = not supported); writes a human-readable description of the
 *           registration (keys, device) into buf and returns the length snprintf would. */
typedef struct mrc_backend {
  size_t struct_size; /* sizeof(mrc_backend_t): see above */
  const char *name;
  mrc_status_t (*reg)(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                      uint64_t *key);
  void (*dereg)(void *ctx, void *handle);
  int (*describe)(void *ctx, void *handle, char *buf, size_t len);
} mrc_backend_t;
/* The smallest struct_size accepted: the first layout that carried one (0.2). */
#define MRC_BACKEND_SIZE_0_2 \
  (offsetof(mrc_backend_t, describe) + sizeof(int (*)(void *, void *, char *, size_t)))

typedef struct mrc_cache mrc_cache_t;
typedef struct mrc_region mrc_region_t;

typedef struct {
  size_t struct_size;           /* sizeof(mrc_cache_params_t); set by mrc_cache_params_init */
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
                              malformed; mrc_cache_create then returns it. A value that is
                              not an mrc_status_t (a struct not filled by the init function)
                              is refused with MRC_ERR_INVALID. Either way mrc_last_error()
                              says why */
} mrc_cache_params_t;
/* The smallest struct_size accepted: the first layout that carried one (0.2). */
#define MRC_CACHE_PARAMS_SIZE_0_2 (offsetof(mrc_cache_params_t, env_status) + sizeof(mrc_status_t))

typedef struct {
  uint64_t gets, hits_fast, hits_slow, misses, merges, unmap_events, invalidations, puts,
      registrations, deregistrations, evictions, regions, registered_bytes;
  /* additions beyond the contract */
  uint64_t registration_failures, uncacheable, pfn_mismatches, purges, unreleased_bytes;
} mrc_stats_t;
/* The smallest size mrc_cache_stats_sized accepts: the 0.1 layout. */
#define MRC_STATS_SIZE_0_1 (offsetof(mrc_stats_t, unreleased_bytes) + sizeof(uint64_t))

/* struct_size, the defaults, then the MRC_* environment variables. */
MRC_API void mrc_cache_params_init(mrc_cache_params_t *params);
/* Like mrc_cache_params_init, but reports malformed MRC_* variables instead of ignoring them:
 * MRC_ERR_INVALID, and every malformed one named with its value ("MRC_MONITOR=x is not a mode
 * (...); MRC_STATS=y is not a boolean (...)") in errbuf (may be NULL) and in mrc_last_error().
 * Checked: the cache parameters (MRC_MAX_REGIONS, MRC_MAX_BYTES, MRC_MAX_UNRELEASED,
 * MRC_PURGE_ON_FORK, MRC_ORDERED_UNMAPS, MRC_VERIFY_PFN) and the variables a cache obeys
 * otherwise (MRC_MONITOR, MRC_LOG_LEVEL, MRC_STATS). mrc_cache_params_init logs the same text at
 * MRC_LOG_ERROR and sets env_status, so that mrc_cache_create refuses the params. */
MRC_API mrc_status_t mrc_cache_params_init_checked(mrc_cache_params_t *params, char *errbuf,
                                                   size_t errlen);
/* MRC_ERR_INVALID for a struct_size outside the rule at the top of this file. */
MRC_API mrc_status_t mrc_cache_create(const mrc_cache_params_t *params, mrc_cache_t **out);
/* Deregisters everything registered and frees the cache. MRC_ERR_BUSY, and nothing changed,
 * while the application still holds a region of this cache (a reference from mrc_get not yet
 * put, a registered segment not yet closed: mrc_seg_register) and when called from inside one of
 * this cache's callbacks (its backend's reg or dereg, an invalidate callback); MRC_ERR_INVALID
 * for NULL. A program built against 0.1 calls the 0.1 version (void): it deregisters regions
 * still held anyway (they become invalid: they are not used again), and from inside a callback
 * it logs an error and leaves the cache alone. */
MRC_API mrc_status_t mrc_cache_destroy(mrc_cache_t *cache);

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
 * out, and a registration merged with the regions it overlaps is rounded out to the alignment.
 * (Regions that merely touch stay apart.) */
MRC_API mrc_status_t mrc_get_aligned(mrc_cache_t *cache, void *addr, size_t len, size_t alignment,
                                     unsigned prot, mrc_region_t **out);
/* Drops the reference a get returned. A put the cache can tell is wrong changes nothing and is
 * reported at MRC_LOG_ERROR through the log handler: a region of another cache, or a reference
 * not held (a second put of one reference, detected when it would drop the cache's own
 * reference to a cached region, or when the region has none left). NULL cache or region: no-op.
 * A put of a reference not held is still a bug of the caller: it is detected when it would break
 * the cache, not always (it may take another holder's reference instead, who is then refused). */
MRC_API void mrc_put(mrc_cache_t *cache, mrc_region_t *region);
/* Drop `region` from the cache now; done(arg) runs once after its deregistration (after the
 * last mrc_put when it is in use). The caller's reference, if any, stays the caller's.
 * done runs on the thread of that last put (or of the get, purge or destroy that ended the
 * region), never under a cache lock: it may call any mrc_* function, except mrc_cache_destroy of
 * this cache (MRC_ERR_BUSY). A region whose last reference is gone (inside its own done, say) is
 * refused with MRC_ERR_INVALID; a callback that mrc_cache_destroy runs cannot get a new region
 * of the cache being destroyed (MRC_ERR_BUSY). */
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
MRC_API mrc_status_t mrc_cache_stats_sized(mrc_cache_t *cache, mrc_stats_t *stats, size_t size);
/* An inline wrapper, so that the size compiled into the program is the one passed. */
static inline mrc_status_t mrc_cache_stats(mrc_cache_t *cache, mrc_stats_t *stats) {
  return mrc_cache_stats_sized(cache, stats, sizeof *stats);
}
/* Deregisters every cached region not in use; regions in use leave the cache and are
 * deregistered at their last mrc_put. */
MRC_API mrc_status_t mrc_cache_purge(mrc_cache_t *cache);
/* The statistics and the size histogram as one JSON object; returns the length snprintf
 * would (so a second call with a larger buffer gets all of it), or a negative status. */
MRC_API int mrc_cache_stats_json(mrc_cache_t *cache, char *buf, size_t len);

MRC_API const char *mrc_status_string(mrc_status_t status);
MRC_API const char *mrc_version(void);
/* Why the calling thread's last failed call failed: one text for the whole library, written by
 * the backends ("<backend>: <cause>", also a plugin's mrc_backend_set_error), by the mrc_seg_*
 * calls, and by every cache call that refuses its arguments ("mrc_get: the length is 0"), its
 * params (mrc_cache_create, mrc_cache_params_init_checked) or a plugin's result (backends.h).
 * Meaningful right after a call returned an error. Never NULL ("" when nothing failed on
 * this thread); the text is the calling thread's own. A backend's success does not clear it; the
 * mrc_seg_* calls that return a status clear it when they start. mrc_backend_last_error() and
 * mrc_seg_last_error() are older names for this function (they return the same text). */
MRC_API const char *mrc_last_error(void);

/* Logging: levels as in MRC_LOG_LEVEL (error, warn, info, debug, trace). The callback runs on
 * the thread that logs (never the monitor thread), never under a cache lock and never while the
 * call that logged still uses its cache: a message logged during a cache call is handed over at
 * the end of that call, before it returns (up to 8 per call, each cut to 255 bytes; one more line
 * counts those dropped). So it may call any mrc_* function, mrc_cache_destroy of the cache whose
 * call logged included, or fork; what its calls leave in mrc_last_error() is undone, so the
 * caller reads its own call's reason. NULL restores the default (stderr). */
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
  MRC_MONITOR_UNCACHED = 3, /* no userfaultfd: register on get, deregister on last put (also
                               always under valgrind, which runs one thread at a time: an unmap
                               would wait forever for the monitor thread) */
  MRC_MONITOR_BPF = 4       /* eBPF programs report every change of the address space
                               into a ring the get checks with plain loads: no watch, no probe;
                               only when MRC_MONITOR=bpf asks and the kernel allows it */
} mrc_monitor_mode_t;

typedef struct {
  mrc_monitor_mode_t mode;
  const char *mode_name;  /* "wp-async", "wp", "missing", "uncached", "bpf" */
  char reason[256];       /* why this mode (and what a better one would need) */
  uint64_t features;      /* UFFD_FEATURE_* granted by the kernel */
  int running;            /* the monitor thread is up */
  uint64_t events;        /* events read since start */
  uint64_t watched_bytes; /* bytes registered with the userfaultfd (idle mappings included) */
  uint64_t vmas_added;    /* upper bound of VMAs watching adds (2 per registered mapping: the
                             neighbours it keeps from merging) */
  uint64_t vma_budget;    /* ceiling for vmas_added, from vm.max_map_count */
} mrc_monitor_info_t;
/* The smallest size mrc_monitor_info_sized accepts: the 0.1 layout. */
#define MRC_MONITOR_INFO_SIZE_0_1 (offsetof(mrc_monitor_info_t, vma_budget) + sizeof(uint64_t))

MRC_API mrc_status_t mrc_monitor_info_sized(mrc_monitor_info_t *info, size_t size);
static inline mrc_status_t mrc_monitor_info(mrc_monitor_info_t *info) {
  return mrc_monitor_info_sized(info, sizeof *info);
}

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
