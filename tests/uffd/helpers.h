// SPDX-License-Identifier: BSD-3-Clause
// Shared helpers for the uffd tests.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "uffd/uffd.h"

namespace mrc::uffd::test {

inline size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// A 2 MiB unit (a huge page, a page-table leaf's reach) for test mappings that must be large or
// aligned.
inline constexpr size_t kWatchBlock = size_t{2} << 20;

inline const char *kind_name(InvalidationKind kind) {
  switch (kind) {
    case InvalidationKind::Unmap: return "unmap";
    case InvalidationKind::Remove: return "remove";
    case InvalidationKind::Remap: return "remap";
  }
  return "?";
}

inline std::string describe(const std::vector<Invalidation> &records) {
  std::string text;
  char line[96];
  for (const Invalidation &r : records) {
    snprintf(line, sizeof(line), "  %s [%#lx, %#lx)\n", kind_name(r.kind), r.start, r.end);
    text += line;
  }
  return text.empty() ? "  (none)\n" : text;
}

// Everything the subscription has not seen yet (asserting the drain is Ok).
inline std::vector<Invalidation> drain_all(Subscription *subscription) {
  std::vector<Invalidation> records;
  const DrainResult result =
      subscription->drain([&records](const Invalidation &r) { records.push_back(r); });
  EXPECT_EQ(result, DrainResult::Ok);
  return records;
}

// True if some record of `kind` covers [start, end).
inline bool covered(const std::vector<Invalidation> &records, uintptr_t start, uintptr_t end,
                    InvalidationKind kind) {
  for (const Invalidation &r : records) {
    if (r.kind == kind && r.start <= start && r.end >= end) return true;
  }
  return false;
}

inline bool touches(const std::vector<Invalidation> &records, uintptr_t start, uintptr_t end) {
  for (const Invalidation &r : records) {
    if (r.start < end && start < r.end) return true;
  }
  return false;
}

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char *name, const char *value) : name_(name) {
    const char *old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::string old_;
  bool had_ = false;
};

// A subscription for the length of a scope.
class ScopedSubscription {
 public:
  ScopedSubscription() { EXPECT_EQ(uffd::subscribe(&subscription_), MRC_OK); }
  ~ScopedSubscription() { uffd::unsubscribe(subscription_); }
  Subscription *get() const { return subscription_; }
  Subscription *operator->() const { return subscription_; }

 private:
  Subscription *subscription_ = nullptr;
};

inline mrc_monitor_info_t monitor_info() {
  mrc_monitor_info_t info;
  Monitor::info(&info);
  return info;
}

inline size_t count_dir(const char *path) {
  size_t n = 0;
  DIR *dir = opendir(path);
  if (dir == nullptr) return 0;
  while (dirent *entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

inline size_t count_vmas() {
  FILE *maps = fopen("/proc/self/maps", "r");
  size_t n = 0;
  int c;
  while ((c = fgetc(maps)) != EOF) n += c == '\n';
  fclose(maps);
  return n;
}

// VMAs that overlap [lo, hi) (sanitizer runtimes map memory of their own elsewhere).
inline size_t count_vmas_in(uintptr_t lo, uintptr_t hi) {
  FILE *maps = fopen("/proc/self/maps", "r");
  size_t n = 0;
  unsigned long start, end;
  char line[512];
  while (fgets(line, sizeof(line), maps) != nullptr) {
    if (sscanf(line, "%lx-%lx", &start, &end) == 2 && start < hi && lo < end) ++n;
  }
  fclose(maps);
  return n;
}

inline char *map_anonymous(size_t length, int prot = PROT_READ | PROT_WRITE) {
  void *p = mmap(nullptr, length, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  return static_cast<char *>(p);
}

// A mapping of `length` whose start is aligned to `alignment` (the rest is unmapped again).
inline char *map_aligned(size_t length, size_t alignment) {
  char *raw = map_anonymous(length + alignment);
  const uintptr_t start = (reinterpret_cast<uintptr_t>(raw) + alignment - 1) & ~(alignment - 1);
  char *aligned = reinterpret_cast<char *>(start);
  if (aligned > raw) munmap(raw, static_cast<size_t>(aligned - raw));
  munmap(aligned + length, static_cast<size_t>(raw + length + alignment - (aligned + length)));
  return aligned;
}

inline uintptr_t u(const void *p) { return reinterpret_cast<uintptr_t>(p); }

// Whether the VMA that holds `address` is registered with a userfaultfd: "uw" (write-protect
// modes) or "um" (missing mode) among its VmFlags in /proc/self/smaps. Asking makes no event,
// so it leaves the monitor's consumers quiescent (an madvise would not).
inline bool registered_with_uffd(uintptr_t address) {
  FILE *smaps = fopen("/proc/self/smaps", "r");
  if (smaps == nullptr) return false;
  bool inside = false;
  bool registered = false;
  unsigned long start, end;
  char line[512];
  while (fgets(line, sizeof(line), smaps) != nullptr) {
    if (sscanf(line, "%lx-%lx ", &start, &end) == 2) {  // a mapping's first line
      inside = start <= address && address < end;
    } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
      registered = strstr(line, " uw") != nullptr || strstr(line, " um") != nullptr;
      break;
    }
  }
  fclose(smaps);
  return registered;
}

}  // namespace mrc::uffd::test
