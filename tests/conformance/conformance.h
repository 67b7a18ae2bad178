// SPDX-License-Identifier: BSD-3-Clause
// What the conformance tests share: a fixture owning one cache over the counting backend, the
// peers' helpers in the C API's terms (get that checks what it returns, get-and-put returning
// the key), guarded page allocations, and a runner for the peers' multithreaded scenarios.
// Regions are compared by key: the backend's keys are never reused, a region's memory may be.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "counting_backend.h"
#include "mrcache/mrcache.h"

namespace conformance {

inline const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr unsigned kRW = MRC_PROT_READ | MRC_PROT_WRITE;

inline bool monitor_caches() {
  mrc_monitor_info_t info;
  return mrc_monitor_info(&info) == MRC_OK && info.mode != MRC_MONITOR_UNCACHED;
}

inline uintptr_t addr(const void *p) { return reinterpret_cast<uintptr_t>(p); }
inline uintptr_t region_end(const mrc_region_t *region) {
  return addr(mrc_region_start(region)) + mrc_region_length(region);
}

// A barrier for n threads that, like UCX's, returns true in exactly one of them per round.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  bool wait() {
    std::unique_lock lock(mutex_);
    const unsigned round = round_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return round_ != round; });
    return false;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  unsigned round_ = 0;
};

class Conformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!monitor_caches()) {
      GTEST_SKIP() << "userfaultfd is unavailable (mrc_monitor_info reports the uncached mode): "
                      "nothing is cached, so no scenario of the peers applies";
    }
    ASSERT_EQ(create(backend.params()), MRC_OK);
  }
  void TearDown() override {
    if (cache != nullptr) mrc_cache_destroy(cache);
    cache = nullptr;
    EXPECT_EQ(backend.live(), 0u) << "registrations left after mrc_cache_destroy";
  }
  // Replaces the fixture's cache.
  mrc_status_t create(mrc_cache_params_t params) {
    if (cache != nullptr) mrc_cache_destroy(cache);
    cache = nullptr;
    return mrc_cache_create(&params, &cache);
  }

  // A get that must succeed: the region covers the request with at least `prot`.
  mrc_region_t *get(const void *p, size_t len, unsigned prot = kRW, size_t alignment = 0) {
    mrc_region_t *region = nullptr;
    const mrc_status_t status =
        alignment == 0
            ? mrc_get(cache, const_cast<void *>(p), len, prot, &region)
            : mrc_get_aligned(cache, const_cast<void *>(p), len, alignment, prot, &region);
    EXPECT_EQ(status, MRC_OK) << mrc_status_string(status);
    if (status != MRC_OK) return nullptr;
    EXPECT_LE(addr(mrc_region_start(region)), addr(p));
    EXPECT_GE(region_end(region), addr(p) + len);
    EXPECT_EQ(mrc_region_prot(region) & prot, prot);
    EXPECT_EQ(mrc_region_key(region), CountingBackend::of(region)->key);
    return region;
  }
  void put(mrc_region_t *region) {
    if (region != nullptr) mrc_put(cache, region);
  }
  static uint64_t key(const mrc_region_t *region) {
    return region != nullptr ? mrc_region_key(region) : 0;
  }
  uint64_t get_put(const void *p, size_t len, unsigned prot = kRW) {
    mrc_region_t *region = get(p, len, prot);
    const uint64_t k = key(region);
    put(region);
    return k;
  }
  mrc_stats_t stats() {
    mrc_stats_t s{};
    EXPECT_EQ(mrc_cache_stats(cache, &s), MRC_OK);
    return s;
  }

  // The peers' page allocator (anonymous private memory), with a PROT_NONE guard page on each
  // side so that no two allocations are ever adjacent: the peers' scenarios never depend on
  // adjacency, mrcache's merges do (differences_test.cc pins that separately).
  static char *alloc_pages(size_t size, int prot = PROT_READ | PROT_WRITE) {
    void *area = mmap(nullptr, size + 2 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(area, MAP_FAILED) << std::strerror(errno);
    if (area == MAP_FAILED) return nullptr;
    char *p = static_cast<char *>(area) + kPage;
    void *inner = mmap(p, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    EXPECT_EQ(inner, p) << std::strerror(errno);
    return p;
  }
  static void free_pages(char *p, size_t size) {
    if (p != nullptr) munmap(p - kPage, size + 2 * kPage);
  }

  // The body of a UCX UCS_MT_TEST_F: run it on n threads at once, as the peer does.
  static void run_on_threads(int n, const std::function<void(Barrier &)> &body) {
    Barrier barrier(n);
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (int i = 0; i < n; ++i) threads.emplace_back([&] { body(barrier); });
    for (std::thread &thread : threads) thread.join();
  }

  CountingBackend backend;
  mrc_cache_t *cache = nullptr;
};

}  // namespace conformance
