// SPDX-License-Identifier: BSD-3-Clause
#include "tools/stress/util.h"

#include <dirent.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>

namespace stress {

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Rng::Rng(uint64_t seed) {
  for (int i = 0; i < 4; ++i) {
    seed = mix64(seed + static_cast<uint64_t>(i));
    s_[i] = seed;
  }
}

uint64_t Rng::next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::below(uint64_t bound) {
  if (bound == 0) return 0;
  // Lemire's multiply-shift; the tiny bias does not matter here.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * bound) >> 64);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t Rng::log_uniform(uint64_t lo, uint64_t hi) {
  if (lo == 0) lo = 1;
  if (hi <= lo) return lo;
  const double l = std::log(static_cast<double>(lo));
  const double h = std::log(static_cast<double>(hi) + 1.0);
  const auto value = static_cast<uint64_t>(std::exp(l + uniform() * (h - l)));
  return value < lo ? lo : (value > hi ? hi : value);
}

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

std::string format_size(uint64_t bytes) {
  static const char *const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0 || value == std::floor(value)) {
    std::snprintf(buf, sizeof buf, "%.0f %s", value, kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

std::string format_count(double n) {
  char buf[32];
  if (n < 1e4) {
    std::snprintf(buf, sizeof buf, "%.0f", n);
  } else if (n < 1e6) {
    std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  } else if (n < 1e9) {
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.2fG", n / 1e9);
  }
  return buf;
}

std::string format_duration(double seconds) {
  char buf[32];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  } else {
    const auto whole = static_cast<long>(seconds);
    std::snprintf(buf, sizeof buf, "%ldm%02lds", whole / 60, whole % 60);
  }
  return buf;
}

namespace {

int count_dir_entries(const char *path) {
  DIR *dir = opendir(path);
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent *entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - (std::strcmp(path, "/proc/self/fd") == 0 ? 1 : 0);  // the DIR's own fd
}

}  // namespace

ProcessSnapshot take_snapshot() {
  ProcessSnapshot snapshot;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    long value = 0;
    if (std::sscanf(line.c_str(), "VmPin: %ld", &value) == 1) snapshot.vm_pin_kib = value;
    if (std::sscanf(line.c_str(), "VmLck: %ld", &value) == 1) snapshot.vm_lck_kib = value;
  }
  snapshot.fds = count_dir_entries("/proc/self/fd");
  snapshot.threads = count_dir_entries("/proc/self/task");
  return snapshot;
}

std::vector<OpenFile> list_fds() {
  std::vector<OpenFile> out;
  DIR *dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  const int own = dirfd(dir);
  while (dirent *entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == own) continue;
    char link[300];
    char target[256] = {};
    std::snprintf(link, sizeof link, "/proc/self/fd/%s", entry->d_name);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    out.push_back(OpenFile{fd, n > 0 ? target : "?"});
  }
  closedir(dir);
  return out;
}

RwLock::RwLock() {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&lock_, &attr);
  pthread_rwlockattr_destroy(&attr);
}

RwLock::~RwLock() { pthread_rwlock_destroy(&lock_); }

}  // namespace stress
