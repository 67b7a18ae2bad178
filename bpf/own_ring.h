// SPDX-License-Identifier: BSD-3-Clause
// This process's ring of address-space changes, from programs it loaded itself (root, no
// daemon): the programs (loader.h), this process their client, its ring and lost counter
// mapped for a RingConsumer (ring.h), and every kind of change proven by the self-test before
// the ring serves (docs/DESIGN.md, "The eBPF monitor's self-test").
//
// 1. open() and close(): one thread at a time (the monitor's start and stop, under its mutex).
// 2. consumer(): as ring.h says (quiet() from any thread; drain() one thread at a time).
// 3. Only the process that opened it reads it: a forked child's changes reach no ring, so the
//    child must not trust it (owner() says whose it is).
#pragma once

#include <sys/types.h>

#include <cstddef>

#include "bpf/loader.h"
#include "bpf/ring.h"
#include "mrcache/mrcache.h"

namespace mrc::bpf {

class OwnRing {
 public:
  static constexpr size_t kDefaultRingBytes = size_t{1} << 20;

  // Loads the programs, makes this process their client with a ring of `ring_bytes`, maps it
  // and runs the self-test. MRC_ERR_UNSUPPORTED (and the other errors of loader.h) with the
  // reason in mrc_last_error(); nothing stays loaded then.
  [[nodiscard]] static mrc_status_t open(size_t ring_bytes, OwnRing **out) noexcept;
  void close() noexcept;

  RingConsumer &consumer() noexcept { return consumer_; }
  const Hooks &hooks() const noexcept { return programs_->hooks(); }
  pid_t owner() const noexcept { return owner_; }

 private:
  OwnRing() = default;
  ~OwnRing() = default;

  Programs *programs_ = nullptr;
  Programs::Client client_{};
  MappedRing ring_;
  void *lost_ = nullptr;
  size_t lost_bytes_ = 0;
  pid_t owner_ = 0;
  RingConsumer consumer_;
};

// Proves each kind of change the cache relies on (munmap, MAP_FIXED over a mapping, a moving
// and a shrinking mremap, madvise(MADV_DONTNEED)) reaches `consumer`'s ring before the call
// returns, on scratch mappings of the calling process. Drains everything (records of other
// changes are dropped: call it before anything relies on the ring). MRC_ERR_UNSUPPORTED with
// the kind that left no record in mrc_last_error().
[[nodiscard]] mrc_status_t self_test(RingConsumer &consumer) noexcept;

}  // namespace mrc::bpf
