// SPDX-License-Identifier: BSD-3-Clause
#include "tools/fi-oracle/memory.h"

#include <malloc.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

namespace fi_oracle {
namespace {

constexpr int kProt = PROT_READ | PROT_WRITE;
constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS;

[[noreturn]] void fail(const std::string &what) {
  throw RunError{what + ": " + std::strerror(errno)};
}

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

char *map_anywhere(size_t len) {
  void *p = mmap(nullptr, len, kProt, kFlags, -1, 0);
  if (p == MAP_FAILED) fail("mmap");
  return static_cast<char *>(p);
}

// A fresh mapping at `addr` when that range is free, else anywhere (the caller compares).
char *map_at(char *addr, size_t len) {
  void *p = mmap(addr, len, kProt, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != MAP_FAILED) return static_cast<char *>(p);
  return map_anywhere(len);
}

char *raw_map_at(char *addr, size_t len) {
  long p = syscall(SYS_mmap, addr, len, kProt, kFlags | MAP_FIXED_NOREPLACE, -1, 0L);
  if (p == -1) return map_anywhere(len);
  return reinterpret_cast<char *>(p);
}

// glibc: the size field before a chunk has bit 1 (IS_MMAPPED) set when malloc mmapped it.
bool malloc_mapped(const void *p) {
  size_t header;
  uintptr_t at = reinterpret_cast<uintptr_t>(p) - sizeof header;
  std::memcpy(&header, reinterpret_cast<const void *>(at), sizeof header);
  return (header & 2) != 0;
}

}  // namespace

void set_malloc_mmap_threshold(size_t size) {
  // A fixed threshold (not glibc's sliding one, which rises past a freed mmapped chunk), at most
  // the buffer's size. malloc still serves a request from the top of the heap when the top has
  // room, whatever the threshold: no padding and trimming at a page keep the top small.
  size_t page = page_size();
  size_t threshold = size / 2 < page ? page : size / 2;
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(threshold)) != 1 || mallopt(M_TOP_PAD, 0) != 1 ||
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(page)) != 1) {
    throw RunError{"mallopt refused the mmap threshold " + std::to_string(threshold)};
  }
  malloc_trim(0);
}

SendBuffer::SendBuffer(size_t size) : size_(size) {
  size_t page = page_size();
  map_len_ = (size + page - 1) / page * page;
}

SendBuffer::~SendBuffer() {
  finish();
  release();
}

void SendBuffer::release() {
  if (data_ == nullptr) return;
  if (malloced_) {
    std::free(data_);
  } else {
    munmap(data_, map_len_);
  }
  data_ = nullptr;
}

void SendBuffer::reset(Scenario scenario) {
  finish();
  release();
  malloced_ = scenario == Scenario::kFree;
  if (malloced_) {
    data_ = static_cast<char *>(std::malloc(size_));
    if (data_ == nullptr) fail("malloc");
  } else {
    data_ = map_anywhere(map_len_);
  }
}

bool SendBuffer::change(Scenario scenario) {
  char *old = data_;
  switch (scenario) {
    case Scenario::kNone: break;
    case Scenario::kFree: {
      uintptr_t before = reinterpret_cast<uintptr_t>(data_);
      std::free(data_);
      data_ = static_cast<char *>(std::malloc(size_));
      if (data_ == nullptr) fail("malloc");
      // Served from the heap, the buffer may be the same chunk on the same pages: no change.
      return reinterpret_cast<uintptr_t>(data_) == before && malloc_mapped(data_);
    }
    case Scenario::kMunmap:
      if (munmap(data_, map_len_) != 0) fail("munmap");
      data_ = map_at(old, map_len_);
      break;
    case Scenario::kRaw:
      if (syscall(SYS_munmap, data_, map_len_) != 0) fail("syscall(SYS_munmap)");
      data_ = raw_map_at(old, map_len_);
      break;
    case Scenario::kFixed:
      if (mmap(data_, map_len_, kProt, kFlags | MAP_FIXED, -1, 0) == MAP_FAILED) {
        fail("mmap(MAP_FIXED)");
      }
      break;
    case Scenario::kDontneed:
      if (madvise(data_, map_len_, MADV_DONTNEED) != 0) fail("madvise(MADV_DONTNEED)");
      break;
    case Scenario::kMremap: {
      // The pages move to a place reserved for them; the old address gets a fresh mapping.
      void *spare = mmap(nullptr, map_len_, PROT_NONE, kFlags, -1, 0);
      if (spare == MAP_FAILED) fail("mmap");
      if (mremap(data_, map_len_, map_len_, MREMAP_MAYMOVE | MREMAP_FIXED, spare) == MAP_FAILED) {
        fail("mremap");
      }
      data_ = map_at(old, map_len_);
      if (munmap(spare, map_len_) != 0) fail("munmap");
      break;
    }
    case Scenario::kRace: return remap_race();
  }
  return data_ == old;
}

// The unmapping thread and the mapping thread start together; the mapping thread takes the
// address the moment it is free, and the caller stamps and sends at once.
bool SendBuffer::remap_race() {
  char *old = data_;
  size_t len = map_len_;
  std::atomic<bool> go{false};
  unmapper_ = std::thread([old, len, &go] {
    while (!go.load(std::memory_order_acquire)) {
    }
    munmap(old, len);
  });
  go.store(true, std::memory_order_release);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    void *p = mmap(old, len, kProt, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED) {
      data_ = static_cast<char *>(p);
      break;
    }
    if (errno != EEXIST || std::chrono::steady_clock::now() > deadline) {
      finish();
      data_ = map_at(old, len);
      break;
    }
  }
  return data_ == old;
}

void SendBuffer::finish() {
  if (unmapper_.joinable()) unmapper_.join();
}

}  // namespace fi_oracle
