// SPDX-License-Identifier: BSD-3-Clause
// System helpers of the segment code: the calling thread's last error (formatted with fmt,
// stored in base/error.h's buffer), name checks, clocks, file checks; the locks come from
// base/locks.h.
//
// SYNCHRONIZATION: the last error is thread-local (base/error.h). The mutex helpers are thin
// wrappers; the locks they take are described where they live (layout.h). Nothing here keeps
// shared state.
#pragma once

#include <fmt/format.h>
#include <pthread.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "base/locks.h"
#include "mrcache/mrcache.h"

namespace mrc::seg {

// ---- the last error of this thread (base/error.h: mrc_last_error, mrc_seg_last_error) -------
inline void set_error_text(const char *text) noexcept { set_last_error("%s", text); }
inline void clear_error() noexcept { clear_last_error(); }

template <class... Args>
void set_error(fmt::format_string<Args...> format, Args &&...args) noexcept {
  char buf[kLastErrorSize];
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
// "/<prefix>:root" and "/<prefix>:<generation>.<tag>:<name>", tag in 16 hex digits (':' is
// outside the name alphabet, so no two prefixes or names can produce the same file name). The
// tag is random per segment: another local user cannot create the next segment's file first.
// REQUIRES: prefix and name are valid_name() (callers check names read from shared memory).
void root_shm_name(const char *prefix, char (&out)[160]) noexcept;
void segment_shm_name(const char *prefix, uint64_t generation, uint64_t tag, const char *name,
                      char (&out)[160]) noexcept;
// Parses the part of a segment file name after "<prefix>:". false when it is not one.
bool parse_segment_name(const char *rest, uint64_t *generation, uint64_t *tag,
                        const char **name) noexcept;

// ---- time and randomness -------------------------------------------------------------------
uint64_t monotonic_ns() noexcept;
uint64_t realtime_ns() noexcept;
uint64_t random_u64() noexcept;
void sleep_ns(uint64_t ns) noexcept;

// ---- locks (base/locks.h) ------------------------------------------------------------------
using os::LockResult;
using os::mutex_state;
using os::MutexState;
using os::ofd_held;
using os::ofd_trylock;
using os::ofd_unlock;
using os::robust_lock;
using os::robust_mutex_init;

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
