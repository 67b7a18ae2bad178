// SPDX-License-Identifier: BSD-3-Clause
#include "tools/fi-oracle/fabric.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "tools/fi-oracle/config.h"

namespace fi_oracle {
namespace {

constexpr const char *kProvider = "verbs;ofi_rxm";

[[noreturn]] void fail(const std::string &call, ssize_t ret) {
  throw RunError{call + ": " + fi_strerror(static_cast<int>(-ret)) + " (" + std::to_string(ret) +
                 ")"};
}

void check(const char *call, ssize_t ret) {
  if (ret != 0) fail(call, ret);
}

char *dup(const std::string &s) { return strdup(s.c_str()); }

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

Endpoint::Endpoint(const std::string &domain_name, bool rma, double op_timeout)
    : op_timeout_(op_timeout) {
  fi_info *hints = fi_allocinfo();
  if (hints == nullptr) throw RunError{"fi_allocinfo failed"};
  hints->caps = FI_TAGGED | FI_MSG | (rma ? FI_RMA : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = dup(kProvider);
  if (!domain_name.empty()) hints->domain_attr->name = dup(domain_name);
  fi_info *all = nullptr;
  int ret = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &all);
  fi_freeinfo(hints);
  if (ret != 0) {
    fail(std::string("fi_getinfo(") + kProvider + ", domain " +
             (domain_name.empty() ? "any" : domain_name) + ")",
         ret);
  }
  // The IPv6 (link-local) flavour: rdma_cm over RoCE cannot use the AF_IB one. (An addr_format
  // hint does not do: with no node the verbs provider then resolves "localhost" as IPv6.)
  fi_info *pick = all;
  for (fi_info *cur = all; cur != nullptr; cur = cur->next) {
    if (cur->addr_format == FI_SOCKADDR_IN6) {
      pick = cur;
      break;
    }
  }
  info_ = fi_dupinfo(pick);
  fi_freeinfo(all);
  if (info_ == nullptr) throw RunError{"fi_dupinfo failed"};
  check("fi_fabric", fi_fabric(info_->fabric_attr, &fabric_, nullptr));
  check("fi_domain", fi_domain(fabric_, info_, &domain_, nullptr));
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  check("fi_av_open", fi_av_open(domain_, &av_attr, &av_, nullptr));
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = 64;
  cq_attr.wait_obj = FI_WAIT_UNSPEC;
  if (fi_cq_open(domain_, &cq_attr, &cq_, nullptr) != 0) {
    // No wait object: poll (yielding) instead.
    blocking_cq_ = false;
    cq_attr.wait_obj = FI_WAIT_NONE;
    check("fi_cq_open", fi_cq_open(domain_, &cq_attr, &cq_, nullptr));
  }
  check("fi_endpoint", fi_endpoint(domain_, info_, &ep_, nullptr));
  check("fi_ep_bind(av)", fi_ep_bind(ep_, &av_->fid, 0));
  check("fi_ep_bind(cq)", fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV));
  check("fi_enable", fi_enable(ep_));
}

Endpoint::~Endpoint() {
  if (ep_ != nullptr) fi_close(&ep_->fid);
  if (target_mr_ != nullptr) fi_close(&target_mr_->fid);
  if (cq_ != nullptr) fi_close(&cq_->fid);
  if (av_ != nullptr) fi_close(&av_->fid);
  if (domain_ != nullptr) fi_close(&domain_->fid);
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
  if (info_ != nullptr) fi_freeinfo(info_);
}

std::vector<uint8_t> Endpoint::name() const {
  std::vector<uint8_t> out(256);
  size_t len = out.size();
  check("fi_getname", fi_getname(&ep_->fid, out.data(), &len));
  out.resize(len);
  return out;
}

fi_addr_t Endpoint::insert_peer(const std::vector<uint8_t> &name) {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int ret = fi_av_insert(av_, name.data(), 1, &addr, 0, nullptr);
  if (ret != 1) fail("fi_av_insert", ret < 0 ? ret : -FI_EINVAL);
  return addr;
}

std::string Endpoint::describe() const {
  std::string out = info_->fabric_attr->prov_name;
  out += " domain ";
  out += info_->domain_attr->name;
  char buf[256];
  size_t len = sizeof buf;
  std::vector<uint8_t> self = name();
  if (fi_av_straddr(av_, self.data(), buf, &len) != nullptr) {
    out += " address ";
    out += buf;
  }
  uint64_t mode = static_cast<unsigned>(info_->domain_attr->mr_mode);
  char modes[256] = {};
  out += " mr_mode [";
  out += fi_tostr_r(modes, sizeof modes, &mode, FI_TYPE_MR_MODE);
  out += "]";
  return out;
}

uint64_t Endpoint::register_target(void *buf, size_t len) {
  check("fi_mr_reg", fi_mr_reg(domain_, buf, len, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0,
                               &target_mr_, nullptr));
  return fi_mr_key(target_mr_);
}

void Endpoint::send(const void *buf, size_t len, fi_addr_t peer, uint64_t tag) {
  fi_context2 context{};
  auto deadline = std::chrono::steady_clock::now() + op_timeout_;
  for (;;) {
    ssize_t ret = fi_tsend(ep_, buf, len, nullptr, peer, tag, &context);
    if (ret == 0) break;
    if (ret != -FI_EAGAIN) fail("fi_tsend", ret);
    if (std::chrono::steady_clock::now() > deadline) throw RunError{"fi_tsend: EAGAIN", true};
    fi_cq_read(cq_, nullptr, 0);  // progress
  }
  wait(&context, "send");
}

void Endpoint::recv(void *buf, size_t len, fi_addr_t peer, uint64_t tag) {
  fi_context2 context{};
  auto deadline = std::chrono::steady_clock::now() + op_timeout_;
  for (;;) {
    ssize_t ret = fi_trecv(ep_, buf, len, nullptr, peer, tag, 0, &context);
    if (ret == 0) break;
    if (ret != -FI_EAGAIN) fail("fi_trecv", ret);
    if (std::chrono::steady_clock::now() > deadline) throw RunError{"fi_trecv: EAGAIN", true};
    fi_cq_read(cq_, nullptr, 0);
  }
  wait(&context, "receive");
}

void Endpoint::write(const void *buf, size_t len, fi_addr_t peer, uint64_t addr, uint64_t key) {
  fi_context2 context{};
  auto deadline = std::chrono::steady_clock::now() + op_timeout_;
  for (;;) {
    ssize_t ret = fi_write(ep_, buf, len, nullptr, peer, addr, key, &context);
    if (ret == 0) break;
    if (ret != -FI_EAGAIN) fail("fi_write", ret);
    if (std::chrono::steady_clock::now() > deadline) throw RunError{"fi_write: EAGAIN", true};
    fi_cq_read(cq_, nullptr, 0);
  }
  wait(&context, "write");
}

void Endpoint::read(void *buf, size_t len, fi_addr_t peer, uint64_t addr, uint64_t key) {
  fi_context2 context{};
  auto deadline = std::chrono::steady_clock::now() + op_timeout_;
  for (;;) {
    ssize_t ret = fi_read(ep_, buf, len, nullptr, peer, addr, key, &context);
    if (ret == 0) break;
    if (ret != -FI_EAGAIN) fail("fi_read", ret);
    if (std::chrono::steady_clock::now() > deadline) throw RunError{"fi_read: EAGAIN", true};
    fi_cq_read(cq_, nullptr, 0);
  }
  wait(&context, "read");
}

// Operations run one at a time, so the next completion is the one awaited; any other is an
// error of the provider (or of this program).
void Endpoint::wait(void *context, const char *what) {
  auto deadline = std::chrono::steady_clock::now() + op_timeout_;
  for (;;) {
    fi_cq_tagged_entry entry{};
    ssize_t ret =
        blocking_cq_ ? fi_cq_sread(cq_, &entry, 1, nullptr, 100) : fi_cq_read(cq_, &entry, 1);
    if (ret == 1) {
      if (entry.op_context != context) {
        throw RunError{std::string("completion of another operation while waiting for ") + what};
      }
      return;
    }
    if (ret == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(cq_, &err, 0);
      char buf[256];
      const char *detail = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof buf);
      throw RunError{std::string(what) + " completed with an error: " + fi_strerror(err.err) +
                     " (" + (detail != nullptr ? detail : "") + ")"};
    }
    if (ret != -FI_EAGAIN && ret != -FI_ETIMEDOUT)
      fail(std::string("fi_cq_read (") + what + ")", ret);
    if (std::chrono::steady_clock::now() > deadline) {
      throw RunError{std::string("no completion of the ") + what + " within " +
                         seconds(op_timeout_.count()) + " s",
                     true};
    }
    if (!blocking_cq_) std::this_thread::yield();
  }
}

}  // namespace fi_oracle
