// SPDX-License-Identifier: BSD-3-Clause
// The registration engine under test and the plugin the harness puts in front of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/stress/options.h"

struct ibv_context;
struct ibv_pd;

namespace stress {

// Page frames of a registration, read from /proc/self/pagemap right after it was made.
struct FrameRecord {
  void *inner = nullptr;  // the real backend's handle
  uintptr_t start = 0;
  size_t len = 0;
  std::vector<uint64_t> frames;  // one per page; 0 = not present
};

// Who made a registration and when: for the stale report.
struct RegistrationInfo {
  uintptr_t start = 0;
  size_t len = 0;
  uint64_t time_ns = 0;  // since the start of the run
  int worker = -1;       // the worker whose get registered it (-1: not a worker)
  int slot = -1;         // the slot that worker held
};

// A plugin in front of the real backend: counts registrations (for the leak check), injects
// failures with a seeded probability, remembers who registered what, and for the pfn oracle
// records page frames.
//
// SYNCHRONIZATION: reg/dereg/describe run on any application thread (the cache calls them
// concurrently); the counters are relaxed atomics (statistics, read after the threads are
// joined or as a rough progress figure); attempts_ numbers the draws so that the N-th attempt's
// fate depends only on (seed, N). live_mutex_ guards live_ (reg inserts, dereg erases, the
// stale report looks up; never held across a call into the real backend). The thread context
// (set_thread_context) is thread-local. Everything else is const after construction.
class Instrumented {
 public:
  struct Config {
    const mrc_backend_t *inner = nullptr;
    void *inner_ctx = nullptr;
    double fail_rate = 0;
    uint64_t seed = 0;
    int pagemap_fd = -1;  // >= 0: record page frames (handles become FrameRecord *)
  };
  explicit Instrumented(const Config &config);
  Instrumented(const Instrumented &) = delete;
  Instrumented &operator=(const Instrumented &) = delete;

  const mrc_backend_t *ops() const { return &ops_; }
  void *ctx() { return this; }
  // The real backend's handle behind a handle the cache holds.
  void *inner_handle(void *handle) const;
  const FrameRecord *frames(void *handle) const;

  uint64_t registrations() const { return registrations_.load(std::memory_order_relaxed); }
  uint64_t deregistrations() const { return deregistrations_.load(std::memory_order_relaxed); }
  uint64_t injected() const { return injected_.load(std::memory_order_relaxed); }
  uint64_t inner_failures() const { return inner_failures_.load(std::memory_order_relaxed); }
  uint64_t live_bytes() const { return live_bytes_.load(std::memory_order_relaxed); }

  // Registration times count from here.
  void set_origin(uint64_t origin_ns) { origin_ns_ = origin_ns; }
  // What the calling thread is doing, recorded with the registrations it causes.
  static void set_thread_context(int worker, int slot);
  std::optional<RegistrationInfo> lookup(void *handle) const;

 private:
  static mrc_status_t reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                          uint64_t *key);
  static void dereg(void *ctx, void *handle);
  static int describe(void *ctx, void *handle, char *buf, size_t len);

  Config config_;
  mrc_backend_t ops_{};
  std::atomic<uint64_t> attempts_{0}, registrations_{0}, deregistrations_{0}, injected_{0},
      inner_failures_{0}, live_bytes_{0};
  uint64_t origin_ns_ = 0;
  mutable std::mutex live_mutex_;
  std::unordered_map<void *, RegistrationInfo> live_;
};

// Reads the frames of [start, start+len) (page-aligned); false on a read error.
bool read_frames(int pagemap_fd, uintptr_t start, size_t len, uint64_t *frames);
// Whether /proc/self/pagemap shows frame numbers to this process (CAP_SYS_ADMIN); why not.
bool frames_visible(std::string *why);

// An RDMA device opened for the verbs backend and the rdma oracle.
struct VerbsDevice {
  ibv_context *context = nullptr;
  ibv_pd *pd = nullptr;
  std::string name;
  int gid_index = 0;
  ~VerbsDevice();
};
// Opens `name` (empty: the first device). nullptr and *error when there is none or it fails.
std::unique_ptr<VerbsDevice> open_verbs_device(const std::string &name, int gid_index,
                                               std::string *error);

// The engine, its context and the instrumentation, created and destroyed together.
class BackendSetup {
 public:
  struct Config {
    Backend backend = Backend::kIouring;
    double fail_rate = 0;
    uint64_t seed = 0;
    int pagemap_fd = -1;  // record frames (pfn oracle)
    std::string rdma_device;
    int gid_index = 0;
    unsigned iouring_slots = 0;  // 0 = the backend's default
  };
  static std::unique_ptr<BackendSetup> create(const Config &config, std::string *error);
  ~BackendSetup();

  const mrc_backend_t *backend() const { return instrumented_->ops(); }
  void *backend_ctx() const { return instrumented_->ctx(); }
  Instrumented &instrumented() { return *instrumented_; }
  mrc_iouring_ctx_t *iouring() const { return iouring_; }
  VerbsDevice *verbs() const { return verbs_device_.get(); }
  Backend kind() const { return config_.backend; }
  // Failures injected on purpose (by the null context or by the wrapper).
  uint64_t injected() const;
  // After mrc_cache_destroy: registrations the engine still holds, one line each.
  std::vector<std::string> leaks() const;

 private:
  BackendSetup() = default;
  Config config_;
  mrc_null_ctx_t *null_ctx_ = nullptr;
  mrc_iouring_ctx_t *iouring_ = nullptr;
  std::unique_ptr<VerbsDevice> verbs_device_;
  mrc_verbs_ctx_t *verbs_ = nullptr;
  std::unique_ptr<Instrumented> instrumented_;
};

}  // namespace stress
