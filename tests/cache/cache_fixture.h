// SPDX-License-Identifier: BSD-3-Clause
// What the cache tests share: page-granular private mappings, and a fixture owning one cache over
// a counting backend that checks, at the end of each test, that destroy left nothing registered.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

#include "mrcache/mrcache.h"
#include "test_backend.h"

namespace mrc::test {

inline const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Private anonymous pages (at `at` with MAP_FIXED when given), present when writable.
inline char *map_pages(size_t pages, int prot = PROT_READ | PROT_WRITE, void *at = nullptr) {
  void *p =
      mmap(at, pages * kPage, prot, MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED : 0), -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (prot & PROT_WRITE) std::memset(p, 0x5a, pages * kPage);
  return static_cast<char *>(p);
}

inline bool monitor_caches() {
  mrc_monitor_info_t info;
  return mrc_monitor_info(&info) == MRC_OK && info.mode != MRC_MONITOR_UNCACHED;
}

class CacheFixture : public ::testing::Test {
 protected:
  void TearDown() override {
    if (cache != nullptr) mrc_cache_destroy(cache);
    EXPECT_EQ(backend.live_count(), 0u) << "registrations leaked past destroy";
  }
  // Replaces the fixture's cache.
  mrc_status_t create(mrc_cache_params_t params) {
    if (cache != nullptr) mrc_cache_destroy(cache);
    cache = nullptr;
    return mrc_cache_create(&params, &cache);
  }
  mrc_stats_t stats() {
    mrc_stats_t s{};
    EXPECT_EQ(mrc_cache_stats(cache, &s), MRC_OK);
    return s;
  }

  CountingBackend backend;
  mrc_cache_t *cache = nullptr;
};

}  // namespace mrc::test
