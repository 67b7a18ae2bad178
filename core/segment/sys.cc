// SPDX-License-Identifier: BSD-3-Clause
// System helpers of the segment code. SYNCHRONIZATION: see internal/sys.h (no shared state here;
// the last error is thread-local, in base/error.h).
#include "core/segment/internal/sys.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <string>

#include "core/segment/layout.h"

namespace mrc::seg {

const char *errno_text(int error) noexcept {
  const char *text = strerrordesc_np(error);  // static strings: no buffer shared between threads
  return text != nullptr ? text : "unknown error";
}

bool valid_name(const char *name) noexcept {
  if (name == nullptr) return false;
  size_t n = 0;
  for (; name[n] != '\0'; ++n) {
    if (n >= kNameMax) return false;
    const char c = name[n];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  if (n == 0) return false;
  return std::strcmp(name, ".") != 0 && std::strcmp(name, "..") != 0;
}

void root_shm_name(const char *prefix, char (&out)[160]) noexcept {
  auto r = fmt::format_to_n(out, sizeof out - 1, "/{}:root", prefix);
  *r.out = '\0';
}

void segment_shm_name(const char *prefix, uint64_t generation, uint64_t tag, const char *name,
                      char (&out)[160]) noexcept {
  auto r =
      fmt::format_to_n(out, sizeof out - 1, "/{}:{}.{:016x}:{}", prefix, generation, tag, name);
  *r.out = '\0';
}

bool parse_segment_name(const char *rest, uint64_t *generation, uint64_t *tag,
                        const char **name) noexcept {
  uint64_t gen = 0;
  const char *c = rest;
  for (; *c >= '0' && *c <= '9'; ++c) {
    if (gen > (~uint64_t{0} - 9) / 10) return false;
    gen = gen * 10 + static_cast<uint64_t>(*c - '0');
  }
  if (c == rest || *c != '.') return false;
  uint64_t t = 0;
  const char *hex = ++c;
  for (; c - hex < 16; ++c) {
    unsigned digit = 0;
    if (*c >= '0' && *c <= '9') {
      digit = static_cast<unsigned>(*c - '0');
    } else if (*c >= 'a' && *c <= 'f') {
      digit = static_cast<unsigned>(*c - 'a' + 10);
    } else {
      return false;
    }
    t = t << 4 | digit;
  }
  if (*c != ':' || !valid_name(c + 1)) return false;
  *generation = gen;
  *tag = t;
  *name = c + 1;
  return true;
}

uint64_t monotonic_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t realtime_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t random_u64() noexcept {
  uint64_t value = 0;
  if (getrandom(&value, sizeof value, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof value)) {
    // No entropy yet (early boot): the clock and pid still separate concurrent creators.
    value = monotonic_ns() ^ (static_cast<uint64_t>(getpid()) << 32) ^ realtime_ns();
  }
  return value;
}

void sleep_ns(uint64_t ns) noexcept {
  timespec ts{static_cast<time_t>(ns / 1000000000ULL), static_cast<long>(ns % 1000000000ULL)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

bool owned_by_domain(uid_t file_uid, gid_t file_gid, uid_t uid, gid_t gid, unsigned mode) noexcept {
  return file_uid == uid || ((mode & 0060U) != 0 && file_gid == gid);
}

mrc_status_t check_file(int fd, const char *what, uid_t uid, gid_t gid, unsigned mode,
                        uint64_t size) noexcept {
  struct stat st {};
  if (fstat(fd, &st) != 0) return fail(MRC_ERR_IO, "fstat {}: {}", what, errno_text(errno));
  if (!S_ISREG(st.st_mode)) return fail(MRC_ERR_INVALID, "{} is not a regular file", what);
  if (!owned_by_domain(st.st_uid, st.st_gid, uid, gid, mode)) {
    return fail(MRC_ERR_INVALID, "{} is owned by uid {} gid {}, expected uid {}{}: refused", what,
                st.st_uid, st.st_gid, uid,
                (mode & 0060U) != 0 ? fmt::format(" or gid {}", gid) : std::string());
  }
  const unsigned perms = static_cast<unsigned>(st.st_mode) & 07777U;
  if ((perms & ~mode) != 0 || (perms & S_IWOTH) != 0) {
    return fail(MRC_ERR_INVALID, "{} has mode {:04o}, more than the domain's {:04o}: refused", what,
                perms, mode);
  }
  if (size != 0 && static_cast<uint64_t>(st.st_size) != size) {
    return fail(MRC_ERR_INVALID, "{} has {} bytes, expected {}: refused", what, st.st_size, size);
  }
  return MRC_OK;
}

mrc_status_t give_to_domain(int fd, const char *what, uid_t uid, gid_t gid,
                            unsigned mode) noexcept {
  const uid_t new_uid = geteuid() == 0 && uid != geteuid() ? uid : static_cast<uid_t>(-1);
  const gid_t new_gid = gid != getegid() ? gid : static_cast<gid_t>(-1);
  if ((new_uid != static_cast<uid_t>(-1) || new_gid != static_cast<gid_t>(-1)) &&
      fchown(fd, new_uid, new_gid) != 0) {
    return fail(MRC_ERR_INVALID, "cannot give {} to uid {} gid {}: {}", what, uid, gid,
                errno_text(errno));
  }
  // shm_open and open applied the umask; set the domain's mode exactly (never wider).
  if (fchmod(fd, mode) != 0) {
    return fail(MRC_ERR_IO, "chmod {}: {}", what, errno_text(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !owned_by_domain(st.st_uid, st.st_gid, uid, gid, mode)) {
    return fail(MRC_ERR_INVALID, "{} cannot belong to uid {} here (not root, mode {:04o})", what,
                uid, mode);
  }
  return MRC_OK;
}

void self_comm(char (&out)[16]) noexcept {
  out[0] = '\0';
  const int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const ssize_t n = read(fd, out, sizeof out - 1);
  close(fd);
  if (n <= 0) {
    out[0] = '\0';
    return;
  }
  size_t len = static_cast<size_t>(n);
  if (out[len - 1] == '\n') --len;
  out[len] = '\0';
}

}  // namespace mrc::seg
