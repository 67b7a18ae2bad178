// SPDX-License-Identifier: BSD-3-Clause
// The pool of mappings that workers register and mutators change under them.
//
// SYNCHRONIZATION
// - Slot::lock (writer-preferring rwlock): a worker holds it shared across get + oracle check +
//   put of ranges inside the slot's mapping; a mutator holds it exclusively while it changes
//   the mapping. So no mutation of a slot's memory runs while a check of it is in flight, and a
//   mismatch the oracle finds under the shared lock can only come from the cache.
// - Slot::start, len, shared, history*: written only under the exclusive lock, read under
//   either.
// - Slot::generation: bumped (relaxed) under the exclusive lock; a worker reads it before and
//   after its check under the shared lock — equal values prove that no mutation ran in between
//   (a consistency check of the harness itself; the lock already guarantees it).
// - The global mutation log and the list of running mutations: log_mutex_ (mutators append,
//   the stale report reads).
// - A worker holds at most one slot lock at a time (no lock-order cycles with mutators).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tools/stress/options.h"
#include "tools/stress/util.h"

namespace stress {

struct Mutation {
  uint64_t start_ns = 0;  // since the start of the run, before the first syscall
  uint64_t time_ns = 0;   // since the start of the run, when it was done
  MutationKind kind = MutationKind::kRemap;
  int slot = -1;
  uintptr_t old_start = 0, old_len = 0;      // the mapping before
  uintptr_t new_start = 0, new_len = 0;      // and after
  uintptr_t range_start = 0, range_len = 0;  // the part touched (madvise, MAP_FIXED, tail)
  int error = 0;  // errno when the kernel refused (then the mapping is unchanged)
};
std::string describe(const Mutation &mutation);

struct Slot {
  static constexpr unsigned kHistory = 16;

  RwLock lock;
  int index = 0;
  uintptr_t start = 0;  // 0 when the slot has no mapping (an mmap failed)
  size_t len = 0;
  bool shared = false;
  size_t fixed_len = 0;  // a private (churn) slot's one length; 0: random lengths
  std::atomic<uint64_t> generation{0};
  Mutation history[kHistory];
  uint64_t history_total = 0;
};

struct PoolConfig {
  unsigned slots = 32;
  uint64_t min_size = 4096;
  uint64_t max_size = 16u << 20;
  double shared_fraction = 0.25;
  // For oracles that cannot see through copy-on-write or THP collapse (pfn): every mapping
  // gets MADV_NOHUGEPAGE and MADV_DONTFORK.
  bool stable_frames = false;
  // Slots beyond `slots`, one per churn thread, each always mapped with private_len bytes.
  // They share the mutation log, so in_flight() sees their unmaps from any slot.
  unsigned private_slots = 0;
  uint64_t private_len = 0;
};

class Pool {
 public:
  Pool(const PoolConfig &config, uint64_t seed, uint64_t start_ns);
  ~Pool();
  Pool(const Pool &) = delete;
  Pool &operator=(const Pool &) = delete;

  size_t size() const { return count_; }  // the shared slots: workers and mutators pick these
  Slot &slot(size_t index) { return slots_[index]; }
  Slot &private_slot(size_t index) { return slots_[count_ + index]; }

  // Changes the slot's mapping; returns what was done (kind may differ from the one asked for
  // when it does not apply, e.g. grow of a shared mapping becomes remap).
  // REQUIRES: slot.lock held exclusively.
  Mutation mutate(Slot &slot, MutationKind kind, Rng &rng);

  // "" when [start, start+len) is mapped read-write, else what is wrong (--verify-mappings:
  // a check of the harness's own bookkeeping). REQUIRES: slot.lock held.
  static std::string check_mapped(const Slot &slot);

  // The slot's recent mutations, oldest first. REQUIRES: slot.lock held (either way).
  std::vector<Mutation> history(const Slot &slot) const;
  // Recent mutations of any slot that touched [start, start+len), oldest first.
  std::vector<Mutation> overlapping(uintptr_t start, size_t len, size_t max) const;

  // A mutation of any slot, touching [start, start+len), that was still running at `since_ns`
  // (time since the start of the run) or is running now: an unmap whose thread had not yet
  // returned. The kernel frees the address range before the unmapping thread waits for the
  // monitor to read the event, so another thread may already have mapped the same addresses.
  // Returns a description, or "" when there is none.
  std::string in_flight(uintptr_t start, size_t len, uint64_t since_ns) const;
  uint64_t start_ns() const { return start_ns_; }

  // "" when every slot got its first mapping, else why not ("mmap of 16 MiB: Cannot allocate
  // memory"): a set-up failure of the run (RLIMIT_AS, a --max-size the machine cannot map), not
  // a failure of the cache.
  const std::string &setup_error() const { return setup_error_; }

 private:
  uintptr_t map(size_t len, bool shared, uintptr_t fixed);
  void prepare(uintptr_t start, size_t len);
  size_t random_len(Rng &rng) const;
  void record(Slot &slot, const Mutation &mutation);

  PoolConfig config_;
  size_t count_;
  size_t private_count_;
  std::unique_ptr<Slot[]> slots_;  // count_ shared, then private_count_ private
  uint64_t start_ns_;

  static constexpr size_t kLogSize = 4096;
  mutable std::mutex log_mutex_;
  std::vector<Mutation> running_;  // log_mutex_: mutations begun and not yet recorded
  std::vector<Mutation> log_;      // ring of kLogSize
  uint64_t log_total_ = 0;
  std::string setup_error_;
};

}  // namespace stress
