// SPDX-License-Identifier: BSD-3-Clause
// The verbs backend. Without an RDMA device (these machines: no CONFIG_INFINIBAND) the device
// tests skip with the reason; in the rxe VM lane they run for real, including the RDMA
// data-path oracle: an RC queue pair connected to itself READs through a registration, before
// and after the registered memory is replaced at the same address.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mrcache/mrcache.h"

#if MRC_TEST_WITH_VERBS
#include <infiniband/verbs.h>
#endif

namespace {

bool Contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

#if !MRC_TEST_WITH_VERBS

TEST(VerbsBackend, BuildWithoutVerbsSaysUnsupported) {
  mrc_verbs_params_t p;
  mrc_verbs_params_init(&p);
  mrc_verbs_ctx_t *ctx = nullptr;
  EXPECT_EQ(mrc_verbs_ctx_create(&p, &ctx), MRC_ERR_UNSUPPORTED);
  EXPECT_TRUE(Contains(mrc_backend_last_error(), "MRC_WITH_VERBS=OFF")) << mrc_backend_last_error();
  char memory[64];
  void *h = nullptr;
  uint64_t key = 0;
  EXPECT_EQ(mrc_backend_verbs()->reg(nullptr, memory, sizeof memory, MRC_PROT_READ, &h, &key),
            MRC_ERR_UNSUPPORTED);
  EXPECT_EQ(mrc_verbs_handle_mr(memory), nullptr);
}

#else

TEST(VerbsBackend, BadParametersAreInvalid) {
  mrc_verbs_ctx_t *ctx = nullptr;
  mrc_verbs_params_t p;
  mrc_verbs_params_init(&p);
  EXPECT_EQ(p.pd, nullptr);
  EXPECT_EQ(mrc_verbs_ctx_create(nullptr, &ctx), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_verbs_ctx_create(&p, &ctx), MRC_ERR_INVALID);
  EXPECT_STREQ(mrc_backend_last_error(), "verbs: no protection domain");
  // Access bits are checked before the protection domain is used.
  alignas(ibv_pd) unsigned char not_a_pd[sizeof(ibv_pd)] = {};
  p.pd = reinterpret_cast<ibv_pd *>(not_a_pd);  // never dereferenced: access is checked first
  p.access = IBV_ACCESS_MW_BIND;
  EXPECT_EQ(mrc_verbs_ctx_create(&p, &ctx), MRC_ERR_INVALID);
  EXPECT_TRUE(Contains(mrc_backend_last_error(), "access bits 0x10")) << mrc_backend_last_error();
  EXPECT_EQ(mrc_verbs_ctx_create(&p, nullptr), MRC_ERR_INVALID);
  EXPECT_EQ(ctx, nullptr);
  // reg without a context.
  char memory[64];
  void *h = nullptr;
  uint64_t key = 0;
  EXPECT_EQ(mrc_backend_verbs()->reg(nullptr, memory, sizeof memory, MRC_PROT_READ, &h, &key),
            MRC_ERR_INVALID);
}

// The first RDMA device (or $RXE_DEV0), a protection domain, port 1.
class VerbsDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    errno = 0;
    devices_ = ibv_get_device_list(&count);
    if (devices_ == nullptr || count == 0) {
      const int err = errno;
      GTEST_SKIP() << "no RDMA device on this host (ibv_get_device_list found none"
                   << (err != 0 ? std::string(": ") + std::strerror(err) : std::string())
                   << "); the verbs tests run in the rxe VM lane";
    }
    ibv_device *device = devices_[0];
    if (const char *wanted = std::getenv("RXE_DEV0")) {
      for (int i = 0; i < count; ++i)
        if (std::strcmp(ibv_get_device_name(devices_[i]), wanted) == 0) device = devices_[i];
    }
    device_name_ = ibv_get_device_name(device);
    context_ = ibv_open_device(device);
    ASSERT_NE(context_, nullptr) << "ibv_open_device(" << device_name_
                                 << "): " << std::strerror(errno);
    pd_ = ibv_alloc_pd(context_);
    ASSERT_NE(pd_, nullptr) << std::strerror(errno);
    ASSERT_EQ(ibv_query_port(context_, kPort, &port_), 0);
    if (const char *gid = std::getenv("RXE_GID0")) gid_index_ = std::atoi(gid);
  }

  void TearDown() override {
    if (qp_ != nullptr) ibv_destroy_qp(qp_);
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    if (ctx_ != nullptr) mrc_verbs_ctx_destroy(ctx_);
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    if (context_ != nullptr) ibv_close_device(context_);
    if (devices_ != nullptr) ibv_free_device_list(devices_);
  }

  void CreateBackend(unsigned access) {
    mrc_verbs_params_t p;
    mrc_verbs_params_init(&p);
    p.pd = pd_;
    p.access = access;
    ASSERT_EQ(mrc_verbs_ctx_create(&p, &ctx_), MRC_OK) << mrc_backend_last_error();
  }

  // An RC queue pair connected to itself on this device (loopback).
  void ConnectLoopback() {
    cq_ = ibv_create_cq(context_, 16, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr) << std::strerror(errno);
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 4;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    qp_ = ibv_create_qp(pd_, &init);
    ASSERT_NE(qp_, nullptr) << std::strerror(errno);

    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = kPort;
    attr.qp_access_flags =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(ibv_modify_qp(qp_, &attr,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
              0)
        << "INIT";

    ibv_gid gid{};
    ASSERT_EQ(ibv_query_gid(context_, kPort, gid_index_, &gid), 0) << "GID " << gid_index_;
    attr = {};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = port_.active_mtu;
    attr.dest_qp_num = qp_->qp_num;
    attr.rq_psn = 0;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.port_num = kPort;
    attr.ah_attr.dlid = port_.lid;
    if (port_.link_layer == IBV_LINK_LAYER_ETHERNET || port_.lid == 0) {
      attr.ah_attr.is_global = 1;
      attr.ah_attr.grh.dgid = gid;
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index_);
      attr.ah_attr.grh.hop_limit = 1;
    }
    ASSERT_EQ(ibv_modify_qp(qp_, &attr,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0)
        << "RTR (GID index " << gid_index_ << ", MTU enum " << port_.active_mtu << ")";

    attr = {};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = 0;
    attr.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(qp_, &attr,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
              0)
        << "RTS";
  }

  // RDMA READ of len bytes at remote (rkey) into local (lkey); "" on success, else why not.
  std::string RdmaRead(void *local, uint32_t lkey, const void *remote, uint32_t rkey, size_t len) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(local);
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = lkey;
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote);
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr *bad = nullptr;
    if (int err = ibv_post_send(qp_, &wr, &bad); err != 0)
      return std::string("ibv_post_send: ") + std::strerror(err);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    ibv_wc wc{};
    for (;;) {
      const int n = ibv_poll_cq(cq_, 1, &wc);
      if (n < 0) return "ibv_poll_cq failed";
      if (n == 1) break;
      if (std::chrono::steady_clock::now() > deadline) return "no completion within 60 s";
    }
    if (wc.status != IBV_WC_SUCCESS)
      return std::string("RDMA READ completed with ") + ibv_wc_status_str(wc.status);
    return "";
  }

  static constexpr uint8_t kPort = 1;
  ibv_device **devices_ = nullptr;
  std::string device_name_;
  ibv_context *context_ = nullptr;
  ibv_pd *pd_ = nullptr;
  ibv_port_attr port_{};
  int gid_index_ = 0;
  ibv_cq *cq_ = nullptr;
  ibv_qp *qp_ = nullptr;
  mrc_verbs_ctx_t *ctx_ = nullptr;
};

void Fill(char *p, size_t len, unsigned seed) {
  for (size_t i = 0; i < len; ++i) p[i] = static_cast<char>((i * 131 + size_t{seed} * 7919) >> 3);
}

TEST_F(VerbsDevice, RegisterGivesLkeyAndDescribeNamesKeysAndDevice) {
  CreateBackend(IBV_ACCESS_REMOTE_READ);
  std::string memory(65536, 'x');
  void *h = nullptr;
  uint64_t key = 0;
  ASSERT_EQ(mrc_backend_verbs()->reg(ctx_, memory.data(), memory.size(), MRC_PROT_WRITE, &h, &key),
            MRC_OK)
      << mrc_backend_last_error();
  ibv_mr *mr = mrc_verbs_handle_mr(h);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(key, mr->lkey);
  EXPECT_EQ(mr->addr, memory.data());
  EXPECT_EQ(mr->length, memory.size());
  char buf[256];
  ASSERT_GT(mrc_backend_verbs()->describe(ctx_, h, buf, sizeof buf), 0);
  char lkey[32], rkey[32];
  std::snprintf(lkey, sizeof lkey, "lkey 0x%x", mr->lkey);
  std::snprintf(rkey, sizeof rkey, "rkey 0x%x", mr->rkey);
  EXPECT_TRUE(Contains(buf, lkey)) << buf;
  EXPECT_TRUE(Contains(buf, rkey)) << buf;
  EXPECT_TRUE(Contains(buf, "device " + device_name_)) << buf;
  mrc_backend_verbs()->dereg(ctx_, h);
}

// MRC_PROT_WRITE asks for local write, which needs writable memory; read-only registration of
// read-only memory works.
TEST_F(VerbsDevice, ProtectionSelectsLocalWrite) {
  CreateBackend(0);
  void *readonly =
      mmap(nullptr, 65536, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  ASSERT_NE(readonly, MAP_FAILED);
  void *h = nullptr;
  uint64_t key = 0;
  ASSERT_EQ(mrc_backend_verbs()->reg(ctx_, readonly, 65536, MRC_PROT_READ, &h, &key), MRC_OK)
      << mrc_backend_last_error();
  mrc_backend_verbs()->dereg(ctx_, h);
  EXPECT_NE(mrc_backend_verbs()->reg(ctx_, readonly, 65536, MRC_PROT_WRITE, &h, &key), MRC_OK);
  EXPECT_TRUE(Contains(mrc_backend_last_error(), "verbs: ibv_reg_mr(")) << mrc_backend_last_error();
  munmap(readonly, 65536);
}

TEST_F(VerbsDevice, OnDemandPagingOnlyWhenTheDeviceHasIt) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(context_, nullptr, &attr), 0);
  const bool has_odp = (attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0 &&
                       (attr.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_READ) != 0;
  mrc_verbs_params_t p;
  mrc_verbs_params_init(&p);
  p.pd = pd_;
  p.odp = 1;
  const mrc_status_t s = mrc_verbs_ctx_create(&p, &ctx_);
  if (s == MRC_OK) {
    EXPECT_TRUE(has_odp);
  } else {
    EXPECT_EQ(s, MRC_ERR_UNSUPPORTED);
    EXPECT_TRUE(Contains(mrc_backend_last_error(), "has no on-demand paging"))
        << mrc_backend_last_error();
  }
}

TEST_F(VerbsDevice, RdmaReadOracleSeesNewContentsAfterRemap) {
  constexpr size_t kLen = 65536;
  CreateBackend(IBV_ACCESS_REMOTE_READ);
  ASSERT_NO_FATAL_FAILURE(ConnectLoopback());

  char *src = static_cast<char *>(
      mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(src, MAP_FAILED);
  Fill(src, kLen, 1);
  const std::string old_bytes(src, kLen);
  std::string dst(kLen, '\0');
  ibv_mr *dst_mr = ibv_reg_mr(pd_, dst.data(), kLen, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(dst_mr, nullptr) << std::strerror(errno);

  void *old_h = nullptr;
  uint64_t key = 0;
  ASSERT_EQ(mrc_backend_verbs()->reg(ctx_, src, kLen, MRC_PROT_READ, &old_h, &key), MRC_OK)
      << mrc_backend_last_error();
  ibv_mr *old_mr = mrc_verbs_handle_mr(old_h);
  ASSERT_EQ(RdmaRead(dst.data(), dst_mr->lkey, src, old_mr->rkey, kLen), "");
  EXPECT_EQ(dst, old_bytes);

  // Replace the memory at the same address with new contents.
  ASSERT_EQ(munmap(src, kLen), 0);
  ASSERT_EQ(mmap(src, kLen, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
            src);
  Fill(src, kLen, 2);
  const std::string new_bytes(src, kLen);
  ASSERT_NE(new_bytes, old_bytes);

  // The stale registration still reads the pages it pinned: what the oracle must catch.
  std::fill(dst.begin(), dst.end(), '\0');
  ASSERT_EQ(RdmaRead(dst.data(), dst_mr->lkey, src, old_mr->rkey, kLen), "");
  EXPECT_EQ(dst, old_bytes);
  mrc_backend_verbs()->dereg(ctx_, old_h);

  // A fresh registration reads what is in memory now.
  void *new_h = nullptr;
  ASSERT_EQ(mrc_backend_verbs()->reg(ctx_, src, kLen, MRC_PROT_READ, &new_h, &key), MRC_OK)
      << mrc_backend_last_error();
  std::fill(dst.begin(), dst.end(), '\0');
  ASSERT_EQ(RdmaRead(dst.data(), dst_mr->lkey, src, mrc_verbs_handle_mr(new_h)->rkey, kLen), "");
  EXPECT_EQ(dst, new_bytes);

  mrc_backend_verbs()->dereg(ctx_, new_h);
  ibv_dereg_mr(dst_mr);
  munmap(src, kLen);
}

#endif  // MRC_TEST_WITH_VERBS

}  // namespace
