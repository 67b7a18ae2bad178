// SPDX-License-Identifier: BSD-3-Clause
/* A libfabric program that is not mrcache's: it initialises libfabric (fi_getinfo), then tries
 * to import a monitor of its own and prints what libfabric answered. With "first" it imports its
 * own monitor before libfabric initialises, so that a plugin's import comes second. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>

static int start(struct fid_mem_monitor *m) {
  (void)m;
  return 0;
}
static void stop(struct fid_mem_monitor *m) { (void)m; }
static int subscribe(struct fid_mem_monitor *m, const void *a, size_t l) {
  (void)m;
  (void)a;
  (void)l;
  return 0;
}
static void unsubscribe(struct fid_mem_monitor *m, const void *a, size_t l) {
  (void)m;
  (void)a;
  (void)l;
}
static bool valid(struct fid_mem_monitor *m, const void *a, size_t l) {
  (void)m;
  (void)a;
  (void)l;
  return true;
}
static struct fi_ops_mem_monitor ops = {sizeof ops, start, stop, subscribe, unsubscribe, valid};
static struct fid_mem_monitor own = {.fid = {.fclass = FI_CLASS_MEM_MONITOR}, .export_ops = &ops};

static int import_own(void) {
  struct fid *cache = NULL;
  int ret = fi_open(FI_VERSION(1, 13), "mr_cache", NULL, 0, 0, &cache, NULL);
  if (ret != 0) return ret;
  ret = fi_import_fid(cache, &own.fid, 0);
  fi_close(cache);
  return ret;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "first") == 0) {
    printf("own import before init: %d\n", import_own());
  }
  struct fi_info *info = NULL;
  const int ret = fi_getinfo(FI_VERSION(1, 13), NULL, NULL, 0, NULL, &info);
  printf("fi_getinfo: %s\n", ret == 0 ? "ok" : fi_strerror(-ret));
  if (info != NULL) fi_freeinfo(info);
  const int second = import_own();
  printf("own import after init: %d (%s)\n", second, fi_strerror(-second));
  fflush(stdout);
  return 0;
}
