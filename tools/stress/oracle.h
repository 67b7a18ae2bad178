// SPDX-License-Identifier: BSD-3-Clause
// Oracles: independent proof that a region the cache handed out maps the memory there now.
//
// Every oracle works on stamps: 16 fresh bytes written into the range right before the check,
// in the worker's own lane of each sampled page (lane = 32 bytes at worker * 32), so that
// workers checking the same memory at once never touch each other's bytes.
//   iouring  IORING_OP_WRITE_FIXED of the stamp through the region's buffer index into a memfd,
//            read back: a stale registration pins the old pages and writes their old bytes.
//   pfn      the frame mapped at the stamp now must be the one recorded at registration.
//   rdma     an RDMA READ of the stamp through the region's rkey on a loopback RC QP.
//   none     checks only that the region covers the request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/stress/util.h"

namespace stress {

class Instrumented;
struct VerbsDevice;

struct CheckResult {
  enum Kind { kOk, kStale, kError, kUnchecked };
  Kind kind = kOk;
  uintptr_t address = 0;  // the stamp that failed
  std::string detail;     // expected versus found, or the error
  unsigned pages = 0;     // pages checked
};

// One per worker thread (its scratch file, its queue pair, its lane).
class OracleThread {
 public:
  virtual ~OracleThread() = default;
  // REQUIRES: [start, start+len) lies inside the region, and no mutation of it can run until
  // the check returns (the caller holds the slot's lock).
  virtual CheckResult check(mrc_region_t *region, uintptr_t start, size_t len, Rng &rng) = 0;
};

class Oracle {
 public:
  virtual ~Oracle() = default;
  virtual const char *name() const = 0;
  // lane: the worker's index (0..127). nullptr and *error when the thread cannot be set up.
  virtual std::unique_ptr<OracleThread> thread(unsigned lane, std::string *error) = 0;
};

constexpr unsigned kMaxLanes = 128;
constexpr size_t kLaneBytes = 32;
constexpr size_t kStampBytes = 16;

// Addresses of up to `count` stamps inside [start, start+len): the first and last page that
// hold the lane whole, then random others.
std::vector<uintptr_t> stamp_sites(uintptr_t start, size_t len, unsigned lane, unsigned count,
                                   Rng &rng);
// A stamp no earlier check of this process wrote.
void make_stamp(unsigned lane, unsigned char out[kStampBytes]);
std::string hex(const unsigned char *bytes, size_t len);

std::unique_ptr<Oracle> make_iouring_oracle(mrc_iouring_ctx_t *ctx, const Instrumented *wrap,
                                            unsigned check_pages);
std::unique_ptr<Oracle> make_pfn_oracle(const Instrumented *wrap, int pagemap_fd,
                                        unsigned check_pages);
std::unique_ptr<Oracle> make_rdma_oracle(VerbsDevice *device, const Instrumented *wrap,
                                         unsigned check_pages);
std::unique_ptr<Oracle> make_no_oracle();

}  // namespace stress
