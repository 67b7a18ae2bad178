// SPDX-License-Identifier: BSD-3-Clause
// RDMA through the cache with the verbs backend: a queue pair connected to itself writes a
// source buffer into a destination buffer, both registered by mrc_get (lkey for the source,
// rkey for the destination). Then the program maps new memory over both buffers and writes
// again: the cache learns of the change from the kernel and registers the new memory, so the
// new bytes land in the new destination. Exit 77 without an RDMA device (the rxe lane has one:
// set RXE_DEV0 to choose it).
#define _GNU_SOURCE  // MAP_ANONYMOUS
#include <infiniband/verbs.h>
#include <mrcache/backends.h>
#include <mrcache/mrcache.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { kLength = 64 * 1024 };

#define FAIL_IF(cond, what)                    \
  do {                                         \
    if (cond) {                                \
      fprintf(stderr, "failed: %s\n", (what)); \
      exit(1);                                 \
    }                                          \
  } while (0)

// The queue pair of `pd`'s device, moved to RTS with itself as its peer (the device loops back).
static struct ibv_qp *self_connected_qp(struct ibv_context *device, struct ibv_pd *pd,
                                        struct ibv_cq *cq) {
  struct ibv_port_attr port;
  union ibv_gid gid;
  FAIL_IF(ibv_query_port(device, 1, &port) != 0 || ibv_query_gid(device, 1, 0, &gid) != 0,
          "query port 1");
  struct ibv_qp_init_attr init = {
      .send_cq = cq,
      .recv_cq = cq,
      .cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = IBV_QPT_RC};
  struct ibv_qp *qp = ibv_create_qp(pd, &init);
  FAIL_IF(qp == NULL, "ibv_create_qp");
  struct ibv_qp_attr attr = {
      .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
  FAIL_IF(ibv_modify_qp(qp, &attr,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
          "QP to INIT");
  attr = (struct ibv_qp_attr){
      .qp_state = IBV_QPS_RTR,
      .path_mtu = port.active_mtu,
      .dest_qp_num = qp->qp_num,
      .max_dest_rd_atomic = 1,
      .min_rnr_timer = 12,
      .ah_attr = {.is_global = 1, .grh = {.dgid = gid, .hop_limit = 1}, .port_num = 1}};
  FAIL_IF(ibv_modify_qp(qp, &attr,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
          "QP to RTR");
  attr = (struct ibv_qp_attr){
      .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
  FAIL_IF(ibv_modify_qp(qp, &attr,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
          "QP to RTS");
  return qp;
}

// One RDMA WRITE of src into dst, each registered through the cache for this message only.
static void write_message(mrc_cache_t *cache, struct ibv_qp *qp, struct ibv_cq *cq, char *src,
                          char *dst) {
  mrc_region_t *from, *to;
  FAIL_IF(mrc_get(cache, src, kLength, MRC_PROT_READ, &from) != MRC_OK, mrc_last_error());
  FAIL_IF(mrc_get(cache, dst, kLength, MRC_PROT_READ | MRC_PROT_WRITE, &to) != MRC_OK,
          mrc_last_error());
  struct ibv_sge sge = {
      .addr = (uintptr_t)src, .length = kLength, .lkey = (uint32_t)mrc_region_key(from)};
  struct ibv_send_wr wr = {.sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_SIGNALED,
                           .wr.rdma = {.remote_addr = (uintptr_t)dst,
                                       .rkey = mrc_verbs_handle_mr(mrc_region_handle(to))->rkey}};
  struct ibv_send_wr *bad;
  FAIL_IF(ibv_post_send(qp, &wr, &bad) != 0, "ibv_post_send");
  struct ibv_wc wc;
  int polled;
  while ((polled = ibv_poll_cq(cq, 1, &wc)) == 0) {
  }
  FAIL_IF(polled < 0 || wc.status != IBV_WC_SUCCESS, ibv_wc_status_str(wc.status));
  mrc_put(cache, to);  // after the completion: the NIC is done with both
  mrc_put(cache, from);
}

int main(void) {
  int count = 0;
  struct ibv_device **devices = ibv_get_device_list(&count);
  const char *wanted = getenv("RXE_DEV0");
  struct ibv_device *chosen = NULL;
  for (int i = 0; i < count && chosen == NULL; i++) {
    if (wanted == NULL || strcmp(ibv_get_device_name(devices[i]), wanted) == 0) chosen = devices[i];
  }
  if (chosen == NULL) {
    printf("skipped: no RDMA device%s%s\n", wanted != NULL ? " named " : "",
           wanted != NULL ? wanted : "");
    return 77;
  }
  struct ibv_context *device = ibv_open_device(chosen);
  ibv_free_device_list(devices);
  FAIL_IF(device == NULL, "ibv_open_device");
  struct ibv_pd *pd = ibv_alloc_pd(device);
  struct ibv_cq *cq = ibv_create_cq(device, 4, NULL, NULL, 0);
  FAIL_IF(pd == NULL || cq == NULL, "ibv_alloc_pd or ibv_create_cq");
  struct ibv_qp *qp = self_connected_qp(device, pd, cq);

  mrc_verbs_params_t verbs;
  mrc_verbs_params_init(&verbs);
  verbs.pd = pd;  // the runtime's protection domain
  verbs.access = IBV_ACCESS_REMOTE_WRITE;
  mrc_verbs_ctx_t *engine;
  FAIL_IF(mrc_verbs_ctx_create(&verbs, &engine) != MRC_OK, mrc_last_error());
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = mrc_backend_verbs();
  params.backend_ctx = engine;
  mrc_cache_t *cache;
  FAIL_IF(mrc_cache_create(&params, &cache) != MRC_OK, mrc_last_error());

  const int rw = PROT_READ | PROT_WRITE, anonymous = MAP_PRIVATE | MAP_ANONYMOUS;
  char *src = mmap(NULL, kLength, rw, anonymous, -1, 0);
  char *dst = mmap(NULL, kLength, rw, anonymous, -1, 0);
  FAIL_IF(src == MAP_FAILED || dst == MAP_FAILED, "mmap");
  int failed = 0;
  for (int round = 0; round < 2; round++) {
    if (round > 0) {  // new memory under both buffers, at the same addresses
      FAIL_IF(mmap(src, kLength, rw, anonymous | MAP_FIXED, -1, 0) != src ||
                  mmap(dst, kLength, rw, anonymous | MAP_FIXED, -1, 0) != dst,
              "mmap MAP_FIXED");
    }
    memset(src, 'a' + round, kLength);
    memset(dst, 0, kLength);
    write_message(cache, qp, cq, src, dst);
    if (memcmp(src, dst, kLength) != 0) {
      fprintf(stderr, "round %d: the destination does not hold the source's bytes\n", round);
      failed = 1;
    }
  }
  mrc_stats_t stats;
  mrc_cache_stats(cache, &stats);
  printf("%s: 2 RDMA writes of %d bytes, %llu registrations, %llu invalidated by unmaps\n",
         ibv_get_device_name(device->device), kLength, (unsigned long long)stats.misses,
         (unsigned long long)stats.invalidations);
  FAIL_IF(mrc_cache_destroy(cache) != MRC_OK, mrc_last_error());
  mrc_verbs_ctx_destroy(engine);
  munmap(src, kLength);
  munmap(dst, kLength);
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(device);
  return failed;
}
