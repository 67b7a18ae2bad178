// The userfaultfd monitor's costs, with the references they are judged against, in one run:
//
//   BM_MonitorRoundTrip/<loop>          munmap of a watched 64 KiB range (re-mmapped and
//                                       watched, untimed, before each iteration): the event
//                                       round trip. loop 0 = io_uring (the monitor's normal
//                                       loop), 1 = the poll(2) fallback.
//   BM_MonitorPipePingPong              one round trip between two threads over two pipes.
//   BM_MonitorMunmapPlain               munmap of 64 KiB, never watched, no monitor.
//   BM_MonitorMunmapUnwatched/<running> munmap of unwatched memory, monitor stopped (0) or
//                                       running (1); goal <= 1.02x (UCX's hooks: ~1.11x).
//   BM_MonitorUffdRegister/<bytes>      one UFFDIO_REGISTER (write-protect mode) of a range
//                                       inside a larger mapping.
//   BM_MonitorWatchArmed                watch()+unwatch() on a block that stays armed.
//   BM_MonitorWatchFirst                watch() of a fresh block: mapping query + registration.
//   BM_MonitorSummary                   the ratios: round-trip overhead (round trip minus plain
//                                       munmap) over ping-pong, goal <= 1.2; unwatched munmap
//                                       with over without the monitor.
//
// Every timed benchmark reports the median per operation (counter median_us); the summary uses
// medians, which the noisy shared VM affects least. Run these in a process of their own
// (--benchmark_filter=BM_Monitor): UCX's rcache, created by bench_cache, patches libc's munmap
// for the rest of its process.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "uffd/uffd.h"

namespace {

using mrc::uffd::Consumer;
using mrc::uffd::Invalidation;
using mrc::uffd::Monitor;
using mrc::uffd::WatchResult;

constexpr size_t kRange = 64 << 10;

double now_seconds() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Medians by benchmark name, for the summary.
std::map<std::string, double> &medians() {
  static std::map<std::string, double> all;
  return all;
}

void report(benchmark::State &state, std::vector<double> &samples, const std::string &key) {
  if (samples.empty()) return;
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  const double median = samples[samples.size() / 2];
  state.counters["median_us"] = median * 1e6;
  auto found = medians().find(key);
  // A benchmark run twice (alternating runs) contributes the mean of its medians.
  medians()[key] = found == medians().end() ? median : (found->second + median) / 2;
}

// A subscription for one benchmark run.
struct Subscribed {
  Consumer *consumer = nullptr;
  Subscribed() {
    if (Monitor::subscribe(&consumer) != MRC_OK) std::abort();
  }
  ~Subscribed() { Monitor::unsubscribe(consumer); }
  bool cached() const { return consumer->mode() != MRC_MONITOR_UNCACHED; }
};

char *map_touched(void *hint, int extra_flags) {
  void *p =
      mmap(hint, kRange, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  for (size_t off = 0; off < kRange; off += 4096) static_cast<char *>(p)[off] = 1;
  return static_cast<char *>(p);
}

void BM_MonitorRoundTrip(benchmark::State &state) {
  const bool poll_loop = state.range(0) == 1;
  mrc::uffd::testing::force_poll_loop(poll_loop);
  {
    Subscribed sub;
    if (!sub.cached()) {
      state.SkipWithError("no userfaultfd here (uncached mode)");
      mrc::uffd::testing::force_poll_loop(false);
      return;
    }
    std::vector<double> samples;
    samples.reserve(1 << 16);  // before choosing the address: malloc could mmap it
    char *address = map_touched(nullptr, 0);
    munmap(address, kRange);
    for (auto _ : state) {
      char *p = map_touched(address, MAP_FIXED_NOREPLACE);
      if (p != address ||
          sub.consumer->watch(reinterpret_cast<uintptr_t>(p), kRange) != WatchResult::Watched) {
        state.SkipWithError("could not map and watch the range");
        break;
      }
      const double start = now_seconds();
      munmap(p, kRange);
      const double elapsed = now_seconds() - start;
      state.SetIterationTime(elapsed);
      samples.push_back(elapsed);
      (void)sub.consumer->drain([](const Invalidation &) {});
      sub.consumer->unwatch(reinterpret_cast<uintptr_t>(p), kRange);
    }
    report(state, samples, poll_loop ? "roundtrip_poll" : "roundtrip");
  }
  mrc::uffd::testing::force_poll_loop(false);
}
BENCHMARK(BM_MonitorRoundTrip)->Arg(0)->Arg(1)->UseManualTime()->Iterations(20000);

void BM_MonitorPipePingPong(benchmark::State &state) {
  int there[2];
  int back[2];
  if (pipe(there) != 0 || pipe(back) != 0) std::abort();
  std::thread echo([&] {
    char byte;
    while (read(there[0], &byte, 1) == 1 && byte != 0) {
      if (write(back[1], &byte, 1) != 1) break;
    }
  });
  std::vector<double> samples;
  samples.reserve(1 << 16);
  char byte = 1;
  for (auto _ : state) {
    const double start = now_seconds();
    if (write(there[1], &byte, 1) != 1 || read(back[0], &byte, 1) != 1) std::abort();
    const double elapsed = now_seconds() - start;
    state.SetIterationTime(elapsed);
    samples.push_back(elapsed);
  }
  byte = 0;
  if (write(there[1], &byte, 1) != 1) std::abort();
  echo.join();
  for (int fd : {there[0], there[1], back[0], back[1]}) close(fd);
  report(state, samples, "pingpong");
}
BENCHMARK(BM_MonitorPipePingPong)->UseManualTime()->Iterations(20000);

void time_munmaps(benchmark::State &state, const std::string &key) {
  std::vector<double> samples;
  samples.reserve(1 << 16);
  for (auto _ : state) {
    char *p = map_touched(nullptr, 0);
    const double start = now_seconds();
    munmap(p, kRange);
    const double elapsed = now_seconds() - start;
    state.SetIterationTime(elapsed);
    samples.push_back(elapsed);
  }
  report(state, samples, key);
}

void BM_MonitorMunmapPlain(benchmark::State &state) { time_munmaps(state, "munmap_plain"); }
BENCHMARK(BM_MonitorMunmapPlain)->UseManualTime()->Iterations(20000);

void BM_MonitorMunmapUnwatched(benchmark::State &state) {
  if (state.range(0) == 0) {
    time_munmaps(state, "unwatched_no_monitor");
    return;
  }
  Subscribed sub;
  if (!sub.cached()) {
    state.SkipWithError("no userfaultfd here (uncached mode)");
    return;
  }
  // Something is watched elsewhere, as in a real process.
  char *watched = map_touched(nullptr, 0);
  (void)sub.consumer->watch(reinterpret_cast<uintptr_t>(watched), kRange);
  time_munmaps(state, "unwatched_monitor");
  sub.consumer->unwatch(reinterpret_cast<uintptr_t>(watched), kRange);
  munmap(watched, kRange);
}
// Alternating runs of both, so that drift on the shared machine hits both alike.
BENCHMARK(BM_MonitorMunmapUnwatched)
    ->Arg(0)
    ->Arg(1)
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(20000);

void BM_MonitorUffdRegister(benchmark::State &state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const int uffd =
      static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  uffdio_api api{UFFD_API, UFFD_FEATURE_EVENT_UNMAP, 0};
  if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) != 0) {
    state.SkipWithError("no userfaultfd here");
    if (uffd >= 0) close(uffd);
    return;
  }
  // Registration inside a larger mapping: the kernel splits the VMA, as for a watched block.
  const size_t total = bytes * 3;
  void *mapping = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping == MAP_FAILED) std::abort();
  uffdio_register request{};
  request.range.start = reinterpret_cast<uintptr_t>(mapping) + bytes;
  request.range.len = bytes;
  request.mode = UFFDIO_REGISTER_MODE_WP;
  std::vector<double> samples;
  samples.reserve(1 << 16);
  for (auto _ : state) {
    const double start = now_seconds();
    const int rc = ioctl(uffd, UFFDIO_REGISTER, &request);
    const double elapsed = now_seconds() - start;
    if (rc != 0) {
      state.SkipWithError("UFFDIO_REGISTER failed");
      break;
    }
    state.SetIterationTime(elapsed);
    samples.push_back(elapsed);
    ioctl(uffd, UFFDIO_UNREGISTER, &request.range);
  }
  munmap(mapping, total);
  close(uffd);
  report(state, samples, "register_" + std::to_string(bytes));
}
BENCHMARK(BM_MonitorUffdRegister)
    ->Arg(4096)
    ->Arg(64 << 10)
    ->Arg(2 << 20)
    ->Arg(1 << 30)
    ->UseManualTime()
    ->Iterations(20000);

void BM_MonitorWatchArmed(benchmark::State &state) {
  Subscribed sub;
  if (!sub.cached()) {
    state.SkipWithError("no userfaultfd here (uncached mode)");
    return;
  }
  const size_t length = 2 << 20;
  void *block = mmap(nullptr, 2 * length, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  const uintptr_t base = (reinterpret_cast<uintptr_t>(block) + length - 1) & ~(length - 1);
  // The base watch keeps the block armed; the timed pairs never register or unregister.
  (void)sub.consumer->watch(base, 4096);
  const uint64_t registrations = mrc::uffd::testing::registrations();
  uintptr_t at = base + 4096;
  for (auto _ : state) {
    (void)sub.consumer->watch(at, 4096);
    sub.consumer->unwatch(at, 4096);
    at = at + 8192 < base + length ? at + 8192 : base + 4096;
  }
  if (mrc::uffd::testing::registrations() != registrations) {
    state.SkipWithError("an armed block was registered again");
  }
  state.counters["pairs_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  sub.consumer->unwatch(base, 4096);
  munmap(block, 2 * length);
}
BENCHMARK(BM_MonitorWatchArmed);

void BM_MonitorWatchFirst(benchmark::State &state) {
  Subscribed sub;
  if (!sub.cached()) {
    state.SkipWithError("no userfaultfd here (uncached mode)");
    return;
  }
  const size_t block = 2 << 20;
  const size_t blocks = 4096;
  void *mapping = mmap(nullptr, (blocks + 1) * block, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  const uintptr_t base = (reinterpret_cast<uintptr_t>(mapping) + block - 1) & ~(block - 1);
  std::vector<double> samples;
  samples.reserve(1 << 16);
  size_t i = 0;
  for (auto _ : state) {
    const uintptr_t at = base + (i % blocks) * block + 4096;
    const double start = now_seconds();
    (void)sub.consumer->watch(at, 4096);
    const double elapsed = now_seconds() - start;
    state.SetIterationTime(elapsed);
    samples.push_back(elapsed);
    sub.consumer->unwatch(at, 4096);
    ++i;
  }
  munmap(mapping, (blocks + 1) * block);
  report(state, samples, "watch_first");
}
BENCHMARK(BM_MonitorWatchFirst)->UseManualTime()->Iterations(20000);

void BM_MonitorSummary(benchmark::State &state) {
  for (auto _ : state) {
  }
  const auto &m = medians();
  auto has = [&m](const char *key) { return m.count(key) != 0; };
  if (has("roundtrip") && has("pingpong") && has("munmap_plain")) {
    const double overhead = m.at("roundtrip") - m.at("munmap_plain");
    state.counters["roundtrip_us"] = m.at("roundtrip") * 1e6;
    state.counters["overhead_us"] = overhead * 1e6;
    state.counters["pingpong_us"] = m.at("pingpong") * 1e6;
    state.counters["overhead_over_pingpong"] = overhead / m.at("pingpong");
    state.counters["roundtrip_over_pingpong"] = m.at("roundtrip") / m.at("pingpong");
  }
  if (has("roundtrip_poll") && has("munmap_plain") && has("pingpong")) {
    state.counters["poll_overhead_over_pingpong"] =
        (m.at("roundtrip_poll") - m.at("munmap_plain")) / m.at("pingpong");
  }
  if (has("unwatched_monitor") && has("unwatched_no_monitor")) {
    state.counters["unwatched_monitor_over_none"] =
        m.at("unwatched_monitor") / m.at("unwatched_no_monitor");
  }
  if (m.empty()) state.SkipWithError("run the other monitor benchmarks in the same process");
}
BENCHMARK(BM_MonitorSummary)->Iterations(1);

}  // namespace
