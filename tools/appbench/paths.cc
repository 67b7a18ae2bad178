// SPDX-License-Identifier: BSD-3-Clause
// Engines and paths of the application benchmark (paths.h).
#include "tools/appbench/paths.h"

#include <stdexcept>

#include "tools/ucx-rcache/loader.h"

namespace appbench {

namespace {

std::runtime_error failure(const std::string &what) {
  return std::runtime_error(what + ": " + mrc_last_error());
}

// The registration the path hands out: the engine's handle.
struct Registration {
  void *handle = nullptr;
};

// No cache: every message registers and deregisters, as a runtime without a cache does.
class NoCache final : public Path {
 public:
  explicit NoCache(const Engine &engine) : engine_(engine) {}
  void *get(void *addr, size_t len) override {
    uint64_t key = 0;
    void *handle = nullptr;
    if (engine_.ops()->reg(engine_.ctx(), addr, len, MRC_PROT_READ | MRC_PROT_WRITE, &handle,
                           &key) != MRC_OK) {
      throw failure("reg");
    }
    // The handle itself is the token; null's handles may be NULL, which is fine for dereg.
    return handle;
  }
  void put(void *token) override { engine_.ops()->dereg(engine_.ctx(), token); }

 private:
  const Engine &engine_;
};

class Mrcache final : public Path {
 public:
  Mrcache(const Engine &engine, bool fast) {
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    params.name = fast ? "appbench-fast" : "appbench-exact";
    params.backend = engine.ops();
    params.backend_ctx = engine.ctx();
    if (fast) params.flags |= MRC_FLAG_ORDERED_UNMAPS;
    if (mrc_cache_create(&params, &cache_) != MRC_OK) throw failure("mrc_cache_create");
  }
  ~Mrcache() override { mrc_cache_destroy(cache_); }
  void *get(void *addr, size_t len) override {
    mrc_region_t *region = nullptr;
    if (mrc_get(cache_, addr, len, MRC_PROT_READ | MRC_PROT_WRITE, &region) != MRC_OK) {
      throw failure("mrc_get");
    }
    return region;
  }
  void put(void *token) override { mrc_put(cache_, static_cast<mrc_region_t *>(token)); }
  std::string counters() override {
    mrc_stats_t s;
    if (mrc_cache_stats(cache_, &s) != MRC_OK) return {};
    mrc_monitor_info_t info;
    const char *mode = mrc_monitor_info(&info) == MRC_OK ? info.mode_name : "?";
    return std::string("monitor ") + mode + ", hits " + std::to_string(s.hits_fast + s.hits_slow) +
           ", misses " + std::to_string(s.misses) + ", unmap events " +
           std::to_string(s.unmap_events) + ", invalidations " + std::to_string(s.invalidations);
  }

 private:
  mrc_cache_t *cache_ = nullptr;
};

class Ucx final : public Path {
 public:
  explicit Ucx(const Engine &engine) : rcache_(engine.ops(), engine.ctx()) {}
  void *get(void *addr, size_t len) override { return rcache_.get(addr, len); }
  void put(void *token) override { rcache_.put(token); }
  std::string counters() override { return std::string("UCX ") + rcache_.version(); }

 private:
  mrc_tools::UcxRcache rcache_;
};

}  // namespace

Engine::Engine(const std::string &name) {
  if (name == "null") {
    ops_ = mrc_backend_null();
  } else if (name == "iouring") {
    if (mrc_iouring_ctx_create(nullptr, &iouring_) != MRC_OK) {
      throw failure("mrc_iouring_ctx_create");
    }
    ops_ = mrc_backend_iouring();
    ctx_ = iouring_;
  } else {
    throw std::runtime_error("unknown engine '" + name + "' (null, iouring)");
  }
}

Engine::~Engine() {
  if (iouring_ != nullptr) mrc_iouring_ctx_destroy(iouring_);
}

std::unique_ptr<Path> make_path(const std::string &name, const Engine &engine) {
  if (name == "none") return std::make_unique<NoCache>(engine);
  if (name == "exact") return std::make_unique<Mrcache>(engine, false);
  if (name == "fast") return std::make_unique<Mrcache>(engine, true);
  if (name == "ucx") return std::make_unique<Ucx>(engine);
  throw std::runtime_error("unknown path '" + name + "' (exact, fast, ucx, none)");
}

}  // namespace appbench
