// SPDX-License-Identifier: BSD-3-Clause
/* libmrcache-fi.so: mrcache's monitor (include/mrcache/monitor.h) as libfabric's memory monitor.
 *
 * libfabric loads this library while it initialises: from FI_PROVIDER_PATH, or from its provider
 * directory. It calls fi_prov_ini() after its own monitors are set up and before any domain has
 * picked one, which is the one moment an import can succeed. fi_prov_ini() imports the monitor
 * (fi_open "mr_cache", then fi_import_fid) and returns a provider with no getinfo. libfabric
 * treats that as a hook that wraps nothing unless FI_HOOK names it, and it must not.
 *
 * libfabric calls the monitor's operations:
 *   start, stop   when its first MR cache appears and its last one goes, holding its monitor
 *                 state lock: open and close an mrc_monitor_t with a delivery thread of its own.
 *   subscribe     for each entry it caches, after registering it, holding its mm_lock.
 *   unsubscribe   never in 1.17 (it forgets entries without unsubscribing): hence one-shot
 *                 subscriptions, which a delivery ends.
 *   valid         on every cache hit, holding its mm_lock: mrc_monitor_valid (one system call).
 * The delivery thread calls libfabric's notify, which takes libfabric's locks. No libfabric lock
 * is held on that thread, and the monitor thread that reads the kernel's events never calls it.
 *
 * Environment: MRC_FI_MONITOR=off leaves libfabric's own monitor in place. MRC_STATS=1 prints
 * the monitor's counters to stderr when libfabric stops it (and at exit if it is still running).
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>
#include <rdma/providers/fi_log.h>
#include <rdma/providers/fi_prov.h>

#include "mrcache/monitor.h"

static int no_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context) {
  (void)attr;
  (void)fabric;
  (void)context;
  return -FI_ENOSYS;
}

static struct fi_provider provider = {
    .version = FI_VERSION(MRC_VERSION_MAJOR, MRC_VERSION_MINOR),
    .fi_version = FI_VERSION(1, 13),
    .name = "mrcache",
    .getinfo = NULL,  // a hook-class provider: it exists only to import the monitor
    .fabric = no_fabric,
    .cleanup = NULL,
};

// The mrcache monitor between libfabric's start and stop.
static _Atomic(mrc_monitor_t *) running;
// What libfabric imported; its fid and import_ops are filled in by libfabric.
static struct fid_mem_monitor imported;

static int to_fi_error(mrc_status_t status) {
  switch (status) {
    case MRC_OK: return 0;
    case MRC_ERR_INVALID: return -FI_EINVAL;
    case MRC_ERR_NO_MEMORY: return -FI_ENOMEM;
    case MRC_ERR_BUSY: return -FI_EBUSY;
    case MRC_ERR_UNSUPPORTED: return -FI_ENOSYS;
    default: return -FI_EOTHER;
  }
}

static bool stats_wanted(void) {
  const char *value = getenv("MRC_STATS");
  return value != NULL && strcmp(value, "0") != 0 && value[0] != '\0';
}

static void print_stats(mrc_monitor_t *monitor, const char *when) {
  mrc_monitor_stats_t s;
  if (mrc_monitor_stats(monitor, &s) != MRC_OK) return;
  fprintf(stderr,
          "mrcache-fi (%s): subscriptions %llu, subscribes %llu, refused %llu, unsubscribes "
          "%llu, valid checks %llu, answered invalid %llu, records read %llu, notifications "
          "%llu, whole-space %llu, ended by delivery %llu\n",
          when, (unsigned long long)s.subscriptions, (unsigned long long)s.subscribes,
          (unsigned long long)s.subscribes_refused, (unsigned long long)s.unsubscribes,
          (unsigned long long)s.valid_checks, (unsigned long long)s.valid_refused,
          (unsigned long long)s.records, (unsigned long long)s.notifications,
          (unsigned long long)s.whole_space, (unsigned long long)s.ended_by_delivery);
}

// On the monitor's delivery thread, which holds no lock of libfabric's.
static void deliver_to_libfabric(void *arg, void *addr, size_t len) {
  (void)arg;
  imported.import_ops->notify(&imported, addr, len);
}

static int monitor_start(struct fid_mem_monitor *monitor) {
  (void)monitor;
  mrc_monitor_params_t params;
  mrc_monitor_params_init(&params);
  params.notify = deliver_to_libfabric;
  params.flags = MRC_MONITOR_DELIVERY_THREAD | MRC_MONITOR_ONE_SHOT;
  mrc_monitor_t *opened = NULL;
  const mrc_status_t status = mrc_monitor_open(&params, &opened);
  if (status != MRC_OK) {
    FI_WARN(&provider, FI_LOG_MR, "cannot start mrcache's monitor: %s\n", mrc_last_error());
    return to_fi_error(status);
  }
  atomic_store(&running, opened);
  FI_INFO(&provider, FI_LOG_MR, "mrcache's monitor started\n");
  return 0;
}

static void monitor_stop(struct fid_mem_monitor *monitor) {
  (void)monitor;
  mrc_monitor_t *stopping = atomic_exchange(&running, NULL);
  if (stopping == NULL) return;
  if (stats_wanted()) print_stats(stopping, "stopped");
  if (mrc_monitor_close(stopping) != MRC_OK) {
    FI_WARN(&provider, FI_LOG_MR, "cannot stop mrcache's monitor: %s\n", mrc_last_error());
  }
}

static int monitor_subscribe(struct fid_mem_monitor *monitor, const void *addr, size_t len) {
  (void)monitor;
  mrc_monitor_t *current = atomic_load(&running);
  if (current == NULL) return -FI_EOPBADSTATE;
  const mrc_status_t status = mrc_monitor_subscribe(current, addr, len);
  if (status != MRC_OK) {
    FI_INFO(&provider, FI_LOG_MR, "not monitored, so not cached: %s\n", mrc_last_error());
  }
  return to_fi_error(status);
}

static void monitor_unsubscribe(struct fid_mem_monitor *monitor, const void *addr, size_t len) {
  (void)monitor;
  mrc_monitor_t *current = atomic_load(&running);
  // MRC_ERR_NOT_FOUND: a delivery already ended it (one-shot).
  if (current != NULL) (void)mrc_monitor_unsubscribe(current, addr, len);
}

static bool monitor_valid(struct fid_mem_monitor *monitor, const void *addr, size_t len) {
  (void)monitor;
  mrc_monitor_t *current = atomic_load(&running);
  return current != NULL && mrc_monitor_valid(current, addr, len) == 1;
}

static struct fi_ops_mem_monitor export_ops = {
    .size = sizeof(struct fi_ops_mem_monitor),
    .start = monitor_start,
    .stop = monitor_stop,
    .subscribe = monitor_subscribe,
    .unsubscribe = monitor_unsubscribe,
    .valid = monitor_valid,
};

__attribute__((destructor)) static void report_at_exit(void) {
  mrc_monitor_t *current = atomic_load(&running);
  if (current != NULL && stats_wanted()) print_stats(current, "at exit");
}

static bool switched_off(void) {
  const char *value = getenv("MRC_FI_MONITOR");
  return value != NULL && (strcmp(value, "off") == 0 || strcmp(value, "0") == 0);
}

FI_EXT_INI {
  if (switched_off()) {
    FI_INFO(&provider, FI_LOG_MR, "MRC_FI_MONITOR=off: libfabric keeps its own monitor\n");
    return NULL;
  }
  mrc_monitor_info_t info;
  if (mrc_monitor_info(&info) != MRC_OK || info.mode == MRC_MONITOR_UNCACHED) {
    FI_WARN(&provider, FI_LOG_MR, "mrcache's monitor cannot run here (%s): not imported\n",
            info.reason);
    return NULL;
  }
  struct fid *cache = NULL;
  int ret = fi_open(FI_VERSION(1, 13), "mr_cache", NULL, 0, 0, &cache, NULL);
  if (ret != 0) {
    FI_WARN(&provider, FI_LOG_MR, "libfabric has no MR cache to import into (%s): not imported\n",
            fi_strerror(-ret));
    return NULL;
  }
  imported.fid.fclass = FI_CLASS_MEM_MONITOR;
  imported.export_ops = &export_ops;
  ret = fi_import_fid(cache, &imported.fid, 0);
  fi_close(cache);
  if (ret != 0) {
    FI_WARN(&provider, FI_LOG_MR,
            "libfabric refused mrcache's monitor (%s): %s; libfabric keeps the monitor it has\n",
            fi_strerror(-ret),
            ret == -FI_EBUSY ? "another monitor was imported first, or a domain already uses "
                               "libfabric's default monitor"
                             : "this libfabric does not take an imported monitor");
    return NULL;
  }
  FI_INFO(&provider, FI_LOG_MR, "imported mrcache's monitor (%s mode)\n", info.mode_name);
  return &provider;
}
