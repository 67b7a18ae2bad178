// SPDX-License-Identifier: BSD-3-Clause
// Locks shared between processes: robust process-shared pthread mutexes (they survive a holder's
// death) and OFD byte locks (they say whether any process still has a file open).
//
// SYNCHRONIZATION: thin wrappers over the kernel's and glibc's locks; nothing here keeps state.
// What each lock guards is said where it lives (core/segment/layout.h).
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <cstdint>

namespace mrc::os {

// ---- robust process-shared mutexes ----
// Initialises a mutex nobody can be using yet (fresh memory of a file created under O_EXCL).
[[nodiscard]] int robust_mutex_init(pthread_mutex_t *mutex) noexcept;

enum class LockResult { Acquired, OwnerDied, Timeout, Unrecoverable, Error };
// Waits until `deadline_ns` (CLOCK_MONOTONIC). OwnerDied: the lock is ours, the previous owner
// died holding it; the caller repairs, then calls pthread_mutex_consistent.
LockResult robust_lock(pthread_mutex_t *mutex, uint64_t deadline_ns) noexcept;

struct MutexState {
  bool locked;
  bool owner_died;  // the owner died; the next locker repairs
  int owner_tid;
};
// Reads glibc's lock word without taking the lock: for display only.
MutexState mutex_state(const pthread_mutex_t *mutex) noexcept;

// ---- OFD locks (one byte each) ----
// 0 when taken; EAGAIN when another open file description holds it; another errno on failure.
int ofd_trylock(int fd, off_t offset) noexcept;
void ofd_unlock(int fd, off_t offset) noexcept;
// 1: some open file description (ours included) holds it; 0: nobody; -errno on failure.
int ofd_held(int fd, off_t offset) noexcept;

}  // namespace mrc::os
