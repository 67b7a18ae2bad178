// SPDX-License-Identifier: BSD-3-Clause
// The cache's hit and miss paths, and the same workloads on UCX's ucs_rcache in the same run
// when libucx-dev is installed (MRC_HAVE_UCX). Both use a registration that does nothing, so
// the figures are the caches' own cost.
//
// Naming: BM_Cache<Workload>/<mode>/... is ours, BM_UcxRcache<Workload>/... is UCX's;
// scripts/bench.sh pairs them by <Workload> and prints ours/UCX. <mode> is the cache's: exact
// (the default: one mmap_changing probe per get) or fast (MRC_FLAG_ORDERED_UNMAPS: a probe per
// miss only); UCX has one mode only, so both of ours pair with the same UCX figure.
//
// The syscall floor the probe is judged against, in the same run: BM_SyscallGetpid (a raw
// syscall, which glibc cannot answer from a cache) and BM_UffdProbe (the probe's ioctl alone, on
// the monitor's userfaultfd shared by every thread, or on a userfaultfd of each thread's own: the
// two differ by what threads sharing one struct file pay in fdget). bench_report's summary
// states the exact mode's goals from these figures.
//
// Note: creating a UCX rcache installs UCM's libc hooks for the rest of the process; run the
// monitor benchmarks (which time munmap) in a separate process (scripts/bench.sh does).
#include <benchmark/benchmark.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "mrcache/mrcache.h"
#include "uffd/testing.h"

#ifdef MRC_HAVE_UCX
#include <ucm/api/ucm.h>
extern "C" {  // rcache.h has no C++ guard of its own
#include <ucs/memory/rcache.h>
}
#endif

namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr size_t kHitRegions = 64;  // one per thread, far apart
constexpr size_t kRegionPages = 16;

// Does nothing, like ucx_reg below: the miss benchmarks compare the caches, not the engines
// (a serial number from an atomic counter cost one locked instruction per miss on our side only).
mrc_status_t noop_reg(void *, void *, size_t, unsigned, void **handle, uint64_t *key) {
  *handle = nullptr;
  *key = 0;
  return MRC_OK;
}
void noop_dereg(void *, void *) {}
const mrc_backend_t kNoopBackend = {sizeof(mrc_backend_t), "noop", &noop_reg, &noop_dereg, nullptr};

char *map_region_pool(size_t regions, size_t pages_each) {
  // A gap page between regions so that neighbours never merge.
  const size_t stride = (pages_each + 1) * kPage;
  void *p =
      mmap(nullptr, regions * stride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  for (size_t i = 0; i < regions; ++i) {
    mprotect(static_cast<char *>(p) + i * stride + pages_each * kPage, kPage, PROT_NONE);
  }
  return static_cast<char *>(p);
}

// kBatch mappings of kNewMappingPages each, every one its own VMA (a PROT_NONE page between
// neighbours keeps the kernel from merging them): the first get of each is a first touch of a
// mapping, as for a buffer the application just allocated. Returns the reservation; map i is at
// reservation + i * (kNewMappingPages + 1) pages.
constexpr size_t kNewMappingPages = 4;
constexpr size_t kNewMappingBatch = 256;
char *map_separate_batch() {
  const size_t stride = (kNewMappingPages + 1) * kPage;
  void *p = mmap(nullptr, kNewMappingBatch * stride, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) std::abort();
  for (size_t i = 0; i < kNewMappingBatch; ++i) {
    if (mmap(static_cast<char *>(p) + i * stride, kNewMappingPages * kPage, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
      std::abort();
    }
  }
  return static_cast<char *>(p);
}
char *separate_mapping(char *batch, size_t index) {
  return batch + index * (kNewMappingPages + 1) * kPage;
}
void unmap_separate_batch(char *batch) {
  if (batch != nullptr) munmap(batch, kNewMappingBatch * (kNewMappingPages + 1) * kPage);
}

enum class Mode { kExact, kFast };

// One cache and one pool per mode for every benchmark of ours (threads share them, as a runtime
// would). Both caches subscribe to the one monitor, as two caches of one process do.
struct Ours {
  mrc_cache_t *cache = nullptr;
  char *pool = nullptr;
  explicit Ours(Mode mode) {
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    params.name = mode == Mode::kExact ? "bench-exact" : "bench-fast";
    params.backend = &kNoopBackend;
    if (mode == Mode::kFast) params.flags |= MRC_FLAG_ORDERED_UNMAPS;
    if (mrc_cache_create(&params, &cache) != MRC_OK) std::abort();
    pool = map_region_pool(kHitRegions, kRegionPages);
  }
  char *region(size_t index) const { return pool + index * (kRegionPages + 1) * kPage; }
};
Ours &ours(Mode mode) {
  if (mode == Mode::kFast) {
    static Ours fast(Mode::kFast);
    return fast;
  }
  static Ours exact(Mode::kExact);
  return exact;
}

void report_mode(benchmark::State &state) {
  mrc_monitor_info_t info;
  if (mrc_monitor_info(&info) == MRC_OK) state.SetLabel(info.mode_name);
}

// Hit: get + put of a cached region. Arg 0: every thread its own region; 1: all on region 0.
void BM_CacheHit(benchmark::State &state, Mode mode) {
  Ours &o = ours(mode);
  const bool shared = state.range(0) != 0;
  char *address = o.region(shared ? 0 : static_cast<size_t>(state.thread_index()));
  mrc_region_t *region = nullptr;
  if (mrc_get(o.cache, address, kPage, MRC_PROT_READ, &region) != MRC_OK) std::abort();
  mrc_put(o.cache, region);
  for (auto _ : state) {
    mrc_get(o.cache, address, kPage, MRC_PROT_READ, &region);
    benchmark::DoNotOptimize(region);
    mrc_put(o.cache, region);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) report_mode(state);
}
BENCHMARK_CAPTURE(BM_CacheHit, exact, Mode::kExact)
    ->ArgName("shared")
    ->Arg(0)
    ->Arg(1)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_CacheHit, fast, Mode::kFast)
    ->ArgName("shared")
    ->Arg(0)
    ->Arg(1)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();

// Miss in a range already watched: get + put + invalidate, so each iteration registers anew.
// A neighbour region in the same mapping keeps the mapping watched.
void miss_watched(benchmark::State &state, Ours &o) {
  char *address = o.region(kHitRegions - 1);
  mrc_region_t *anchor = nullptr;
  if (mrc_get(o.cache, address + (kRegionPages - 1) * kPage, kPage, MRC_PROT_READ, &anchor) !=
      MRC_OK) {
    std::abort();
  }
  for (auto _ : state) {
    mrc_region_t *region = nullptr;
    mrc_get(o.cache, address, kPage, MRC_PROT_READ, &region);
    mrc_invalidate(o.cache, region, nullptr, nullptr);
    mrc_put(o.cache, region);
  }
  mrc_put(o.cache, anchor);
  state.SetItemsProcessed(state.iterations());
  report_mode(state);
}
void BM_CacheMissWatched(benchmark::State &state, Mode mode) { miss_watched(state, ours(mode)); }
BENCHMARK_CAPTURE(BM_CacheMissWatched, exact, Mode::kExact);
BENCHMARK_CAPTURE(BM_CacheMissWatched, fast, Mode::kFast);

// The same miss while the application holds `held` regions that left the cache (invalidated,
// still referenced): it must cost what BM_CacheMissWatched costs, however many are held.
void BM_CacheMissWatchedHeldOut(benchmark::State &state, Mode mode) {
  Ours &o = ours(mode);
  const auto held = static_cast<size_t>(state.range(0));
  char *pool = map_region_pool(held, 1);
  std::vector<mrc_region_t *> regions(held);
  for (size_t i = 0; i < held; ++i) {
    if (mrc_get(o.cache, pool + i * 2 * kPage, kPage, MRC_PROT_READ, &regions[i]) != MRC_OK) {
      std::abort();
    }
    mrc_invalidate(o.cache, regions[i], nullptr, nullptr);
  }
  miss_watched(state, o);
  for (mrc_region_t *region : regions) mrc_put(o.cache, region);
  munmap(pool, held * 2 * kPage);
}
BENCHMARK_CAPTURE(BM_CacheMissWatchedHeldOut, exact, Mode::kExact)->ArgName("held")->Arg(10000);
BENCHMARK_CAPTURE(BM_CacheMissWatchedHeldOut, fast, Mode::kFast)->ArgName("held")->Arg(10000);

// The life of a hot region: a miss, kHotHits hits (enough for our cache to park the reference),
// then invalidate while held and the last put. Ours pays for its lock-free hits here: the
// invalidation of a region whose references were parked waits for the readers (membarrier).
constexpr int kHotHits = 16;
void BM_CacheHotRegionLife(benchmark::State &state, Mode mode) {
  Ours &o = ours(mode);
  char *address = o.region(kHitRegions - 2);
  for (auto _ : state) {
    mrc_region_t *region = nullptr;
    for (int i = 0; i < kHotHits; ++i) {
      mrc_get(o.cache, address, kPage, MRC_PROT_READ, &region);
      mrc_put(o.cache, region);
    }
    mrc_get(o.cache, address, kPage, MRC_PROT_READ, &region);
    mrc_invalidate(o.cache, region, nullptr, nullptr);
    mrc_put(o.cache, region);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_CAPTURE(BM_CacheHotRegionLife, exact, Mode::kExact);
BENCHMARK_CAPTURE(BM_CacheHotRegionLife, fast, Mode::kFast);

// Miss on the first touch of a new mapping (its own VMA): the watch itself is part of the cost.
void BM_CacheMissNewMapping(benchmark::State &state, Mode mode) {
  Ours &o = ours(mode);
  char *batch = nullptr;
  size_t next = kNewMappingBatch;
  for (auto _ : state) {
    if (next == kNewMappingBatch) {
      state.PauseTiming();
      mrc_cache_purge(o.cache);
      unmap_separate_batch(batch);
      batch = map_separate_batch();
      next = 0;
      state.ResumeTiming();
    }
    mrc_region_t *region = nullptr;
    mrc_get(o.cache, separate_mapping(batch, next++), kPage, MRC_PROT_READ, &region);
    mrc_put(o.cache, region);
  }
  mrc_cache_purge(o.cache);  // after the timed loop
  unmap_separate_batch(batch);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_CAPTURE(BM_CacheMissNewMapping, exact, Mode::kExact);
BENCHMARK_CAPTURE(BM_CacheMissNewMapping, fast, Mode::kFast);

// The get and put of a buffer that is a new mapping for every message, at the same address (as
// glibc's malloc hands out above its mmap threshold): after two messages the cache registers it
// uncached, with no probe and no lookup (docs/DESIGN.md, "Churn"); one miss in 16 to 1024 is a
// cached sample, whose watch is timed too. Only the get and the put are timed (manual time):
// the mapping and its munmap are the application's. UCX's twin: a miss at every message, its
// munmap hook having invalidated the last one.
template <typename GetPut>
void time_gets_of_churning_buffer(benchmark::State &state, GetPut get_put) {
  void *const address = mmap(nullptr, kNewMappingPages * kPage, PROT_NONE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (address == MAP_FAILED || munmap(address, kNewMappingPages * kPage) != 0) std::abort();
  for (auto _ : state) {
    void *buffer = mmap(address, kNewMappingPages * kPage, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (buffer != address) {
      state.SkipWithError("something else was mapped at the buffer's address");
      break;
    }
    timespec began{}, ended{};
    clock_gettime(CLOCK_MONOTONIC, &began);
    get_put(buffer);
    clock_gettime(CLOCK_MONOTONIC, &ended);
    state.SetIterationTime(static_cast<double>(ended.tv_sec - began.tv_sec) +
                           static_cast<double>(ended.tv_nsec - began.tv_nsec) * 1e-9);
    munmap(buffer, kNewMappingPages * kPage);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_CacheMissChurning(benchmark::State &state, Mode mode) {
  Ours &o = ours(mode);
  time_gets_of_churning_buffer(state, [&o](void *buffer) {
    mrc_region_t *region = nullptr;
    mrc_get(o.cache, buffer, kNewMappingPages * kPage, MRC_PROT_READ, &region);
    mrc_put(o.cache, region);
  });
}
BENCHMARK_CAPTURE(BM_CacheMissChurning, exact, Mode::kExact)->UseManualTime();
BENCHMARK_CAPTURE(BM_CacheMissChurning, fast, Mode::kFast)->UseManualTime();

// The whole life of a buffer that is a new mapping: mmap, the first get, put, munmap, all
// timed (the application pays each). Its own VMA between PROT_NONE guards at one address, so
// every iteration does the same VMA work. <mode>: exact (churn learning on, as an application
// gets it: the address is soon learned as churning and its gets register uncached), or
// exact_cached (MRC_FLAG_CACHE_CHURN: every get caches, so every munmap is of cached memory and
// the next get drains it). BM_NewMappingLifePlain: mmap and munmap alone, no get (run it before
// any cache or UCX's rcache exists in the process: both change what munmap costs).
struct GuardedSlot {
  char *reserved = nullptr;
  char *address = nullptr;
  size_t bytes = kNewMappingPages * kPage;
  GuardedSlot() {
    void *p = mmap(nullptr, bytes + 2 * kPage, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) std::abort();
    reserved = static_cast<char *>(p);
    address = reserved + kPage;
    if (munmap(address, bytes) != 0) std::abort();
  }
  ~GuardedSlot() { munmap(reserved, bytes + 2 * kPage); }
  GuardedSlot(const GuardedSlot &) = delete;
  GuardedSlot &operator=(const GuardedSlot &) = delete;
  char *map() const {
    void *p = mmap(address, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    return p == address ? address : nullptr;
  }
};

template <typename GetPut>
void time_new_mapping_lives(benchmark::State &state, GetPut get_put) {
  const GuardedSlot slot;
  for (auto _ : state) {
    char *buffer = slot.map();
    if (buffer == nullptr) {
      state.SkipWithError("something else was mapped at the buffer's address");
      break;
    }
    get_put(buffer);
    munmap(buffer, slot.bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_NewMappingLifePlain(benchmark::State &state) {
  time_new_mapping_lives(state, [](void *) {});
}
BENCHMARK(BM_NewMappingLifePlain)->UseRealTime();

void BM_CacheNewMappingLife(benchmark::State &state, bool cache_churn) {
  static mrc_cache_t *cached_every = [] {
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    params.name = "bench-life-cached";
    params.backend = &kNoopBackend;
    params.flags |= MRC_FLAG_CACHE_CHURN;
    mrc_cache_t *cache = nullptr;
    if (mrc_cache_create(&params, &cache) != MRC_OK) std::abort();
    return cache;
  }();
  mrc_cache_t *cache = cache_churn ? cached_every : ours(Mode::kExact).cache;
  mrc_stats_t before{};
  mrc_cache_stats(cache, &before);
  time_new_mapping_lives(state, [cache](void *buffer) {
    mrc_region_t *region = nullptr;
    mrc_get(cache, buffer, kNewMappingPages * kPage, MRC_PROT_READ, &region);
    mrc_put(cache, region);
  });
  mrc_stats_t after{};
  mrc_cache_stats(cache, &after);
  state.counters["uncached_per_op"] =
      benchmark::Counter(static_cast<double>(after.uncacheable - before.uncacheable),
                         benchmark::Counter::kAvgIterations);
  report_mode(state);
}
BENCHMARK_CAPTURE(BM_CacheNewMappingLife, exact, false)->UseRealTime();
BENCHMARK_CAPTURE(BM_CacheNewMappingLife, exact_cached, true)->UseRealTime();

// The floor of any syscall here. syscall() itself: glibc's getpid() may answer from a cache.
void BM_SyscallGetpid(benchmark::State &state) {
  for (auto _ : state) benchmark::DoNotOptimize(syscall(SYS_getpid));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SyscallGetpid)->Threads(1)->Threads(2)->UseRealTime();

// Whether `fd` answers the probe as a running monitor's userfaultfd does (EINVAL: nothing in
// flight); the benchmark is skipped, saying why, when it does not.
bool probe_answers_or_skip(benchmark::State &state, int fd) {
  uffdio_zeropage probe{};
  if (fd >= 0 && ioctl(fd, UFFDIO_ZEROPAGE, &probe) != 0 && errno == EINVAL) return true;
  state.SkipWithError("no userfaultfd that answers the probe (no monitor running?)");
  return false;
}

// The exact mode's probe alone: the raw ioctl that uffd::Subscription::probe_unmaps() issues per
// get (UFFDIO_ZEROPAGE of an empty range: EINVAL while no unmap is in flight). On the monitor's
// descriptor, every thread probes one struct file, whose reference count fdget takes in a
// multithreaded process; own_fd gives each thread a userfaultfd of its own, the same ioctl
// without that shared line, so the two at 2 threads show whether the sharing costs.
void BM_UffdProbe(benchmark::State &state, bool own_fd) {
  ours(Mode::kExact);  // an exact cache keeps the monitor running
  int fd = mrc::uffd::testing::monitor_fd();
  if (own_fd) {
    fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
    // Handshaken, or the ioctl would stop at the uninitialised check before the probed one.
    uffdio_api api{UFFD_API, UFFD_FEATURE_EVENT_UNMAP, 0};
    if (fd >= 0 && ioctl(fd, UFFDIO_API, &api) != 0) {
      close(fd);
      fd = -1;
    }
  }
  uffdio_zeropage probe{};
  if (!probe_answers_or_skip(state, fd)) {
    if (own_fd && fd >= 0) close(fd);
    return;
  }
  for (auto _ : state) {
    probe = {};
    benchmark::DoNotOptimize(ioctl(fd, UFFDIO_ZEROPAGE, &probe));
  }
  if (own_fd) close(fd);
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) report_mode(state);
}
BENCHMARK_CAPTURE(BM_UffdProbe, monitor_fd, false)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_UffdProbe, own_fd, true)->Threads(1)->Threads(2)->UseRealTime();

// The floor of an exact hit: the probe's ioctl issued by the loop itself, then a fast-mode hit.
// What BM_CacheHit/exact costs above this is the function levels between mrc_get and its ioctl
// (on some machines every return after a system call is mispredicted).
void BM_ProbeThenFastHit(benchmark::State &state) {
  ours(Mode::kExact);  // an exact cache keeps the monitor running
  Ours &fast = ours(Mode::kFast);
  const int fd = mrc::uffd::testing::monitor_fd();
  if (!probe_answers_or_skip(state, fd)) return;
  uffdio_zeropage probe{};
  char *address = fast.region(0);
  mrc_region_t *region = nullptr;
  if (mrc_get(fast.cache, address, kPage, MRC_PROT_READ, &region) != MRC_OK) std::abort();
  mrc_put(fast.cache, region);
  for (auto _ : state) {
    probe = {};
    benchmark::DoNotOptimize(ioctl(fd, UFFDIO_ZEROPAGE, &probe));
    mrc_get(fast.cache, address, kPage, MRC_PROT_READ, &region);
    benchmark::DoNotOptimize(region);
    mrc_put(fast.cache, region);
  }
  state.SetItemsProcessed(state.iterations());
  report_mode(state);
}
BENCHMARK(BM_ProbeThenFastHit)->UseRealTime();

#ifdef MRC_HAVE_UCX

ucs_status_t ucx_reg(void *, ucs_rcache_t *, void *, ucs_rcache_region_t *, uint16_t) {
  return UCS_OK;
}
void ucx_dereg(void *, ucs_rcache_t *, ucs_rcache_region_t *) {}
void ucx_dump(void *, ucs_rcache_t *, ucs_rcache_region_t *, char *buf, size_t max) {
  if (max != 0) buf[0] = '\0';
}
const ucs_rcache_ops_t kUcxOps = {&ucx_reg, &ucx_dereg, &ucx_dump};

struct Ucx {
  ucs_rcache_t *rcache = nullptr;
  char *pool = nullptr;
  Ucx() {
    ucs_rcache_params_t params{};
    params.region_struct_size = sizeof(ucs_rcache_region_t);
    params.alignment = 64;
    params.max_alignment = kPage;
    params.ucm_events = UCM_EVENT_VM_UNMAPPED;
    params.ucm_event_priority = 1000;
    params.ops = &kUcxOps;
    params.context = nullptr;
    params.flags = 0;
    params.max_regions = static_cast<unsigned long>(-1);
    params.max_size = static_cast<size_t>(-1);
    params.max_unreleased = static_cast<size_t>(-1);
    if (ucs_rcache_create(&params, "bench", nullptr, &rcache) != UCS_OK) std::abort();
    pool = map_region_pool(kHitRegions, kRegionPages);
  }
  char *region(size_t index) const { return pool + index * (kRegionPages + 1) * kPage; }
};
Ucx &ucx() {
  static Ucx instance;
  return instance;
}

void BM_UcxRcacheHit(benchmark::State &state) {
  Ucx &u = ucx();
  const bool shared = state.range(0) != 0;
  char *address = u.region(shared ? 0 : static_cast<size_t>(state.thread_index()));
  ucs_rcache_region_t *region = nullptr;
  if (ucs_rcache_get(u.rcache, address, kPage, PROT_READ, nullptr, &region) != UCS_OK) std::abort();
  ucs_rcache_region_put(u.rcache, region);
  for (auto _ : state) {
    ucs_rcache_get(u.rcache, address, kPage, PROT_READ, nullptr, &region);
    benchmark::DoNotOptimize(region);
    ucs_rcache_region_put(u.rcache, region);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UcxRcacheHit)
    ->ArgName("shared")
    ->Arg(0)
    ->Arg(1)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();

void BM_UcxRcacheMissWatched(benchmark::State &state) {
  Ucx &u = ucx();
  char *address = u.region(kHitRegions - 1);
  for (auto _ : state) {
    ucs_rcache_region_t *region = nullptr;
    ucs_rcache_get(u.rcache, address, kPage, PROT_READ, nullptr, &region);
    ucs_rcache_region_invalidate(
        u.rcache, region, [](void *) {}, nullptr);
    ucs_rcache_region_put(u.rcache, region);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UcxRcacheMissWatched);

void BM_UcxRcacheHotRegionLife(benchmark::State &state) {
  Ucx &u = ucx();
  char *address = u.region(kHitRegions - 2);
  for (auto _ : state) {
    ucs_rcache_region_t *region = nullptr;
    for (int i = 0; i < kHotHits; ++i) {
      ucs_rcache_get(u.rcache, address, kPage, PROT_READ, nullptr, &region);
      ucs_rcache_region_put(u.rcache, region);
    }
    ucs_rcache_get(u.rcache, address, kPage, PROT_READ, nullptr, &region);
    ucs_rcache_region_invalidate(
        u.rcache, region, [](void *) {}, nullptr);
    ucs_rcache_region_put(u.rcache, region);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UcxRcacheHotRegionLife);

void BM_UcxRcacheMissNewMapping(benchmark::State &state) {
  Ucx &u = ucx();
  char *batch = nullptr;  // UCM's munmap hook invalidates the regions
  size_t next = kNewMappingBatch;
  for (auto _ : state) {
    if (next == kNewMappingBatch) {
      state.PauseTiming();
      unmap_separate_batch(batch);
      batch = map_separate_batch();
      next = 0;
      state.ResumeTiming();
    }
    ucs_rcache_region_t *region = nullptr;
    ucs_rcache_get(u.rcache, separate_mapping(batch, next++), kPage, PROT_READ, nullptr, &region);
    ucs_rcache_region_put(u.rcache, region);
  }
  unmap_separate_batch(batch);  // after the timed loop
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UcxRcacheMissNewMapping);

void BM_UcxRcacheMissChurning(benchmark::State &state) {
  Ucx &u = ucx();
  time_gets_of_churning_buffer(state, [&u](void *buffer) {
    ucs_rcache_region_t *region = nullptr;
    ucs_rcache_get(u.rcache, buffer, kNewMappingPages * kPage, PROT_READ, nullptr, &region);
    ucs_rcache_region_put(u.rcache, region);
  });
}
BENCHMARK(BM_UcxRcacheMissChurning)->UseManualTime();

// UCX's twin of BM_CacheNewMappingLife: its munmap hook invalidates the region.
void BM_UcxRcacheNewMappingLife(benchmark::State &state) {
  Ucx &u = ucx();
  time_new_mapping_lives(state, [&u](void *buffer) {
    ucs_rcache_region_t *region = nullptr;
    ucs_rcache_get(u.rcache, buffer, kNewMappingPages * kPage, PROT_READ, nullptr, &region);
    ucs_rcache_region_put(u.rcache, region);
  });
}
BENCHMARK(BM_UcxRcacheNewMappingLife)->UseRealTime();

#endif  // MRC_HAVE_UCX

}  // namespace
