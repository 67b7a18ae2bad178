// SPDX-License-Identifier: BSD-3-Clause
// What churn learning costs a buffer that stops churning (docs/DESIGN.md, "Churn"): an address
// whose buffers were each a new mapping for a number of messages, then one buffer that stays.
// Each iteration creates a cache over the io_uring engine, maps, gets, puts and unmaps a buffer
// at one address `churns` times, maps the steady buffer there and gets and puts it until a get
// hits. The counter `uncached_gets` is how many of its gets registered (uncached, or as a sample
// that was not hit yet) before that hit; the time is the whole iteration's, not a figure to
// compare.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "mrcache/backends.h"
#include "mrcache/mrcache.h"

namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr uint64_t kMostGets = 10000;

// The lowest page of a free area far larger than the buffer: mappings the runtime makes land at
// the top of it, never at the buffer's address.
void *free_address() {
  constexpr size_t kRoom = size_t{64} << 20;
  void *room = mmap(nullptr, kRoom, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (room == MAP_FAILED || munmap(room, kRoom) != 0) return nullptr;
  return room;
}

void *map_at(void *address, size_t length) {
  void *p = mmap(address, length, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != address) return nullptr;
  std::memset(p, 1, length);  // the application writes its message
  return p;
}

bool get_put(mrc_cache_t *cache, void *buffer, size_t length) {
  mrc_region_t *region = nullptr;
  if (mrc_get(cache, buffer, length, MRC_PROT_READ | MRC_PROT_WRITE, &region) != MRC_OK) {
    return false;
  }
  mrc_put(cache, region);
  return true;
}

void BM_SteadyBufferAfterChurn(benchmark::State &state) {
  const auto churns = static_cast<uint64_t>(state.range(0));
  const size_t length = static_cast<size_t>(state.range(1)) << 10;
  mrc_iouring_ctx_t *ctx = nullptr;
  if (mrc_iouring_ctx_create(nullptr, &ctx) != MRC_OK) {
    state.SkipWithError(mrc_last_error());
    return;
  }
  uint64_t uncached = 0;
  for (auto _ : state) {
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    params.backend = mrc_backend_iouring();
    params.backend_ctx = ctx;
    mrc_cache_t *cache = nullptr;
    void *address = free_address();
    if (address == nullptr || mrc_cache_create(&params, &cache) != MRC_OK) {
      state.SkipWithError("no cache, or no free address");
      break;
    }
    bool failed = false;
    for (uint64_t i = 0; i < churns && !failed; ++i) {
      void *buffer = map_at(address, length);
      failed = buffer == nullptr || !get_put(cache, buffer, length);
      if (buffer != nullptr) munmap(buffer, length);
    }
    void *steady = failed ? nullptr : map_at(address, length);
    uint64_t gets = 0;
    for (mrc_stats_t stats{}; steady != nullptr && gets < kMostGets; ++gets) {
      if (!get_put(cache, steady, length) || mrc_cache_stats(cache, &stats) != MRC_OK) {
        failed = true;
        break;
      }
      if (stats.hits_fast + stats.hits_slow != 0) break;
    }
    uncached += gets;
    if (steady != nullptr) munmap(steady, length);
    mrc_cache_destroy(cache);
    if (failed) {
      state.SkipWithError(mrc_last_error());
      break;
    }
  }
  mrc_iouring_ctx_destroy(ctx);
  state.counters["uncached_gets"] =
      benchmark::Counter(static_cast<double>(uncached), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_SteadyBufferAfterChurn)
    ->ArgNames({"churns", "KiB"})
    ->ArgsProduct({{2, 20, 200, 3000}, {64, 1024}})
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);

}  // namespace
