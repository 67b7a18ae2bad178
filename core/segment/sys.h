// System helpers of the segment code: the calling thread's last error, name checks, clocks,
// robust process-shared mutexes and OFD presence locks.
//
// SYNCHRONIZATION: the last error is thread-local. The mutex helpers are thin wrappers; the
// locks they take are described where they live (layout.h). Nothing here keeps shared state.
#pragma once

#include <fmt/format.h>
#include <pthread.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::seg {

// ---- the last error of this thread ---------------------------------------------------------
void set_error_text(const char *text) noexcept;
void clear_error() noexcept;
const char *last_error() noexcept;

template <class... Args>
void set_error(fmt::format_string<Args...> format, Args &&...args) noexcept {
  char buf[512];
  auto result = fmt::format_to_n(buf, sizeof buf - 1, format, std::forward<Args>(args)...);
  *result.out = '\0';
  set_error_text(buf);
}

// The text of an errno value (strerror() is not thread-safe).
const char *errno_text(int error) noexcept;

// Records why, and returns `status`: `return fail(MRC_ERR_INVALID, "bad name {}", n);`
template <class... Args>
[[nodiscard]] mrc_status_t fail(mrc_status_t status, fmt::format_string<Args...> format,
                                Args &&...args) noexcept {
  set_error(format, std::forward<Args>(args)...);
  return status;
}

// ---- names ---------------------------------------------------------------------------------
// [A-Za-z0-9._-], 1..kNameMax characters, not "." or "..".
bool valid_name(const char *name) noexcept;
// "/<prefix>:root" and "/<prefix>:<generation>:<name>" (':' is outside the name alphabet, so
// no two prefixes or names can produce the same file name).
void root_shm_name(const char *prefix, char (&out)[160]) noexcept;
void segment_shm_name(const char *prefix, uint64_t generation, const char *name,
                      char (&out)[160]) noexcept;

// ---- time and randomness -------------------------------------------------------------------
uint64_t monotonic_ns() noexcept;
uint64_t realtime_ns() noexcept;
uint64_t random_u64() noexcept;
void sleep_ns(uint64_t ns) noexcept;

// ---- robust process-shared mutexes ---------------------------------------------------------
// Initialises a mutex nobody can be using yet (fresh memory of a file created under O_EXCL).
[[nodiscard]] int robust_mutex_init(pthread_mutex_t *mutex) noexcept;

enum class LockResult { kAcquired, kOwnerDied, kTimeout, kUnrecoverable, kError };
// Waits until `deadline_ns` (CLOCK_MONOTONIC). kOwnerDied: the lock is ours, the previous owner
// died holding it; the caller repairs, then calls pthread_mutex_consistent.
LockResult robust_lock(pthread_mutex_t *mutex, uint64_t deadline_ns) noexcept;

struct MutexState {
  bool locked;
  bool owner_died;  // the owner died; the next locker repairs
  int owner_tid;
};
// Reads glibc's lock word without taking the lock: for display only.
MutexState mutex_state(const pthread_mutex_t *mutex) noexcept;

// ---- OFD locks (one byte each) -------------------------------------------------------------
// 0 when taken; EAGAIN when another open file description holds it; another errno on failure.
int ofd_trylock(int fd, off_t offset) noexcept;
void ofd_unlock(int fd, off_t offset) noexcept;
// 1: some open file description (ours included) holds it; 0: nobody; -errno on failure.
int ofd_held(int fd, off_t offset) noexcept;

// ---- files ---------------------------------------------------------------------------------
// A file belongs to the domain when its owner is the domain's uid or, in a group-shared domain
// (mode grants the group access), when its group is the domain's gid.
bool owned_by_domain(uid_t file_uid, gid_t file_gid, uid_t uid, gid_t gid, unsigned mode) noexcept;

// The checks made before mapping a file of the domain: a regular file that belongs to the
// domain, no permission bit beyond `mode`, never world-writable; size exactly `size` (0 = any).
// MRC_OK or MRC_ERR_INVALID with the reason.
[[nodiscard]] mrc_status_t check_file(int fd, const char *what, uid_t uid, gid_t gid, unsigned mode,
                                      uint64_t size) noexcept;

// Gives a file we just created to the domain's uid/gid: the uid only when we are root, the
// group when it differs from ours. MRC_OK or MRC_ERR_INVALID.
[[nodiscard]] mrc_status_t give_to_domain(int fd, const char *what, uid_t uid, gid_t gid,
                                          unsigned mode) noexcept;

// Reads /proc/self/comm (15 bytes at most).
void self_comm(char (&out)[16]) noexcept;

}  // namespace mrc::seg
