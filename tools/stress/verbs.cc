// SPDX-License-Identifier: BSD-3-Clause
// The verbs side of the harness: opening the RDMA device and the rdma oracle (an RDMA READ of
// each stamp through the region's rkey, on an RC queue pair connected to itself).
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "tools/stress/backend.h"
#include "tools/stress/oracle.h"

namespace stress {

VerbsDevice::~VerbsDevice() {
  if (pd != nullptr) ibv_dealloc_pd(pd);
  if (context != nullptr) ibv_close_device(context);
}

std::unique_ptr<VerbsDevice> open_verbs_device(const std::string &name, int gid_index,
                                               std::string *error) {
  int count = 0;
  ibv_device **list = ibv_get_device_list(&count);
  if (list == nullptr || count == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    *error =
        "no RDMA device (ibv_get_device_list found none; the verbs lane runs in the rxe VM: "
        "scripts/rxe/vm.sh)";
    return nullptr;
  }
  ibv_device *chosen = nullptr;
  for (int i = 0; i < count; ++i) {
    if (name.empty() || name == ibv_get_device_name(list[i])) {
      chosen = list[i];
      break;
    }
  }
  if (chosen == nullptr) {
    ibv_free_device_list(list);
    *error = "no RDMA device named " + name;
    return nullptr;
  }
  auto device = std::make_unique<VerbsDevice>();
  device->name = ibv_get_device_name(chosen);
  device->gid_index = gid_index;
  device->context = ibv_open_device(chosen);
  ibv_free_device_list(list);
  if (device->context == nullptr) {
    *error = "ibv_open_device(" + device->name + "): " + strerrordesc_np(errno);
    return nullptr;
  }
  device->pd = ibv_alloc_pd(device->context);
  if (device->pd == nullptr) {
    *error = "ibv_alloc_pd(" + device->name + "): " + strerrordesc_np(errno);
    return nullptr;
  }
  return device;
}

namespace {

constexpr int kPollSeconds = 10;

class RdmaOracleThread final : public OracleThread {
 public:
  RdmaOracleThread(VerbsDevice *device, const Instrumented *wrap, unsigned lane, unsigned pages)
      : device_(device), wrap_(wrap), lane_(lane), pages_(pages) {}
  ~RdmaOracleThread() override {
    if (qp_ != nullptr) ibv_destroy_qp(qp_);
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    if (landing_mr_ != nullptr) ibv_dereg_mr(landing_mr_);
  }

  bool init(std::string *error) {
    landing_mr_ = ibv_reg_mr(device_->pd, landing_, sizeof landing_, IBV_ACCESS_LOCAL_WRITE);
    cq_ = ibv_create_cq(device_->context, 4, nullptr, nullptr, 0);
    if (landing_mr_ == nullptr || cq_ == nullptr) {
      *error = std::string("ibv_reg_mr / ibv_create_cq: ") + strerrordesc_np(errno);
      return false;
    }
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.cap.max_send_wr = 4;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 1;
    qp_ = ibv_create_qp(device_->pd, &init);
    if (qp_ == nullptr) {
      *error = std::string("ibv_create_qp: ") + strerrordesc_np(errno);
      return false;
    }
    ibv_port_attr port{};
    ibv_gid gid{};
    if (ibv_query_port(device_->context, 1, &port) != 0 ||
        ibv_query_gid(device_->context, 1, device_->gid_index, &gid) != 0) {
      *error = "ibv_query_port / ibv_query_gid(index " + std::to_string(device_->gid_index) +
               ") failed on " + device_->name;
      return false;
    }
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    attr.qp_access_flags = IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(qp_, &attr,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
      *error = "QP to INIT failed";
      return false;
    }
    attr = {};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = port.active_mtu;
    attr.dest_qp_num = qp_->qp_num;  // loopback: connected to itself
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = gid;
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_->gid_index);
    attr.ah_attr.grh.hop_limit = 1;
    attr.ah_attr.dlid = port.lid;
    attr.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp_, &attr,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
      *error = "QP to RTR failed (GID index " + std::to_string(device_->gid_index) +
               "; set RXE_GID0 or --gid-index)";
      return false;
    }
    attr = {};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = 1;
    if (ibv_modify_qp(qp_, &attr,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
      *error = "QP to RTS failed";
      return false;
    }
    return true;
  }

  CheckResult check(mrc_region_t *region, uintptr_t start, size_t len, Rng &rng) override {
    CheckResult result;
    auto *mr = mrc_verbs_handle_mr(wrap_->inner_handle(mrc_region_handle(region)));
    if (mr == nullptr) {
      result.kind = CheckResult::kError;
      result.detail = "the region has no ibv_mr";
      return result;
    }
    for (uintptr_t site : stamp_sites(start, len, lane_, pages_, rng)) {
      unsigned char stamp[kStampBytes];
      make_stamp(lane_, stamp);
      auto *dst = reinterpret_cast<volatile unsigned char *>(site);
      for (size_t i = 0; i < kStampBytes; ++i) dst[i] = stamp[i];
      std::memset(landing_, 0, sizeof landing_);
      ibv_sge sge{};
      sge.addr = reinterpret_cast<uintptr_t>(landing_);
      sge.length = kStampBytes;
      sge.lkey = landing_mr_->lkey;
      ibv_send_wr wr{};
      wr.wr_id = ++wr_id_;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_READ;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = site;
      wr.wr.rdma.rkey = mr->rkey;
      ibv_send_wr *bad = nullptr;
      result.address = site;
      if (ibv_post_send(qp_, &wr, &bad) != 0) {
        result.kind = CheckResult::kError;
        result.detail = std::string("ibv_post_send: ") + strerrordesc_np(errno);
        return result;
      }
      ibv_wc wc{};
      const time_t deadline = time(nullptr) + kPollSeconds;
      int n = 0;
      while ((n = ibv_poll_cq(cq_, 1, &wc)) == 0 && time(nullptr) < deadline) {
      }
      if (n != 1 || wc.status != IBV_WC_SUCCESS) {
        result.kind = CheckResult::kError;
        result.detail = n != 1 ? "no RDMA READ completion within 10 s"
                               : std::string("RDMA READ failed: ") + ibv_wc_status_str(wc.status);
        return result;
      }
      ++result.pages;
      if (std::memcmp(landing_, stamp, kStampBytes) != 0) {
        result.kind = CheckResult::kStale;
        result.detail = "memory holds " + hex(stamp, kStampBytes) + ", RDMA READ through rkey " +
                        std::to_string(mr->rkey) + " returned " + hex(landing_, kStampBytes);
        return result;
      }
    }
    if (result.pages == 0) result.kind = CheckResult::kUnchecked;
    return result;
  }

 private:
  VerbsDevice *device_;
  const Instrumented *wrap_;
  unsigned lane_, pages_;
  ibv_mr *landing_mr_ = nullptr;
  ibv_cq *cq_ = nullptr;
  ibv_qp *qp_ = nullptr;
  uint64_t wr_id_ = 0;
  alignas(64) unsigned char landing_[64] = {};
};

class RdmaOracle final : public Oracle {
 public:
  RdmaOracle(VerbsDevice *device, const Instrumented *wrap, unsigned pages)
      : device_(device), wrap_(wrap), pages_(pages) {}
  const char *name() const override { return "rdma"; }
  std::unique_ptr<OracleThread> thread(unsigned lane, std::string *error) override {
    auto thread = std::make_unique<RdmaOracleThread>(device_, wrap_, lane, pages_);
    if (!thread->init(error)) return nullptr;
    return thread;
  }

 private:
  VerbsDevice *device_;
  const Instrumented *wrap_;
  unsigned pages_;
};

}  // namespace

std::unique_ptr<Oracle> make_rdma_oracle(VerbsDevice *device, const Instrumented *wrap,
                                         unsigned check_pages) {
  return std::make_unique<RdmaOracle>(device, wrap, check_pages);
}

}  // namespace stress
