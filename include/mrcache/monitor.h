// SPDX-License-Identifier: BSD-3-Clause
/* mrcache/monitor.h — mrcache's exact memory monitor, for a runtime that keeps its own cache.
 *
 * A runtime with a registration cache of its own (libfabric's MR cache, Open MPI's grdma, a
 * storage engine) needs to learn when memory it registered goes away, and to know on a hit that
 * it has not gone yet. This is the monitor behind mrc_cache_t, on its own: the same process-wide
 * userfaultfd monitor (no malloc hook, raw system calls included), shared with every cache.
 *
 * The rules (docs/DESIGN.md, "The public monitor"):
 *  1. mrc_monitor_subscribe(m, addr, len) before registering [addr, addr+len): from then on an
 *     unmap, a moving or shrinking mremap, or madvise(DONTNEED/FREE/REMOVE) of any part of it is
 *     delivered. Subscriptions are counted per exact range; unsubscribe with the same range.
 *  2. Delivery: notify(arg, addr, len) with the range that went away, once per change that
 *     overlaps a subscription of this monitor, on a thread that may block and take the runtime's
 *     locks: the monitor's own delivery thread (MRC_MONITOR_DELIVERY_THREAD), or the thread that
 *     calls mrc_monitor_deliver(). Never on the thread that reads the kernel's events, never
 *     inside another mrc_monitor_* call. Records lost to an overflow, and a fork, are delivered
 *     as the whole address space: addr NULL, len SIZE_MAX.
 *  3. mrc_monitor_valid(m, addr, len) on every hit, from any thread, holding any lock: 1 only if
 *     no change of watched memory is in flight in the kernel and no change that overlaps the
 *     range is waiting to be delivered; 0 otherwise (drop the registration, register again).
 *     With rule 1, a hit answered 1 is on the memory that was registered. One system call, no
 *     lock, never blocks.
 *  4. From notify: mrc_monitor_subscribe, _unsubscribe and _valid of the same monitor may be
 *     called; mrc_monitor_deliver and mrc_monitor_close of it may not (MRC_ERR_BUSY).
 *  5. Memory the kernel cannot watch (SysV shm, hugetlbfs in some modes, a range another
 *     userfaultfd owns, no monitor: MRC_MONITOR=off or no userfaultfd) cannot be subscribed:
 *     MRC_ERR_UNSUPPORTED and the reason in mrc_last_error(). Do not cache it.
 *  6. Bad arguments: MRC_ERR_INVALID, nothing changed, the reason in mrc_last_error();
 *     mrc_monitor_valid answers 0.
 */
#ifndef MRCACHE_MONITOR_H
#define MRCACHE_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "mrcache/mrcache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mrc_monitor mrc_monitor_t;

/* Memory in [addr, addr+len) went away. Runs on a thread that may block (rule 2). */
typedef void (*mrc_monitor_notify_fn)(void *arg, void *addr, size_t len);

/* mrc_monitor_params_t.flags */
/* A thread of the monitor delivers; without it, the runtime calls mrc_monitor_deliver(). */
#define MRC_MONITOR_DELIVERY_THREAD (1u << 0)
/* A delivery ends every subscription it overlaps, as if unsubscribed just before notify: for a
 * runtime that never unsubscribes what the monitor told it about (libfabric). */
#define MRC_MONITOR_ONE_SHOT (1u << 1)

typedef struct {
  size_t struct_size;           /* sizeof(mrc_monitor_params_t), set by mrc_monitor_params_init */
  mrc_monitor_notify_fn notify; /* required */
  void *notify_arg;
  unsigned flags; /* MRC_MONITOR_DELIVERY_THREAD | MRC_MONITOR_ONE_SHOT */
} mrc_monitor_params_t;

typedef struct {
  uint64_t subscriptions; /* distinct ranges subscribed now */
  uint64_t subscribes;    /* successful mrc_monitor_subscribe calls */
  uint64_t subscribes_refused;
  uint64_t unsubscribes;
  uint64_t valid_checks;      /* mrc_monitor_valid calls */
  uint64_t valid_refused;     /* of which answered 0 */
  uint64_t records;           /* changes of watched memory read (every watcher's) */
  uint64_t notifications;     /* notify calls, the whole-space ones included */
  uint64_t whole_space;       /* of which for lost records or a fork */
  uint64_t ended_by_delivery; /* subscriptions ended by MRC_MONITOR_ONE_SHOT */
} mrc_monitor_stats_t;
/* The smallest size mrc_monitor_stats_sized accepts. */
#define MRC_MONITOR_STATS_SIZE_0_3 sizeof(mrc_monitor_stats_t)

MRC_API void mrc_monitor_params_init(mrc_monitor_params_t *params);
/* Starts the process-wide monitor if no cache or monitor runs it yet, and the delivery thread
 * if asked for. MRC_ERR_UNSUPPORTED (with the reason) when no monitor can run. */
MRC_API mrc_status_t mrc_monitor_open(const mrc_monitor_params_t *params, mrc_monitor_t **out);
/* Ends every subscription, stops the delivery thread (waiting for a notify in progress) and
 * frees the monitor. MRC_ERR_BUSY from its own notify. */
MRC_API mrc_status_t mrc_monitor_close(mrc_monitor_t *monitor);
MRC_API mrc_status_t mrc_monitor_subscribe(mrc_monitor_t *monitor, const void *addr, size_t len);
/* MRC_ERR_NOT_FOUND when [addr, addr+len) holds no subscription (ended by a one-shot delivery,
 * or never made). */
MRC_API mrc_status_t mrc_monitor_unsubscribe(mrc_monitor_t *monitor, const void *addr, size_t len);
/* 1: valid; 0: not (rule 3). */
MRC_API int mrc_monitor_valid(mrc_monitor_t *monitor, const void *addr, size_t len);
/* Delivers what is waiting, on the calling thread (after a delivery in progress on another
 * thread); *delivered (if not NULL) receives the number of notify calls. MRC_ERR_BUSY from
 * notify. */
MRC_API mrc_status_t mrc_monitor_deliver(mrc_monitor_t *monitor, size_t *delivered);
MRC_API mrc_status_t mrc_monitor_stats_sized(mrc_monitor_t *monitor, mrc_monitor_stats_t *stats,
                                             size_t size);
static inline mrc_status_t mrc_monitor_stats(mrc_monitor_t *monitor, mrc_monitor_stats_t *stats) {
  return mrc_monitor_stats_sized(monitor, stats, sizeof *stats);
}

#ifdef __cplusplus
}
#endif

#endif /* MRCACHE_MONITOR_H */
