// SPDX-License-Identifier: BSD-3-Clause
// Watching memory (mrc::uffd::watch/unwatch) and what a watched mapping costs the application:
//
//   BM_WatchArmed                 watch() of a page in a mapping that is already registered.
//   BM_UnwatchArmed               unwatch() of such a page (the mapping keeps other watches).
//   BM_WatchUnwatchArmed          the pair.
//   BM_WatchUnwatchArmedShared    the pair, by 1 or 2 threads on pages of one armed mapping (the
//                                 count of its piece is the only shared write): wall time per
//                                 pair and items_per_second for all threads together.
//   BM_WatchUnwatchLast           the pair on a mapping that nothing else watches: the unwatch
//                                 drops the last watch of the mapping, the next watch takes the
//                                 first again (a syscall each unless idle mappings stay
//                                 registered for a while).
//   BM_WatchSpurious/<op>/<on>    the application's own munmap (op 0) or madvise(DONTNEED)
//                                 (op 1) of single pages of a 64 MiB mapping in which one page,
//                                 far from those, is watched (on 1) or nothing is (on 0).
//                                 Counter events_per_op: monitor events each one produced (every
//                                 event is a round trip through the monitor thread for the
//                                 calling thread).
//
// Goal: a cache miss in a watched range costs at most half of UCX's (~200 ns here),
// so watch() and unwatch() of armed memory must make no syscall (~250 ns each here); target
// < 40 ns each, uncontended. Run in a process of its own (--benchmark_filter=BM_Watch): UCX's
// rcache, created by bench_cache, patches libc's munmap for the rest of its process.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "uffd/testing.h"
#include "uffd/uffd.h"

namespace {

using mrc::uffd::Invalidation;
using mrc::uffd::Monitor;
using mrc::uffd::Subscription;
using mrc::uffd::WatchResult;

constexpr size_t kPage = 4096;
constexpr size_t kMapping = size_t{64} << 20;

struct Subscribed {
  Subscription *subscription = nullptr;
  Subscribed() {
    if (mrc::uffd::subscribe(&subscription) != MRC_OK) std::abort();
  }
  ~Subscribed() { mrc::uffd::unsubscribe(subscription); }
  Subscribed(const Subscribed &) = delete;
  Subscribed &operator=(const Subscribed &) = delete;
  bool cached() const { return subscription->mode() != MRC_MONITOR_UNCACHED; }
};

// A 64 MiB mapping, never touched (MAP_NORESERVE); unmapped at the end.
struct Mapping {
  char *base = nullptr;
  Mapping() {
    void *p = mmap(nullptr, kMapping, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) base = static_cast<char *>(p);
  }
  ~Mapping() {
    if (base != nullptr) munmap(base, kMapping);
  }
  Mapping(const Mapping &) = delete;
  Mapping &operator=(const Mapping &) = delete;
  uintptr_t at(size_t offset) const { return reinterpret_cast<uintptr_t>(base) + offset; }
};

// A Mapping with one page at its start watched, so that it stays armed. Watches need the monitor
// that a subscription keeps running.
struct ArmedMapping : Mapping {
  bool ok = false;
  explicit ArmedMapping(const Subscribed & /*running*/) {
    ok = base != nullptr && mrc::uffd::watch(at(0), kPage) == WatchResult::Watched;
  }
  ~ArmedMapping() {
    if (ok) mrc::uffd::unwatch(at(0), kPage);
  }
  ArmedMapping(const ArmedMapping &) = delete;
  ArmedMapping &operator=(const ArmedMapping &) = delete;
  // Pages 1..255 of the first MiB, in turn (a cache's regions: near each other).
  uintptr_t page(uint64_t i) const { return at((1 + i % 255) * kPage); }
};

// Skips the benchmark, saying why, unless the monitor watches and the mapping is ready.
bool usable(benchmark::State &state, const Subscribed &sub, bool mapping_ready) {
  if (!sub.cached()) {
    state.SkipWithError("no userfaultfd here (uncached mode)");
    return false;
  }
  if (!mapping_ready) {
    state.SkipWithError("could not map (and watch) the mapping");
    return false;
  }
  return true;
}
bool usable(benchmark::State &state, const Subscribed &sub, const ArmedMapping &mapping) {
  return usable(state, sub, mapping.ok);
}

void check_no_registration(benchmark::State &state, uint64_t before) {
  if (mrc::uffd::testing::registrations() != before) {
    state.SkipWithError("armed memory was registered again (a syscall on the fast path)");
  }
}

void BM_WatchArmed(benchmark::State &state) {
  Subscribed sub;
  ArmedMapping mapping(sub);
  if (!usable(state, sub, mapping)) return;
  const uint64_t registrations = mrc::uffd::testing::registrations();
  uint64_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(mrc::uffd::watch(mapping.page(i++), kPage));
  }
  check_no_registration(state, registrations);
  for (uint64_t k = 0; k < i; ++k) mrc::uffd::unwatch(mapping.page(k), kPage);
}
BENCHMARK(BM_WatchArmed);

void BM_UnwatchArmed(benchmark::State &state) {
  constexpr uint64_t kCount = uint64_t{1} << 20;
  Subscribed sub;
  ArmedMapping mapping(sub);
  if (!usable(state, sub, mapping)) return;
  for (uint64_t k = 0; k < kCount; ++k) {
    if (mrc::uffd::watch(mapping.page(k), kPage) != WatchResult::Watched) {
      state.SkipWithError("watch failed");
      return;
    }
  }
  const uint64_t registrations = mrc::uffd::testing::registrations();
  uint64_t i = 0;
  for (auto _ : state) mrc::uffd::unwatch(mapping.page(i++), kPage);
  check_no_registration(state, registrations);
  for (; i < kCount; ++i) mrc::uffd::unwatch(mapping.page(i), kPage);
}
BENCHMARK(BM_UnwatchArmed)->Iterations(uint64_t{1} << 20);

void BM_WatchUnwatchArmed(benchmark::State &state) {
  Subscribed sub;
  ArmedMapping mapping(sub);
  if (!usable(state, sub, mapping)) return;
  const uint64_t registrations = mrc::uffd::testing::registrations();
  uint64_t i = 0;
  for (auto _ : state) {
    const uintptr_t at = mapping.page(i++);
    benchmark::DoNotOptimize(mrc::uffd::watch(at, kPage));
    mrc::uffd::unwatch(at, kPage);
  }
  check_no_registration(state, registrations);
}
BENCHMARK(BM_WatchUnwatchArmed);

void BM_WatchUnwatchArmedShared(benchmark::State &state) {
  struct Shared {
    Subscribed sub;
    ArmedMapping mapping{sub};
  };
  static Shared *shared = nullptr;  // made by thread 0; the loop's start barrier publishes it
  if (state.thread_index() == 0) shared = new Shared;
  uint64_t i = static_cast<uint64_t>(state.thread_index()) * 128;
  uint64_t registrations = 0;
  for (auto _ : state) {
    if (registrations == 0) {
      if (!usable(state, shared->sub, shared->mapping)) break;
      registrations = mrc::uffd::testing::registrations();
    }
    const uintptr_t at = shared->mapping.page(i++);
    benchmark::DoNotOptimize(mrc::uffd::watch(at, kPage));
    mrc::uffd::unwatch(at, kPage);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {  // every thread has left the loop (its end barrier)
    check_no_registration(state, registrations);
    delete shared;
    shared = nullptr;
  }
}
BENCHMARK(BM_WatchUnwatchArmedShared)->Threads(1)->Threads(2)->UseRealTime();

void BM_WatchUnwatchLast(benchmark::State &state) {
  Subscribed sub;
  Mapping mapping;
  if (!usable(state, sub, mapping.base != nullptr)) return;
  const uint64_t registrations = mrc::uffd::testing::registrations();
  for (auto _ : state) {
    benchmark::DoNotOptimize(mrc::uffd::watch(mapping.at(kPage), kPage));
    mrc::uffd::unwatch(mapping.at(kPage), kPage);
  }
  state.counters["registrations_per_op"] =
      benchmark::Counter(static_cast<double>(mrc::uffd::testing::registrations() - registrations),
                         benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_WatchUnwatchLast);

void BM_WatchSpurious(benchmark::State &state) {
  const bool madvise_op = state.range(0) == 1;
  const bool watched = state.range(1) == 1;
  Subscribed sub;
  Mapping mapping;
  if (!usable(state, sub, mapping.base != nullptr)) return;
  char *base = mapping.base;
  // The watched page is the last one; the application works on the first half, 32 MiB away.
  char *watched_page = base + kMapping - kPage;
  if (watched &&
      mrc::uffd::watch(reinterpret_cast<uintptr_t>(watched_page), kPage) != WatchResult::Watched) {
    state.SkipWithError("watch failed");
    return;
  }
  const uint64_t events_before = [] {
    mrc_monitor_info_t info;
    Monitor::info(&info);
    return info.events;
  }();
  uint64_t i = 0;
  for (auto _ : state) {
    // Every other page of the first half: each munmap makes a hole of its own.
    char *at = base + (2 * i++ * kPage) % (kMapping / 2);
    if (madvise_op) {
      madvise(at, kPage, MADV_DONTNEED);
    } else {
      munmap(at, kPage);
    }
  }
  mrc_monitor_info_t info;
  Monitor::info(&info);
  state.counters["events_per_op"] = benchmark::Counter(
      static_cast<double>(info.events - events_before), benchmark::Counter::kAvgIterations);
  (void)sub.subscription->drain([](const Invalidation &) {});
  if (watched) mrc::uffd::unwatch(reinterpret_cast<uintptr_t>(watched_page), kPage);
}
BENCHMARK(BM_WatchSpurious)
    ->ArgNames({"madvise", "watched"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Iterations(4096);

}  // namespace
