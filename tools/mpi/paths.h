// SPDX-License-Identifier: BSD-3-Clause
// How a rank registers the memory it exposes to its peers: through mrcache (the exact default
// or the fast opt-in), UCX's ucs_rcache (loaded only in the runs that use it), or no cache
// (ibv_reg_mr and ibv_dereg_mr for every message). Every path registers through one KeyLedger,
// so that they differ only in the caching.
//
// THREADS: a path is used by the rank's main thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tools/mpi/key_ledger.h"

namespace mrc_mpi {

struct Registration {
  void *token = nullptr;  // for put
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

class RegPath {
 public:
  virtual ~RegPath() = default;
  // [addr, addr+len) registered for local and remote read and write. Throws
  // std::runtime_error with the reason.
  virtual Registration get(void *addr, size_t len) = 0;
  virtual void put(const Registration &registration) = 0;
  // The path's own counters as a JSON object ("{}" when it has none).
  virtual std::string counters_json() { return "{}"; }
  // Registrations the path still holds (a cache's unused ones included).
  virtual void purge() {}
};

// name: "exact", "fast", "ucx", "none", or "stale": a cache that never invalidates, the stress
// oracle's control (it must see stale memory). Throws std::runtime_error for an unknown name
// or a path this build cannot run ("ucx" without libucx-dev), with the reason.
std::unique_ptr<RegPath> make_path(const std::string &name, KeyLedger *ledger);

}  // namespace mrc_mpi
