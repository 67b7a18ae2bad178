// SPDX-License-Identifier: BSD-3-Clause
// Small pieces the stress harness shares: a seeded random generator, clocks, sizes, the
// process's resources (for the leak check) and a writer-preferring reader/writer lock.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace stress {

// The page size, read once at start-up.
size_t page_size();
inline uintptr_t page_down(uintptr_t x) { return x & ~(page_size() - 1); }
inline uintptr_t page_up(uintptr_t x) { return (x + page_size() - 1) & ~(page_size() - 1); }

// splitmix64: seeds generators and derives per-thread seeds from the run's seed.
uint64_t mix64(uint64_t x);

// xoshiro256**: fast, good enough for choosing ranges, and repeatable from one seed.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  uint64_t below(uint64_t bound);  // [0, bound); bound 0 gives 0
  double uniform();                // [0, 1)
  bool chance(double p) { return p > 0 && uniform() < p; }
  // Log-uniform in [lo, hi]: small and large sizes equally likely per octave.
  uint64_t log_uniform(uint64_t lo, uint64_t hi);

 private:
  uint64_t s_[4];
};

uint64_t now_ns();  // CLOCK_MONOTONIC

std::string format_size(uint64_t bytes);  // "4 KiB", "1.5 MiB"
std::string format_count(double n);       // "950", "12.3k", "4.56M"
std::string format_duration(double seconds);

// What the leak check compares: pinned and locked memory, open files, threads.
struct ProcessSnapshot {
  long vm_pin_kib = -1;  // VmPin in /proc/self/status (-1 when absent)
  long vm_lck_kib = -1;
  int fds = -1;      // entries of /proc/self/fd
  int threads = -1;  // entries of /proc/self/task
};
ProcessSnapshot take_snapshot();
// The open fds and what they point to.
struct OpenFile {
  int fd;
  std::string target;
};
std::vector<OpenFile> list_fds();

// pthread_rwlock preferring writers, so that mutators are not starved by a stream of workers.
class RwLock {
 public:
  RwLock();
  ~RwLock();
  RwLock(const RwLock &) = delete;
  RwLock &operator=(const RwLock &) = delete;
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

}  // namespace stress
