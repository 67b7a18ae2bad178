// SPDX-License-Identifier: BSD-3-Clause
// The registration paths an application can take, over one registration engine: mrcache (exact
// or fast mode), UCX's ucs_rcache (loaded only in its own trials), or no cache at all.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "mrcache/mrcache.h"

namespace appbench {

// The engine every path registers through, so that only the caching differs between paths:
// null (costs nothing) or io_uring fixed buffers (pins the pages, like ibv_reg_mr).
class Engine {
 public:
  // name: "null" or "iouring". Throws std::runtime_error with the reason when it cannot exist.
  explicit Engine(const std::string &name);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;
  const mrc_backend_t *ops() const { return ops_; }
  void *ctx() const { return ctx_; }

 private:
  const mrc_backend_t *ops_ = nullptr;
  void *ctx_ = nullptr;
  mrc_iouring_ctx_t *iouring_ = nullptr;
};

// A registration path. get returns an opaque token for put; a failure throws std::runtime_error
// (a trial that cannot register has no figure). Each path is used by one thread at a time
// except where a workload says otherwise (none do today).
class Path {
 public:
  virtual ~Path() = default;
  virtual void *get(void *addr, size_t len) = 0;
  virtual void put(void *token) = 0;
  // One line of the path's own counters for the trial's record ("" when it has none).
  virtual std::string counters() { return {}; }
};

// name: "exact", "fast" (mrcache), "ucx", "none". Throws std::runtime_error for a path this
// build or machine cannot run ("ucx" without the module), with the reason.
std::unique_ptr<Path> make_path(const std::string &name, const Engine &engine);

}  // namespace appbench
