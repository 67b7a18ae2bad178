// SPDX-License-Identifier: BSD-3-Clause
// A registration backend in front of mrcache's verbs backend that remembers the remote keys it
// handed out: which are live, and the latest ones deregistered, so that the stress can have a
// peer try them (a key that still works after its deregistration lets another node into
// memory that is no longer the registration's).
//
// THREADS: reg and dereg run on whichever thread the cache or the path calls them from (the
// rank's main thread, the cache's deferred deregistrations); mutex_ guards the sets. Never
// held across a call into the verbs backend.
#pragma once

#include <cstdint>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include "mrcache/backends.h"

struct ibv_mr;

namespace mrc_mpi {

class KeyLedger {
 public:
  struct DeadKey {
    uint32_t rkey = 0;
    uint64_t addr = 0;
  };

  // REMOTE_READ and REMOTE_WRITE on every registration of pd.
  explicit KeyLedger(ibv_pd *pd);
  ~KeyLedger();
  KeyLedger(const KeyLedger &) = delete;
  KeyLedger &operator=(const KeyLedger &) = delete;

  // The table and context to register through (a cache's backend or called directly).
  const mrc_backend_t *ops() const { return &ops_; }
  void *ctx() { return this; }
  // The memory region of a handle reg returned.
  static ibv_mr *mr(void *handle);

  // Up to `max` deregistered keys, removed from the ledger, none equal to a live key (the
  // device may have handed the same key to a new registration).
  std::vector<DeadKey> take_dead(size_t max);
  uint64_t live() const;
  uint64_t registrations() const;

 private:
  static mrc_status_t reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                          uint64_t *key);
  static void dereg(void *ctx, void *handle);

  mrc_verbs_ctx_t *verbs_ = nullptr;
  mrc_backend_t ops_{};
  mutable std::mutex mutex_;
  std::unordered_map<uint32_t, uint32_t> live_;  // rkey -> registrations holding it
  std::vector<DeadKey> dead_;                    // a window of the latest
  uint64_t registrations_ = 0;
  std::mt19937_64 rng_{12345};
};

}  // namespace mrc_mpi
