// SPDX-License-Identifier: BSD-3-Clause
#include "base/pagemap.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mrc::os::pagemap {
namespace {

constexpr uint64_t kPresent = uint64_t{1} << 63;
constexpr uint64_t kPfnMask = (uint64_t{1} << 55) - 1;
constexpr size_t kChunk = 64;

// One descriptor for the process, opened on first use and kept (pagemap is per process).
int pagemap_fd() noexcept {
  static std::atomic<int> fd{-1};
  int current = fd.load(std::memory_order_acquire);
  if (current >= 0) return current;
  int opened = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (opened < 0) return -1;
  int expected = -1;
  if (!fd.compare_exchange_strong(expected, opened, std::memory_order_acq_rel)) {
    ::close(opened);
    return expected;
  }
  return opened;
}

uint64_t normalise(uint64_t entry) noexcept {
  return (entry & kPresent) != 0 ? (kPresent | (entry & kPfnMask)) : 0;
}

}  // namespace

bool read(uintptr_t start, uint64_t *entries, size_t pages) noexcept {
  const int fd = pagemap_fd();
  if (fd < 0) return false;
  const long page_size = ::sysconf(_SC_PAGESIZE);
  for (size_t done = 0; done < pages;) {
    const size_t chunk = pages - done < kChunk ? pages - done : kChunk;
    const off_t offset = static_cast<off_t>((start / static_cast<uintptr_t>(page_size) + done) * 8);
    ssize_t got = ::pread(fd, entries + done, chunk * 8, offset);
    if (got != static_cast<ssize_t>(chunk * 8)) return false;
    for (size_t i = done; i < done + chunk; ++i) entries[i] = normalise(entries[i]);
    done += chunk;
  }
  return true;
}

bool matches(uintptr_t start, const uint64_t *entries, size_t pages) noexcept {
  uint64_t now[kChunk];
  const long page_size = ::sysconf(_SC_PAGESIZE);
  for (size_t done = 0; done < pages;) {
    const size_t chunk = pages - done < kChunk ? pages - done : kChunk;
    if (!read(start + done * static_cast<uintptr_t>(page_size), now, chunk)) return false;
    for (size_t i = 0; i < chunk; ++i) {
      // A page absent at registration (never touched) may appear later: not a change of frame.
      if (entries[done + i] != 0 && now[i] != entries[done + i]) return false;
    }
    done += chunk;
  }
  return true;
}

bool available(char *why, size_t why_len) noexcept {
  if (pagemap_fd() < 0) {
    std::snprintf(why, why_len, "cannot open /proc/self/pagemap: %s", strerrorname_np(errno));
    return false;
  }
  volatile char probe = 1;  // a present page: this stack
  uint64_t entry = 0;
  if (!read(reinterpret_cast<uintptr_t>(&probe), &entry, 1)) {
    std::snprintf(why, why_len, "cannot read /proc/self/pagemap");
    return false;
  }
  if ((entry & kPfnMask) == 0) {
    std::snprintf(why, why_len,
                  "page frame numbers read as 0: reading them needs CAP_SYS_ADMIN (Linux 4.0+)");
    return false;
  }
  return true;
}

}  // namespace mrc::os::pagemap
