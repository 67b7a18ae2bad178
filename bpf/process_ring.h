// SPDX-License-Identifier: BSD-3-Clause
// This process's ring of address-space changes: granted by mrcache-bpfd over its socket, or
// from programs the process loaded itself (root, no daemon). Either way the ring and the lost
// counter are mapped for a RingConsumer (ring.h), and every kind of change is proven by the
// self-test before the ring serves (docs/DESIGN.md, "The eBPF monitor's self-test").
//
// 1. open_*(), close() and forget(): one thread at a time (the monitor's start and stop, under
//    its mutex).
// 2. consumer(): as ring.h says (quiet() from any thread; drain() one thread at a time).
// 3. Only the process that opened it may trust it: a forked child's changes reach no ring. The
//    child forget()s its copy, which frees what the copy holds and ends nothing of the parent's.
#pragma once

#include <sys/types.h>

#include <cstddef>

#include "bpf/loader.h"
#include "bpf/ring.h"
#include "mrcache/mrcache.h"

namespace mrc::bpf {

class ProcessRing {
 public:
  static constexpr size_t kDefaultRingBytes = size_t{1} << 20;

  // Loads the programs, makes this process their client with a ring of `ring_bytes`, maps it
  // and runs the self-test. MRC_ERR_UNSUPPORTED (and the other errors of loader.h) with the
  // reason in mrc_last_error(); nothing stays loaded then.
  [[nodiscard]] static mrc_status_t open_own(size_t ring_bytes, ProcessRing **out) noexcept;
  // Asks the daemon at `socket_path` for a ring (0 bytes: its default), maps it and runs the
  // self-test. MRC_ERR_UNSUPPORTED when no daemon answers there or it refuses, MRC_ERR_IO,
  // MRC_ERR_NO_MEMORY; mrc_last_error() says why.
  [[nodiscard]] static mrc_status_t open_from_daemon(const char *socket_path, size_t ring_bytes,
                                                     ProcessRing **out) noexcept;
  // Ends this process's registration and frees everything.
  void close() noexcept;
  // In a forked child: frees this copy's mappings and descriptors, and ends nothing.
  void forget() noexcept;

  RingConsumer &consumer() noexcept { return consumer_; }
  // The kernel functions the unmap, mremap and madvise programs are attached to.
  Hooks hooks() const noexcept { return {hooks_[0], hooks_[1], hooks_[2]}; }
  bool from_daemon() const noexcept { return socket_ >= 0; }

 private:
  ProcessRing() = default;
  ~ProcessRing() = default;
  // Maps the ring and the lost counters of client_, then runs the self-test.
  [[nodiscard]] mrc_status_t map_and_test(int lost_fd) noexcept;
  void release(bool end_registration) noexcept;

  Programs *programs_ = nullptr;  // loaded by this process (open_own)
  int socket_ = -1;               // the daemon's connection (open_from_daemon)
  int lost_fd_ = -1;              // the daemon's lost counters (ours to close)
  Programs::Client client_{};
  MappedRing ring_;
  void *lost_ = nullptr;
  size_t lost_bytes_ = 0;
  pid_t owner_ = 0;
  char hooks_[3][48] = {};
  RingConsumer consumer_;
};

// Proves each kind of change the cache relies on (munmap, MAP_FIXED over a mapping, a moving
// and a shrinking mremap, madvise(MADV_DONTNEED)) reaches `consumer`'s ring before the call
// returns, on scratch mappings of the calling process. Drains everything (records of other
// changes are dropped: call it before anything relies on the ring). MRC_ERR_UNSUPPORTED with
// the kind that left no record in mrc_last_error().
[[nodiscard]] mrc_status_t self_test(RingConsumer &consumer) noexcept;

}  // namespace mrc::bpf
