// SPDX-License-Identifier: BSD-3-Clause
#include "tools/mpi/paths.h"

#include <infiniband/verbs.h>

#include <map>
#include <stdexcept>
#include <utility>

#include "tools/ucx-rcache/loader.h"

namespace mrc_mpi {

namespace {

constexpr unsigned kReadWrite = MRC_PROT_READ | MRC_PROT_WRITE;

Registration of_handle(void *token, void *handle) {
  ibv_mr *mr = KeyLedger::mr(handle);
  return {token, mr->lkey, mr->rkey};
}

class NoCache final : public RegPath {
 public:
  explicit NoCache(KeyLedger *ledger) : ledger_(ledger) {}
  Registration get(void *addr, size_t len) override {
    void *handle = nullptr;
    uint64_t key = 0;
    const mrc_status_t status =
        ledger_->ops()->reg(ledger_->ctx(), addr, len, kReadWrite, &handle, &key);
    if (status != MRC_OK) {
      throw std::runtime_error(std::string("ibv_reg_mr: ") + mrc_status_string(status) + " (" +
                               mrc_backend_last_error() + ")");
    }
    return of_handle(handle, handle);
  }
  void put(const Registration &registration) override {
    ledger_->ops()->dereg(ledger_->ctx(), registration.token);
  }

 private:
  KeyLedger *ledger_;
};

// The oracle's control: a cache that never learns of unmaps. It hands out the registration it
// made for the same start and length, whatever became of the memory there since.
class NeverInvalidated final : public RegPath {
 public:
  explicit NeverInvalidated(KeyLedger *ledger) : ledger_(ledger) {}
  ~NeverInvalidated() override {
    for (const auto &[range, handle] : cached_) ledger_->ops()->dereg(ledger_->ctx(), handle);
  }
  Registration get(void *addr, size_t len) override {
    void *&handle = cached_[{addr, len}];
    if (handle == nullptr) {
      uint64_t key = 0;
      const mrc_status_t status =
          ledger_->ops()->reg(ledger_->ctx(), addr, len, kReadWrite, &handle, &key);
      if (status != MRC_OK) {
        cached_.erase({addr, len});
        throw std::runtime_error(std::string("ibv_reg_mr: ") + mrc_status_string(status));
      }
    }
    return of_handle(handle, handle);
  }
  void put(const Registration &) override {}

 private:
  KeyLedger *ledger_;
  std::map<std::pair<void *, size_t>, void *> cached_;
};

class Mrcache final : public RegPath {
 public:
  Mrcache(KeyLedger *ledger, bool fast) {
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    params.name = fast ? "mrcache-mpi-fast" : "mrcache-mpi-exact";
    params.backend = ledger->ops();
    params.backend_ctx = ledger->ctx();
    if (fast) params.flags |= MRC_FLAG_ORDERED_UNMAPS;
    const mrc_status_t status = mrc_cache_create(&params, &cache_);
    if (status != MRC_OK) {
      throw std::runtime_error(std::string("mrc_cache_create: ") + mrc_status_string(status) +
                               " (" + mrc_last_error() + ")");
    }
  }
  ~Mrcache() override { mrc_cache_destroy(cache_); }
  Registration get(void *addr, size_t len) override {
    mrc_region_t *region = nullptr;
    const mrc_status_t status = mrc_get(cache_, addr, len, kReadWrite, &region);
    if (status != MRC_OK) {
      throw std::runtime_error(std::string("mrc_get: ") + mrc_status_string(status) + " (" +
                               mrc_last_error() + ")");
    }
    return of_handle(region, mrc_region_handle(region));
  }
  void put(const Registration &registration) override {
    mrc_put(cache_, static_cast<mrc_region_t *>(registration.token));
  }
  std::string counters_json() override {
    char buf[4096];
    const int n = mrc_cache_stats_json(cache_, buf, sizeof buf);
    return n > 0 && static_cast<size_t>(n) < sizeof buf ? std::string(buf, static_cast<size_t>(n))
                                                        : "{}";
  }
  void purge() override { mrc_cache_purge(cache_); }

 private:
  mrc_cache_t *cache_ = nullptr;
};

class Ucx final : public RegPath {
 public:
  explicit Ucx(KeyLedger *ledger) : rcache_(ledger->ops(), ledger->ctx()) {}
  Registration get(void *addr, size_t len) override {
    void *region = rcache_.get(addr, len);
    return of_handle(region, rcache_.engine_handle(region));
  }
  void put(const Registration &registration) override { rcache_.put(registration.token); }
  std::string counters_json() override {
    return std::string("{\"ucx\": \"") + rcache_.version() + "\"}";
  }

 private:
  mrc_tools::UcxRcache rcache_;
};

}  // namespace

std::unique_ptr<RegPath> make_path(const std::string &name, KeyLedger *ledger) {
  if (name == "exact") return std::make_unique<Mrcache>(ledger, false);
  if (name == "fast") return std::make_unique<Mrcache>(ledger, true);
  if (name == "none") return std::make_unique<NoCache>(ledger);
  if (name == "ucx") return std::make_unique<Ucx>(ledger);
  if (name == "stale") return std::make_unique<NeverInvalidated>(ledger);
  throw std::runtime_error("unknown path '" + name + "' (exact, fast, ucx, none, stale)");
}

}  // namespace mrc_mpi
