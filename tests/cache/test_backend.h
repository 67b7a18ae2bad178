// SPDX-License-Identifier: BSD-3-Clause
// A plugin backend for the cache tests: counts calls, records the first word of the memory it
// registers (a stamp the tests write into each fresh mapping), fails on demand.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <utility>

#include "mrcache/mrcache.h"

namespace mrc::test {

struct Registration {
  uintptr_t start;
  size_t length;
  unsigned prot;
  uint64_t stamp;  // stamp_source(start) at registration time (0 without a source)
  uint64_t serial;
};

class CountingBackend {
 public:
  CountingBackend();
  const mrc_backend_t *ops() const { return &ops_; }
  void *ctx() { return this; }
  mrc_cache_params_t params(const char *name = "test");

  std::atomic<uint64_t> regs{0}, deregs{0}, failures{0};
  std::atomic<bool> fail_all{false};
  // What a failing registration returns.
  std::atomic<mrc_status_t> fail_status{MRC_ERR_BACKEND};
  // Called at registration with the start address; its result is recorded in the handle.
  std::atomic<uint64_t (*)(uintptr_t)> stamp_source{nullptr};
  // How long each registration takes (a NIC's registration of a large buffer takes
  // milliseconds): the churn learner weighs it against watching.
  std::atomic<uint32_t> reg_delay_us{0};
  // The same as a busy wait of so many os::ticks() (precise where a sleep overshoots).
  std::atomic<uint64_t> reg_spin_ticks{0};
  // The longest a registration's delay and busy wait took, in os::ticks(): a loaded host that
  // preempts the wait stretches what the cache measures of it.
  std::atomic<uint64_t> longest_wait_ticks{0};
  // Ranges that fail to register (exact match of start).
  std::mutex mutex;
  std::set<uintptr_t> failing_starts;
  std::set<uint64_t> live;  // serials registered and not yet deregistered

  // The serial the next registration will get: keys below it were handed out already.
  uint64_t next_serial() const { return next_serial_.load(std::memory_order_seq_cst); }
  uint64_t live_count() {
    std::lock_guard lock(mutex);
    return live.size();
  }

 private:
  static mrc_status_t reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                          uint64_t *key);
  static void dereg(void *ctx, void *handle);
  mrc_backend_t ops_;
  std::atomic<uint64_t> next_serial_{1};
};

inline const Registration *registration_of(mrc_region_t *region) {
  return static_cast<const Registration *>(mrc_region_handle(region));
}

}  // namespace mrc::test
