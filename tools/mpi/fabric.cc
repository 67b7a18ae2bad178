// SPDX-License-Identifier: BSD-3-Clause
#include "tools/mpi/fabric.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace mrc_mpi {

namespace {

constexpr int kMaxBatch = 256;         // send queue depth: the most work requests of one run()
constexpr uint32_t kChunk = 64 << 10;  // bytes per work request
// RDMA READs in flight per queue pair: with kChunk, at most 256 KiB of responses in one burst.
constexpr int kMaxReadsInFlight = 4;

std::runtime_error failure(const std::string &what) {
  return std::runtime_error(what + ": " + strerrordesc_np(errno));
}

}  // namespace

Fabric::Fabric(MPI_Comm comm, const std::string &device, int gid_index, int qps_per_peer)
    : qps_per_peer_(qps_per_peer), gid_index_(gid_index) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  int count = 0;
  ibv_device **list = ibv_get_device_list(&count);
  ibv_device *chosen = nullptr;
  for (int i = 0; i < count; ++i) {
    if (device.empty() || device == ibv_get_device_name(list[i])) {
      chosen = list[i];
      break;
    }
  }
  if (chosen == nullptr) {
    if (list != nullptr) ibv_free_device_list(list);
    throw std::runtime_error(device.empty() ? "no RDMA device (ibv_get_device_list found none)"
                                            : "no RDMA device named " + device);
  }
  device_name_ = ibv_get_device_name(chosen);
  context_ = ibv_open_device(chosen);
  ibv_free_device_list(list);
  if (context_ == nullptr) throw failure("ibv_open_device(" + device_name_ + ")");
  pd_ = ibv_alloc_pd(context_);
  if (pd_ == nullptr) throw failure("ibv_alloc_pd");
  if (ibv_query_port(context_, 1, &port_) != 0) throw failure("ibv_query_port");
  ibv_device_attr attr{};
  if (ibv_query_device(context_, &attr) != 0) throw failure("ibv_query_device");
  max_rd_atomic_ = static_cast<uint8_t>(std::clamp(attr.max_qp_rd_atom, 1, kMaxReadsInFlight));
  if (gid_index_ < 0 && port_.link_layer == IBV_LINK_LAYER_ETHERNET) gid_index_ = 0;
  if (gid_index_ >= 0 && ibv_query_gid(context_, 1, gid_index_, &gid_) != 0) {
    throw failure("ibv_query_gid(" + device_name_ + ", index " + std::to_string(gid_index_) + ")");
  }

  links_.resize(slot(size_, 0));
  std::vector<Wire> outgoing(links_.size()), incoming(links_.size());
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    for (int index = 0; index < qps_per_peer_; ++index) {
      Link &l = link(peer, index);
      create(l);
      outgoing[slot(peer, index)] = l.local;
    }
  }
  // Rank r's block for peer p goes to p, which connects its own queue pairs to them in order.
  const int block = static_cast<int>(sizeof(Wire)) * qps_per_peer_;
  MPI_Alltoall(outgoing.data(), block, MPI_BYTE, incoming.data(), block, MPI_BYTE, comm);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    for (int index = 0; index < qps_per_peer_; ++index) {
      Link &l = link(peer, index);
      l.remote = incoming[slot(peer, index)];
      connect(l);
    }
  }
  // No rank may send before its peers' queue pairs are ready to receive.
  MPI_Barrier(comm);
}

void Fabric::create(Link &l) {
  l.cq = ibv_create_cq(context_, 2 * kMaxBatch, nullptr, nullptr, 0);
  if (l.cq == nullptr) throw failure("ibv_create_cq");
  ibv_qp_init_attr init{};
  init.send_cq = l.cq;
  init.recv_cq = l.cq;
  init.cap.max_send_wr = kMaxBatch;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 1;
  l.qp = ibv_create_qp(pd_, &init);
  if (l.qp == nullptr) throw failure("ibv_create_qp");
  l.local.qpn = l.qp->qp_num;
  l.local.psn = (l.qp->qp_num * 2654435761U) & 0xffffff;
  l.local.lid = port_.lid;
  memcpy(l.local.gid, gid_.raw, sizeof l.local.gid);
}

void Fabric::destroy(Link &l) {
  if (l.qp != nullptr) ibv_destroy_qp(l.qp);
  if (l.cq != nullptr) ibv_destroy_cq(l.cq);
  l.qp = nullptr;
  l.cq = nullptr;
}

Fabric::~Fabric() {
  for (Link &l : links_) destroy(l);
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (context_ != nullptr) ibv_close_device(context_);
}

Fabric::Link &Fabric::link(int peer, int index) {
  if (peer < 0 || peer >= size_ || peer == rank_ || index < 0 || index >= qps_per_peer_) {
    throw std::runtime_error("no queue pair " + std::to_string(index) + " towards rank " +
                             std::to_string(peer));
  }
  return links_[slot(peer, index)];
}

void Fabric::connect(Link &l) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(l.qp, &attr,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    throw failure("queue pair to INIT");
  }
  attr = {};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = port_.active_mtu;
  attr.dest_qp_num = l.remote.qpn;
  attr.rq_psn = l.remote.psn;
  attr.max_dest_rd_atomic = max_rd_atomic_;
  attr.min_rnr_timer = 12;
  attr.ah_attr.dlid = l.remote.lid;
  attr.ah_attr.port_num = 1;
  if (gid_index_ >= 0) {
    attr.ah_attr.is_global = 1;
    memcpy(attr.ah_attr.grh.dgid.raw, l.remote.gid, sizeof l.remote.gid);
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index_);
    attr.ah_attr.grh.hop_limit = 64;
  }
  if (ibv_modify_qp(l.qp, &attr,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    throw failure("queue pair to RTR (GID index " + std::to_string(gid_index_) +
                  "; --gid-index or RXE_GID picks another)");
  }
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 18;  // ~1 s per try: emulated guests stall for tens of milliseconds
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;
  attr.sq_psn = l.local.psn;
  attr.max_rd_atomic = max_rd_atomic_;
  if (ibv_modify_qp(l.qp, &attr,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    throw failure("queue pair to RTS");
  }
}

void Fabric::renew(MPI_Comm comm, int peer_a, const std::vector<int> &a, int peer_b,
                   const std::vector<int> &b) {
  auto fresh = [&](int peer, const std::vector<int> &indexes) {
    std::vector<Wire> wires;
    for (int index : indexes) {
      Link &l = link(peer, index);
      destroy(l);
      create(l);
      wires.push_back(l.local);
    }
    return wires;
  };
  auto bytes = [](const std::vector<Wire> &w) { return static_cast<int>(w.size() * sizeof(Wire)); };
  if (peer_a == peer_b) {
    // One queue pair per index serves both directions: renew the union once.
    std::vector<int> both(a);
    both.insert(both.end(), b.begin(), b.end());
    std::sort(both.begin(), both.end());
    both.erase(std::unique(both.begin(), both.end()), both.end());
    const std::vector<Wire> to = fresh(peer_a, both);
    std::vector<Wire> from(both.size());
    MPI_Sendrecv(to.data(), bytes(to), MPI_BYTE, peer_a, 20, from.data(), bytes(from), MPI_BYTE,
                 peer_a, 20, comm, MPI_STATUS_IGNORE);
    for (size_t i = 0; i < both.size(); ++i) {
      link(peer_a, both[i]).remote = from[i];
      connect(link(peer_a, both[i]));
    }
    return;
  }
  const std::vector<Wire> to_a = fresh(peer_a, a), to_b = fresh(peer_b, b);
  std::vector<Wire> from_a(a.size()), from_b(b.size());
  // peer_a renews its queue pairs towards this rank as its `b`, and the other way round.
  MPI_Sendrecv(to_a.data(), bytes(to_a), MPI_BYTE, peer_a, 20, from_b.data(), bytes(from_b),
               MPI_BYTE, peer_b, 20, comm, MPI_STATUS_IGNORE);
  MPI_Sendrecv(to_b.data(), bytes(to_b), MPI_BYTE, peer_b, 21, from_a.data(), bytes(from_a),
               MPI_BYTE, peer_a, 21, comm, MPI_STATUS_IGNORE);
  for (size_t i = 0; i < a.size(); ++i) {
    link(peer_a, a[i]).remote = from_a[i];
    connect(link(peer_a, a[i]));
  }
  for (size_t i = 0; i < b.size(); ++i) {
    link(peer_b, b[i]).remote = from_b[i];
    connect(link(peer_b, b[i]));
  }
}

std::vector<ibv_wc_status> Fabric::run(int peer, int index, const std::vector<RdmaOp> &ops,
                                       double timeout_s) {
  // Work requests of at most kChunk bytes, as a runtime's transport splits large transfers:
  // a software device's bursts then stay within what its wire (UDP between two guests) buffers.
  struct Piece {
    RdmaOp op;
    size_t of = 0;  // the caller's op
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < ops.size(); ++i) {
    uint32_t done = 0;
    do {
      RdmaOp piece = ops[i];
      piece.length = std::min(kChunk, ops[i].length - done);
      piece.local = static_cast<uint8_t *>(ops[i].local) + done;
      piece.remote = ops[i].remote + done;
      pieces.push_back({piece, i});
      done += piece.length;
    } while (done < ops[i].length);
  }
  if (pieces.size() > static_cast<size_t>(kMaxBatch)) {
    throw std::runtime_error("a batch of " + std::to_string(pieces.size()) +
                             " RDMA work requests (at most " + std::to_string(kMaxBatch) + ")");
  }
  Link &l = link(peer, index);
  std::vector<ibv_sge> sges(pieces.size());
  std::vector<ibv_send_wr> wrs(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const RdmaOp &op = pieces[i].op;
    sges[i] = {reinterpret_cast<uintptr_t>(op.local), op.length, op.lkey};
    wrs[i] = {};
    wrs[i].wr_id = i;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].opcode = op.opcode;
    wrs[i].wr.rdma.remote_addr = op.remote;
    wrs[i].wr.rdma.rkey = op.rkey;
    wrs[i].next = i + 1 < pieces.size() ? &wrs[i + 1] : nullptr;
  }
  std::vector<ibv_wc_status> result(ops.size(), IBV_WC_SUCCESS);
  if (pieces.empty()) return result;
  ibv_send_wr *bad = nullptr;
  if (ibv_post_send(l.qp, wrs.data(), &bad) != 0) throw failure("ibv_post_send");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  size_t done = 0;
  unsigned idle = 0;
  while (done < pieces.size()) {
    ibv_wc wc[16];
    const int n = ibv_poll_cq(l.cq, 16, wc);
    if (n < 0) throw std::runtime_error("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      // An op's status is its first failed piece's; flushes come after the error itself.
      if (wc[i].wr_id >= pieces.size()) continue;
      ibv_wc_status &status = result[pieces[wc[i].wr_id].of];
      if (status == IBV_WC_SUCCESS || status == IBV_WC_WR_FLUSH_ERR) status = wc[i].status;
    }
    done += static_cast<size_t>(n);
    if (n > 0) {
      idle = 0;
      continue;
    }
    // A software RDMA device (rxe) does its work in kernel threads on the same CPUs: after a
    // short spin, give them the CPU, and sleep once the wait is long.
    ++idle;
    if (idle > 4096) {
      usleep(50);
    } else if (idle > 64) {
      sched_yield();
    }
    if ((idle & 1023) == 0 && std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("RDMA batch of " + std::to_string(ops.size()) + " towards rank " +
                               std::to_string(peer) + ": no completion within " +
                               std::to_string(timeout_s) + " s");
    }
  }
  return result;
}

}  // namespace mrc_mpi
