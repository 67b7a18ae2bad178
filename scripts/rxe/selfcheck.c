// SPDX-License-Identifier: BSD-3-Clause
// rxe_selfcheck: proves that the rxe guest can do what the verbs tests need, independently of
// mrcache: ibv_reg_mr, RC queue pairs, and RDMA READ that returns the current contents of the
// registered pages, and a remote key that is refused when it is wrong.
//
//   rxe_selfcheck [DEV0 [DEV1]]   defaults: $RXE_DEV0 / $RXE_DEV1, else the first device
//   GID index: $RXE_GID0 / $RXE_GID1 (the link-local RoCE v2 GID; 0 when unset)
//
// Checks, each printed as it passes:
//   1. loopback: a QP on DEV0 reads a buffer registered on DEV0;
//   2. the same read after the buffer was rewritten returns the new bytes (no stale copy);
//   3. if DEV1 is given: a QP on DEV1 reads DEV0's buffer (real packets over the veth pair);
//   4. a read with a corrupted rkey completes with IBV_WC_REM_ACCESS_ERR (nothing copied).
// Exit status 0 only when every check passed. Built by scripts/rxe/ci.sh with gcc -libverbs.
#define _GNU_SOURCE  // strdup
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kBufSize = 64 * 1024, kPollSeconds = 20 };

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "rxe_selfcheck: FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, "\n");                                              \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

struct device {
  const char *name;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  uint8_t gid_index;
  union ibv_gid gid;
  enum ibv_mtu mtu;
};

struct endpoint {
  struct device *dev;
  struct ibv_qp *qp;
};

static uint8_t env_gid_index(const char *var) {
  const char *value = getenv(var);
  return value && *value ? (uint8_t)atoi(value) : 0;
}

static void open_device(struct device *dev, const char *name, uint8_t gid_index) {
  int count = 0;
  struct ibv_device **list = ibv_get_device_list(&count);
  CHECK(list && count > 0, "no RDMA device (ibv_get_device_list found %d)", count);
  struct ibv_device *chosen = NULL;
  for (int i = 0; i < count; ++i) {
    if (!name || strcmp(ibv_get_device_name(list[i]), name) == 0) {
      chosen = list[i];
      break;
    }
  }
  CHECK(chosen, "RDMA device %s not found", name);
  dev->name = strdup(ibv_get_device_name(chosen));
  dev->ctx = ibv_open_device(chosen);
  CHECK(dev->ctx, "ibv_open_device(%s) failed", dev->name);
  ibv_free_device_list(list);

  struct ibv_port_attr port;
  CHECK(ibv_query_port(dev->ctx, 1, &port) == 0, "ibv_query_port(%s)", dev->name);
  CHECK(port.state == IBV_PORT_ACTIVE, "%s port 1 is not active (state %d)", dev->name, port.state);
  dev->mtu = port.active_mtu;
  dev->gid_index = gid_index;
  CHECK(ibv_query_gid(dev->ctx, 1, gid_index, &dev->gid) == 0, "ibv_query_gid(%s, %u)", dev->name,
        gid_index);
  dev->pd = ibv_alloc_pd(dev->ctx);
  CHECK(dev->pd, "ibv_alloc_pd(%s)", dev->name);
  dev->cq = ibv_create_cq(dev->ctx, 16, NULL, NULL, 0);
  CHECK(dev->cq, "ibv_create_cq(%s)", dev->name);
}

static struct endpoint create_endpoint(struct device *dev) {
  struct ibv_qp_init_attr init = {
      .send_cq = dev->cq,
      .recv_cq = dev->cq,
      .cap = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = IBV_QPT_RC,
      .sq_sig_all = 1,
  };
  struct endpoint ep = {.dev = dev, .qp = ibv_create_qp(dev->pd, &init)};
  CHECK(ep.qp, "ibv_create_qp(%s)", dev->name);
  struct ibv_qp_attr attr = {
      .qp_state = IBV_QPS_INIT,
      .port_num = 1,
      .pkey_index = 0,
      .qp_access_flags = IBV_ACCESS_REMOTE_READ,
  };
  CHECK(ibv_modify_qp(ep.qp, &attr,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
        "QP to INIT on %s", dev->name);
  return ep;
}

// Moves `self` to RTS, connected to `peer` (which may live on another device).
static void connect_endpoint(struct endpoint *self, const struct endpoint *peer) {
  enum ibv_mtu mtu = self->dev->mtu < peer->dev->mtu ? self->dev->mtu : peer->dev->mtu;
  struct ibv_qp_attr attr = {
      .qp_state = IBV_QPS_RTR,
      .path_mtu = mtu,
      .dest_qp_num = peer->qp->qp_num,
      .rq_psn = 0,
      .max_dest_rd_atomic = 1,
      .min_rnr_timer = 12,
      .ah_attr =
          {
              .is_global = 1,
              .grh = {.dgid = peer->dev->gid, .sgid_index = self->dev->gid_index, .hop_limit = 1},
              .port_num = 1,
          },
  };
  CHECK(ibv_modify_qp(self->qp, &attr,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
        "QP to RTR on %s", self->dev->name);
  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 14;
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;
  attr.sq_psn = 0;
  attr.max_rd_atomic = 1;
  CHECK(ibv_modify_qp(self->qp, &attr,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
        "QP to RTS on %s", self->dev->name);
}

// Posts one RDMA READ of `len` bytes from (remote_addr, rkey) into `local` and waits for its
// completion; returns the completion status.
static enum ibv_wc_status rdma_read(struct endpoint *ep, struct ibv_mr *local, uint64_t remote_addr,
                                    uint32_t rkey, uint32_t len) {
  struct ibv_sge sge = {.addr = (uintptr_t)local->addr, .length = len, .lkey = local->lkey};
  struct ibv_send_wr wr = {
      .wr_id = 1,
      .sg_list = &sge,
      .num_sge = 1,
      .opcode = IBV_WR_RDMA_READ,
      .send_flags = IBV_SEND_SIGNALED,
      .wr = {.rdma = {.remote_addr = remote_addr, .rkey = rkey}},
  };
  struct ibv_send_wr *bad = NULL;
  CHECK(ibv_post_send(ep->qp, &wr, &bad) == 0, "ibv_post_send on %s", ep->dev->name);
  struct ibv_wc wc;
  time_t deadline = time(NULL) + kPollSeconds;
  for (;;) {
    int n = ibv_poll_cq(ep->dev->cq, 1, &wc);
    CHECK(n >= 0, "ibv_poll_cq on %s", ep->dev->name);
    if (n == 1) break;
    CHECK(time(NULL) < deadline, "no completion on %s within %d s", ep->dev->name, kPollSeconds);
  }
  CHECK(wc.wr_id == 1, "unexpected wr_id %llu", (unsigned long long)wc.wr_id);
  return wc.status;
}

static void fill(unsigned char *buf, unsigned seed) {
  for (size_t i = 0; i < kBufSize; ++i) buf[i] = (unsigned char)(i * 131u + seed);
}

int main(int argc, char **argv) {
  const char *name0 = argc > 1 ? argv[1] : getenv("RXE_DEV0");
  const char *name1 = argc > 2 ? argv[2] : getenv("RXE_DEV1");
  struct device dev0 = {0}, dev1 = {0};
  open_device(&dev0, name0, env_gid_index("RXE_GID0"));

  unsigned char *remote = aligned_alloc(4096, kBufSize);
  unsigned char *local = aligned_alloc(4096, kBufSize);
  CHECK(remote && local, "out of memory");
  struct ibv_mr *remote_mr = ibv_reg_mr(dev0.pd, remote, kBufSize, IBV_ACCESS_REMOTE_READ);
  struct ibv_mr *local_mr = ibv_reg_mr(dev0.pd, local, kBufSize, IBV_ACCESS_LOCAL_WRITE);
  CHECK(remote_mr && local_mr, "ibv_reg_mr on %s", dev0.name);
  printf("rxe_selfcheck: %s active_mtu %d gid[%u], 2 MRs of %d bytes registered\n", dev0.name,
         128 << dev0.mtu, dev0.gid_index, kBufSize);

  struct endpoint reader = create_endpoint(&dev0), owner = create_endpoint(&dev0);
  connect_endpoint(&reader, &owner);
  connect_endpoint(&owner, &reader);

  fill(remote, 1);
  memset(local, 0, kBufSize);
  enum ibv_wc_status status =
      rdma_read(&reader, local_mr, (uintptr_t)remote, remote_mr->rkey, kBufSize);
  CHECK(status == IBV_WC_SUCCESS, "loopback READ: %s", ibv_wc_status_str(status));
  CHECK(memcmp(local, remote, kBufSize) == 0, "loopback READ returned other bytes");
  printf("rxe_selfcheck: PASS 1 loopback RDMA READ of %d bytes on %s\n", kBufSize, dev0.name);

  fill(remote, 77);
  status = rdma_read(&reader, local_mr, (uintptr_t)remote, remote_mr->rkey, kBufSize);
  CHECK(status == IBV_WC_SUCCESS, "second READ: %s", ibv_wc_status_str(status));
  CHECK(memcmp(local, remote, kBufSize) == 0, "READ after rewrite returned stale bytes");
  printf("rxe_selfcheck: PASS 2 READ after rewrite returns the new contents\n");

  if (name1 && *name1) {
    open_device(&dev1, name1, env_gid_index("RXE_GID1"));
    struct ibv_mr *far_mr = ibv_reg_mr(dev1.pd, local, kBufSize, IBV_ACCESS_LOCAL_WRITE);
    CHECK(far_mr, "ibv_reg_mr on %s", dev1.name);
    struct endpoint far_reader = create_endpoint(&dev1), far_owner = create_endpoint(&dev0);
    connect_endpoint(&far_reader, &far_owner);
    connect_endpoint(&far_owner, &far_reader);
    fill(remote, 200);
    memset(local, 0, kBufSize);
    status = rdma_read(&far_reader, far_mr, (uintptr_t)remote, remote_mr->rkey, kBufSize);
    CHECK(status == IBV_WC_SUCCESS, "READ %s -> %s: %s", dev1.name, dev0.name,
          ibv_wc_status_str(status));
    CHECK(memcmp(local, remote, kBufSize) == 0, "READ %s -> %s returned other bytes", dev1.name,
          dev0.name);
    printf("rxe_selfcheck: PASS 3 RDMA READ %s -> %s over the veth pair\n", dev1.name, dev0.name);
  }

  // Last: an error completion moves the QP to the error state.
  memset(local, 0, kBufSize);
  status = rdma_read(&reader, local_mr, (uintptr_t)remote, remote_mr->rkey ^ 0x5a5a00u, 4096);
  CHECK(status == IBV_WC_REM_ACCESS_ERR, "READ with a wrong rkey completed with '%s'",
        ibv_wc_status_str(status));
  for (size_t i = 0; i < 4096; ++i) CHECK(local[i] == 0, "wrong-rkey READ copied data");
  printf("rxe_selfcheck: PASS 4 READ with a wrong rkey fails with %s\n", ibv_wc_status_str(status));

  printf("rxe_selfcheck: all checks passed\n");
  return 0;
}
