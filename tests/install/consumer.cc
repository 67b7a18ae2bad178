// SPDX-License-Identifier: BSD-3-Clause
// A C++ program from outside the project: the installed C API (and the C++ layer when it is
// installed) used the way a C++ runtime would. Built by install_test.sh through pkg-config and
// through find_package(mrcache). Exit 0 when every check holds.
#include <mrcache/mrcache.h>
#if __has_include(<mrcache/mrcache.hpp>)
#include <mrcache/mrcache.hpp>
#endif

#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

namespace {

int failures = 0;

void expect(bool ok, const char *what, int line) {
  if (!ok) {
    std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
    ++failures;
  }
}
#define EXPECT(cond) expect(static_cast<bool>(cond), #cond, __LINE__)

struct CacheDeleter {
  void operator()(mrc_cache_t *cache) const { mrc_cache_destroy(cache); }
};
using CachePtr = std::unique_ptr<mrc_cache_t, CacheDeleter>;

void round_trip() {
  constexpr size_t kLen = 64 * 1024;
  void *mem = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT(mem != MAP_FAILED);
  if (mem == MAP_FAILED) return;
  auto *buf = static_cast<char *>(mem);
  std::memset(buf, 1, kLen);
  {
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    params.backend = mrc_backend_null();
    mrc_cache_t *raw = nullptr;
    EXPECT(mrc_cache_create(&params, &raw) == MRC_OK);
    CachePtr cache(raw);
    if (cache) {
      for (int round = 0; round < 2; ++round) {
        mrc_region_t *region = nullptr;
        if (mrc_get(cache.get(), buf, kLen, MRC_PROT_READ, &region) != MRC_OK) {
          EXPECT(!"mrc_get failed");
          break;
        }
        auto *start = static_cast<char *>(mrc_region_start(region));
        EXPECT(start <= buf);
        EXPECT(start + mrc_region_length(region) >= buf + kLen);
        mrc_put(cache.get(), region);
      }
      mrc_stats_t stats{};
      EXPECT(mrc_cache_stats(cache.get(), &stats) == MRC_OK);
      EXPECT(stats.puts == 2);
    }
  }
  munmap(mem, kLen);
}

}  // namespace

int main() {
  const std::string expected = std::to_string(MRC_VERSION_MAJOR) + "." +
                               std::to_string(MRC_VERSION_MINOR) + "." +
                               std::to_string(MRC_VERSION_PATCH);
  EXPECT(expected == mrc_version());
  EXPECT(std::string(mrc_status_string(MRC_OK)) != mrc_status_string(MRC_ERR_NOT_FOUND));
  round_trip();
  const char *what = "version, status strings, get/put round trip";
  if (failures != 0) {
    std::fprintf(stderr, "consumer (C++): %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("consumer (C++) against mrcache %s: %s ok\n", mrc_version(), what);
  return 0;
}
