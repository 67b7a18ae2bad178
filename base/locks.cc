// SPDX-License-Identifier: BSD-3-Clause
// Robust process-shared mutexes and OFD byte locks. SYNCHRONIZATION: see locks.h.
#include "base/locks.h"

#include <fcntl.h>

#include <cerrno>
#include <ctime>

namespace mrc::os {

int robust_mutex_init(pthread_mutex_t *mutex) noexcept {
  pthread_mutexattr_t attr;
  int rc = pthread_mutexattr_init(&attr);
  if (rc != 0) return rc;
  rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (rc == 0) rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (rc == 0) rc = pthread_mutex_init(mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  return rc;
}

LockResult robust_lock(pthread_mutex_t *mutex, uint64_t deadline_ns) noexcept {
  timespec abs{static_cast<time_t>(deadline_ns / 1000000000ULL),
               static_cast<long>(deadline_ns % 1000000000ULL)};
  int rc;
  do {
    rc = pthread_mutex_clocklock(mutex, CLOCK_MONOTONIC, &abs);
  } while (rc == EINTR);
  switch (rc) {
    case 0: return LockResult::Acquired;
    case EOWNERDEAD: return LockResult::OwnerDied;
    case ETIMEDOUT: return LockResult::Timeout;
    case ENOTRECOVERABLE: return LockResult::Unrecoverable;
    default: return LockResult::Error;
  }
}

MutexState mutex_state(const pthread_mutex_t *mutex) noexcept {
  // glibc keeps the futex word of a robust mutex in __data.__lock: the owner's TID, with
  // FUTEX_OWNER_DIED (0x40000000) set by the kernel when the owner exits holding it.
  constexpr unsigned kOwnerDied = 0x40000000U;
  constexpr unsigned kTidMask = 0x3fffffffU;
  const auto word = static_cast<unsigned>(__atomic_load_n(&mutex->__data.__lock, __ATOMIC_RELAXED));
  MutexState state{};
  state.owner_tid = static_cast<int>(word & kTidMask);
  state.owner_died = (word & kOwnerDied) != 0;
  state.locked = state.owner_tid != 0 || state.owner_died;
  return state;
}

int ofd_trylock(int fd, off_t offset) noexcept {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = offset;
  lock.l_len = 1;
  while (fcntl(fd, F_OFD_SETLK, &lock) != 0) {
    if (errno == EINTR) continue;
    return (errno == EACCES || errno == EAGAIN) ? EAGAIN : errno;
  }
  return 0;
}

void ofd_unlock(int fd, off_t offset) noexcept {
  struct flock lock {};
  lock.l_type = F_UNLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = offset;
  lock.l_len = 1;
  (void)fcntl(fd, F_OFD_SETLK, &lock);
}

int ofd_held(int fd, off_t offset) noexcept {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = offset;
  lock.l_len = 1;
  if (fcntl(fd, F_OFD_GETLK, &lock) != 0) return -errno;
  return lock.l_type == F_UNLCK ? 0 : 1;
}

}  // namespace mrc::os
