// SPDX-License-Identifier: BSD-3-Clause
// One FI_EP_RDM endpoint of verbs;ofi_rxm on one domain (an rxe device), with its own address
// vector and one completion queue for sends, receives and RMA. No FI_MR_LOCAL: ofi_rxm registers
// the application's buffers itself, through the verbs domain and so through libfabric's MR cache.
// Every wait is bounded; a failure throws RunError.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace fi_oracle {

class Endpoint {
 public:
  Endpoint(const std::string &domain_name, bool rma, double op_timeout);
  ~Endpoint();
  Endpoint(const Endpoint &) = delete;
  Endpoint &operator=(const Endpoint &) = delete;

  std::vector<uint8_t> name() const;
  fi_addr_t insert_peer(const std::vector<uint8_t> &name);
  // "provider domain addr-format mr_mode" of the info the endpoint was opened with.
  std::string describe() const;

  // A registration of `buf` for remote reads and writes; returns its key (the address is `buf`:
  // FI_MR_VIRT_ADDR).
  uint64_t register_target(void *buf, size_t len);

  // Each posts one operation and waits for its completion (op_timeout).
  void send(const void *buf, size_t len, fi_addr_t peer, uint64_t tag);
  void recv(void *buf, size_t len, fi_addr_t peer, uint64_t tag);
  void write(const void *buf, size_t len, fi_addr_t peer, uint64_t addr, uint64_t key);
  void read(void *buf, size_t len, fi_addr_t peer, uint64_t addr, uint64_t key);

 private:
  void wait(void *context, const char *what);

  fi_info *info_ = nullptr;
  fid_fabric *fabric_ = nullptr;
  fid_domain *domain_ = nullptr;
  fid_av *av_ = nullptr;
  fid_cq *cq_ = nullptr;
  fid_ep *ep_ = nullptr;
  fid_mr *target_mr_ = nullptr;
  bool blocking_cq_ = true;
  std::chrono::duration<double> op_timeout_;
};

}  // namespace fi_oracle
