// SPDX-License-Identifier: BSD-3-Clause
// The conformance suite's registration engine: a plugin written against mrc_backend_t alone. It
// counts registrations and deregistrations, hands out serial keys (1, 2, 3, ... per backend,
// never reused), records every range it registered, and fails on demand with a status the test
// chooses: always, for the next N calls, or once N registrations are live (a full NIC table).
// Like the engines of UCX's and libfabric's tests it can also refuse memory whose real
// protection does not allow what is asked (a NIC cannot pin read-only pages for write).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

#include "mrcache/mrcache.h"

namespace conformance {

// What one successful reg call registered; its address is the registration's handle.
struct Registered {
  uintptr_t start;
  size_t length;
  unsigned prot;
  uint64_t key;
};

class CountingBackend {
 public:
  CountingBackend();
  CountingBackend(const CountingBackend &) = delete;
  CountingBackend &operator=(const CountingBackend &) = delete;
  ~CountingBackend();

  const mrc_backend_t *ops() const { return &ops_; }
  // mrc_cache_params_init's defaults with this backend, every registration cached
  // (MRC_FLAG_CACHE_CHURN).
  mrc_cache_params_t params(const char *name = "conformance");

  // Every reg fails with `status` until fail_always(MRC_OK).
  void fail_always(mrc_status_t status);
  // The next `count` reg calls fail with `status`, then reg succeeds again.
  void fail_next(unsigned count, mrc_status_t status);
  // reg fails with `status` while `live` registrations or more are live (0 = no limit).
  void limit_live(size_t live, mrc_status_t status);
  // reg fails with MRC_ERR_INVALID when the memory is not mapped with at least `prot`.
  void check_protection(bool on) { check_protection_ = on; }

  uint64_t regs() const { return regs_.load(); }
  uint64_t deregs() const { return deregs_.load(); }
  uint64_t failures() const { return failures_.load(); }
  // Calls of reg, failed or not.
  uint64_t attempts() const { return attempts_.load(); }
  // The key the next registration will get: every region handed out for memory mapped after
  // this call must have a key at least this large (it was registered after the memory existed).
  uint64_t next_key();
  size_t live();
  bool is_live(uint64_t key);
  // Every successful registration, in order.
  std::vector<Registered> history();

  // What the backend recorded for a region's registration.
  static const Registered *of(const mrc_region_t *region) {
    return static_cast<const Registered *>(mrc_region_handle(region));
  }

 private:
  static mrc_status_t reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                          uint64_t *key);
  static void dereg(void *ctx, void *handle);
  static int describe(void *ctx, void *handle, char *buf, size_t len);

  mrc_backend_t ops_{};
  std::atomic<uint64_t> regs_{0}, deregs_{0}, failures_{0}, attempts_{0};
  std::atomic<bool> check_protection_{false};
  std::mutex mutex_;
  mrc_status_t fail_always_ = MRC_OK;  // mutex_
  unsigned fail_next_count_ = 0;       // mutex_
  mrc_status_t fail_next_status_ = MRC_OK;
  size_t live_limit_ = 0;
  mrc_status_t live_limit_status_ = MRC_OK;
  uint64_t next_key_ = 1;
  std::set<uint64_t> live_;
  std::vector<Registered> history_;
};

// Whether every byte of [start, start+len) is mapped with at least `prot` (MRC_PROT_*), from
// /proc/self/maps.
bool memory_allows(uintptr_t start, size_t len, unsigned prot);

}  // namespace conformance
