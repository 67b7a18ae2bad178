// SPDX-License-Identifier: BSD-3-Clause
// The RDMA side of mrcache-mpi: one device, one protection domain, and reliable-connected queue
// pairs to every other rank, connected by exchanging their addresses over MPI.
//
// THREADS: one thread per process (the rank's main thread) calls everything. Each queue pair
// has its own completion queue, so a batch on one never sees another's completions.
#pragma once

#include <infiniband/verbs.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mrc_mpi {

// One RDMA READ or WRITE of a batch: local memory (registered, lkey) and remote memory (rkey).
struct RdmaOp {
  ibv_wr_opcode opcode = IBV_WR_RDMA_READ;
  void *local = nullptr;
  uint32_t lkey = 0;
  uint64_t remote = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
};

class Fabric {
 public:
  // Opens `device` ("" = the first one), a protection domain, and `qps_per_peer` RC queue pairs
  // towards every other rank of comm (collective: every rank calls it). gid_index < 0 picks
  // the port's addressing: LID on InfiniBand, GID index 0 on Ethernet (RoCE). Throws
  // std::runtime_error with the reason.
  Fabric(MPI_Comm comm, const std::string &device, int gid_index, int qps_per_peer);
  ~Fabric();
  Fabric(const Fabric &) = delete;
  Fabric &operator=(const Fabric &) = delete;

  ibv_pd *pd() const { return pd_; }
  const std::string &device_name() const { return device_name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Posts every op on queue pair `index` towards `peer`, then waits for all their completions
  // (at most timeout_s). Returns one status per op, in order; after the first error the rest
  // are IBV_WC_WR_FLUSH_ERR, and the queue pair stays in the error state until renew().
  // Throws std::runtime_error on a post failure or a time-out.
  std::vector<ibv_wc_status> run(int peer, int index, const std::vector<RdmaOp> &ops,
                                 double timeout_s = 60);
  // Replaces queue pairs that saw an error with new ones, connected again: those at indexes
  // `a` towards peer_a and `b` towards peer_b (peer_a may be peer_b). The peers call it at the
  // same time with the mirror image (their `b` towards this rank is this rank's `a`): a
  // collective of the three. New queue pairs rather than a reset: resetting one whose error is
  // still being processed by a software device left it in the error state.
  void renew(MPI_Comm comm, int peer_a, const std::vector<int> &a, int peer_b,
             const std::vector<int> &b);

 private:
  struct Wire {  // what a queue pair's peer needs to connect to it; travels as MPI_BYTE
    uint32_t qpn = 0;
    uint32_t psn = 0;
    uint16_t lid = 0;
    uint8_t gid[16] = {};
  };
  struct Link {
    ibv_cq *cq = nullptr;
    ibv_qp *qp = nullptr;
    Wire local;
    Wire remote;
  };
  Link &link(int peer, int index);
  void create(Link &link);
  static void destroy(Link &link);
  size_t slot(int peer, int index) const {
    return static_cast<size_t>(peer) * static_cast<size_t>(qps_per_peer_) +
           static_cast<size_t>(index);
  }
  void connect(Link &link);

  int rank_ = 0;
  int size_ = 0;
  int qps_per_peer_ = 0;
  std::string device_name_;
  ibv_context *context_ = nullptr;
  ibv_pd *pd_ = nullptr;
  ibv_port_attr port_{};
  int gid_index_ = -1;
  ibv_gid gid_{};
  uint8_t max_rd_atomic_ = 1;
  std::vector<Link> links_;  // [peer * qps_per_peer + index]; the entries for rank_ stay empty
};

}  // namespace mrc_mpi
