// SPDX-License-Identifier: BSD-3-Clause
// The userfaultfd monitor's costs, with the references they are judged against, in one run:
//
//   BM_MonitorPipePingPong/place:P      one round trip between two threads over two pipes (one
//                                       byte each way).
//   BM_MonitorRoundTrip/poll:L/place:P  munmap of a watched 64 KiB range (re-mmapped and
//                                       watched, untimed, before each iteration): the event
//                                       round trip. L 0 = io_uring (the monitor's normal loop),
//                                       1 = the poll(2) fallback. Label: the loop that ran.
//   BM_MonitorMunmapPlain/place:P       munmap of 64 KiB, never watched, no monitor.
//   BM_MonitorMunmapUnwatched/<running> munmap of unwatched memory, monitor stopped (0) or
//                                       running (1); goal <= 1.02x (UCX's hooks: ~1.11x).
//   BM_MonitorMunmapCached/<what>       munmap of 64 KiB through a cache's life: what 0 = no
//                                       cache in the process (a plain munmap), 1 = a cache
//                                       holds a region of the whole range (got and put before
//                                       the munmap, churn learning off so that every one is
//                                       cached), 2 = a cache exists, the range is not cached.
//                                       Counter invalidations_per_op: 1 when every munmap hit
//                                       cached memory. Label: the monitor's mode (MRC_MONITOR).
//   BM_MonitorUffdRegister/<bytes>      one UFFDIO_REGISTER (write-protect mode) of a range
//                                       inside a larger mapping.
//   (watch() and unwatch() themselves: bench_watch.cc.)
//   BM_MonitorSummary                   the ratios, per placement: round-trip overhead (round
//                                       trip minus plain munmap) over ping-pong, goal <= 1.2;
//                                       unwatched munmap with over without the monitor; cached
//                                       and uncached munmap over plain (BM_MonitorMunmapCached).
//
// Placement P, the same for the ping-pong's two threads and for the unmapper and the monitor
// thread: 0 = both pinned to one CPU, 1 = pinned to two different CPUs, 2 = not pinned (the
// scheduler decides, and decides differently for the two: a pipe wakes its reader as a
// "synchronous" wakeup that pulls it to the waker's CPU, a userfaultfd does not). On a VM a
// wakeup across CPUs costs far more than a context switch on one CPU (an idle vCPU must be
// woken by the host), so each placement is compared only with itself. Ping-pong, round trips and
// plain munmap run interleaved, twice, and each figure is the mean of the two medians, so that
// drift on the shared machine hits all of them alike.
//
// Every timed benchmark reports the median per operation (counter median_us) and the tenth
// percentile (p10_us: under TCG, where a vCPU's thread is often descheduled by the host, the
// cost of an operation nothing interrupted); the summary uses medians, which the noisy shared VM
// affects least. Run these in a process of their own
// (--benchmark_filter=BM_Monitor): UCX's rcache, created by bench_cache, patches libc's munmap
// for the rest of its process.
#include <benchmark/benchmark.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "mrcache/mrcache.h"
#include "uffd/testing.h"
#include "uffd/uffd.h"

namespace {

using mrc::uffd::Invalidation;
using mrc::uffd::Monitor;
using mrc::uffd::Subscription;
using mrc::uffd::WatchResult;

constexpr size_t kRange = 64 << 10;

double now_seconds() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Runs op() and records its duration as the iteration's (manual) time and as one sample.
template <class Op>
void timed(benchmark::State &state, std::vector<double> &samples, Op &&op) {
  const double start = now_seconds();
  op();
  const double elapsed = now_seconds() - start;
  state.SetIterationTime(elapsed);
  samples.push_back(elapsed);
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
  // The tenth percentile: an operation's cost when the (virtual) machine did not interrupt it.
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 10, samples.end());
  state.counters["p10_us"] = samples[samples.size() / 10] * 1e6;
  auto found = medians().find(key);
  // A benchmark run twice (alternating runs) contributes the mean of its medians.
  medians()[key] = found == medians().end() ? median : (found->second + median) / 2;
}

// A subscription for one benchmark run.
struct Subscribed {
  Subscription *subscription = nullptr;
  Subscribed() {
    if (mrc::uffd::subscribe(&subscription) != MRC_OK) std::abort();
  }
  ~Subscribed() { mrc::uffd::unsubscribe(subscription); }
  bool cached() const { return subscription->mode() != MRC_MONITOR_UNCACHED; }
};

// Where every timed munmap happens: 64 KiB between two PROT_NONE guard pages. The mapping timed
// there is always one VMA of its own (its neighbours differ in protection, so the kernel never
// merges it with them, and munmap never has to split a VMA): plain, unwatched and watched munmaps
// do the same VMA work whatever else the process has mapped nearby. (Without the guards, a
// mapping merged with an anonymous neighbour costs a VMA split more to unmap: ~0.7 us here.)
class Slot {
 public:
  Slot() {
    const size_t guard = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void *reserved = mmap(nullptr, kRange + 2 * guard, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserved == MAP_FAILED) std::abort();
    reserved_ = static_cast<char *>(reserved);
    bytes_ = kRange + 2 * guard;
    address_ = reserved_ + guard;
    if (munmap(address_, kRange) != 0) std::abort();
  }
  ~Slot() { munmap(reserved_, bytes_); }
  Slot(const Slot &) = delete;
  Slot &operator=(const Slot &) = delete;

  // Maps and touches the slot (nullptr if something else took the address meanwhile).
  char *map() const {
    void *p = mmap(address_, kRange, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != address_) return nullptr;
    for (size_t off = 0; off < kRange; off += 4096) address_[off] = 1;
    return address_;
  }

 private:
  char *reserved_;
  char *address_;
  size_t bytes_;
};

// ---- placement ----

enum Placement { kOneCpu = 0, kTwoCpus = 1, kUnpinned = 2 };
const char *const kPlacementName[] = {"one_cpu", "two_cpus", "unpinned"};

// The CPUs this process may use, as found at the first call (before any pinning).
const cpu_set_t &allowed_cpus() {
  static const cpu_set_t allowed = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) std::abort();
    return set;
  }();
  return allowed;
}

// The n-th allowed CPU, -1 if there are not that many.
int allowed_cpu(int n) {
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed_cpus()) && n-- == 0) return cpu;
  }
  return -1;
}

// Pins thread `tid` (0: the caller) to `cpu`, or to every allowed CPU when cpu < 0.
void pin(pid_t tid, int cpu) {
  cpu_set_t set = allowed_cpus();
  if (cpu >= 0) {
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(tid, sizeof(set), &set) != 0) std::abort();
}

// The CPUs of the initiating thread and of its partner for a placement; false if this machine
// cannot provide it (SkipWithError has been called).
bool placement_cpus(benchmark::State &state, Placement placement, int *mine, int *partner) {
  *mine = placement == kUnpinned ? -1 : allowed_cpu(0);
  *partner = placement == kOneCpu ? *mine : placement == kTwoCpus ? allowed_cpu(1) : -1;
  if (placement == kTwoCpus && *partner < 0) {
    state.SkipWithError("needs two CPUs");
    return false;
  }
  return true;
}

// Pins the calling thread for the life of a benchmark run; unpins it at the end.
struct Pinned {
  explicit Pinned(int cpu) { pin(0, cpu); }
  ~Pinned() { pin(0, -1); }
};

// The thread id of the running monitor ("mrc-monitor"), 0 if none.
pid_t monitor_tid() {
  DIR *tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return 0;
  pid_t found = 0;
  while (dirent *entry = readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    const std::string path = std::string("/proc/self/task/") + entry->d_name + "/comm";
    FILE *comm = fopen(path.c_str(), "r");
    if (comm == nullptr) continue;
    char name[32] = "";
    if (fgets(name, sizeof(name), comm) != nullptr && strncmp(name, "mrc-monitor", 11) == 0) {
      found = static_cast<pid_t>(atoi(entry->d_name));
    }
    fclose(comm);
  }
  closedir(tasks);
  return found;
}

std::string keyed(const char *what, Placement placement) {
  return std::string(what) + "_" + kPlacementName[placement];
}

// ---- round trip and its references ----

void BM_MonitorRoundTrip(benchmark::State &state) {
  const bool poll_loop = state.range(0) == 1;
  const Placement placement = static_cast<Placement>(state.range(1));
  int mine;
  int partner;
  if (!placement_cpus(state, placement, &mine, &partner)) return;
  mrc::uffd::testing::force_poll_loop(poll_loop);
  {
    Pinned pinned(mine);
    Subscribed sub;
    if (!sub.cached()) {
      state.SkipWithError("no userfaultfd here (uncached mode)");
      mrc::uffd::testing::force_poll_loop(false);
      return;
    }
    const pid_t monitor = monitor_tid();
    if (monitor == 0) {
      // MRC_MONITOR=bpf: the eBPF ring, no userfaultfd and no monitor thread to wait for.
      state.SkipWithError("no monitor thread (MRC_MONITOR=bpf?)");
      mrc::uffd::testing::force_poll_loop(false);
      return;
    }
    pin(monitor, partner);
    state.SetLabel(mrc::uffd::testing::monitor_loop());
    std::vector<double> samples;
    samples.reserve(1 << 16);
    const Slot slot;
    for (auto _ : state) {
      char *p = slot.map();
      if (p == nullptr ||
          mrc::uffd::watch(reinterpret_cast<uintptr_t>(p), kRange) != WatchResult::Watched) {
        state.SkipWithError("could not map and watch the range");
        break;
      }
      timed(state, samples, [p] { munmap(p, kRange); });
      (void)sub.subscription->drain([](const Invalidation &) {});
      mrc::uffd::unwatch(reinterpret_cast<uintptr_t>(p), kRange);
    }
    report(state, samples, keyed(poll_loop ? "roundtrip_poll" : "roundtrip", placement));
  }
  mrc::uffd::testing::force_poll_loop(false);
}

void BM_MonitorPipePingPong(benchmark::State &state) {
  const Placement placement = static_cast<Placement>(state.range(0));
  int mine;
  int partner;
  if (!placement_cpus(state, placement, &mine, &partner)) return;
  Pinned pinned(mine);
  int there[2];
  int back[2];
  if (pipe(there) != 0 || pipe(back) != 0) std::abort();
  std::thread echo([&] {
    pin(0, partner);
    char byte;
    while (read(there[0], &byte, 1) == 1 && byte != 0) {
      if (write(back[1], &byte, 1) != 1) break;
    }
  });
  std::vector<double> samples;
  samples.reserve(1 << 16);
  char byte = 1;
  for (auto _ : state) {
    timed(state, samples, [&] {
      if (write(there[1], &byte, 1) != 1 || read(back[0], &byte, 1) != 1) std::abort();
    });
  }
  byte = 0;
  if (write(there[1], &byte, 1) != 1) std::abort();
  echo.join();
  for (int fd : {there[0], there[1], back[0], back[1]}) close(fd);
  report(state, samples, keyed("pingpong", placement));
}

void time_munmaps(benchmark::State &state, const std::string &key) {
  std::vector<double> samples;
  samples.reserve(1 << 16);
  const Slot slot;
  for (auto _ : state) {
    char *p = slot.map();
    if (p == nullptr) {
      state.SkipWithError("the slot's address was taken");
      break;
    }
    timed(state, samples, [p] { munmap(p, kRange); });
  }
  report(state, samples, key);
}

// On the unmapper's CPU of the same placement.
void BM_MonitorMunmapPlain(benchmark::State &state) {
  const Placement placement = static_cast<Placement>(state.range(0));
  int mine;
  int partner;
  if (!placement_cpus(state, placement, &mine, &partner)) return;
  Pinned pinned(mine);
  time_munmaps(state, keyed("munmap_plain", placement));
}

// Interleaved per placement, twice: ping-pong, round trip (io_uring, poll), plain munmap.
const bool g_registered_round_trips = [] {
  for (int round = 0; round < 2; ++round) {
    for (int64_t placement : {kOneCpu, kTwoCpus, kUnpinned}) {
      benchmark::RegisterBenchmark("BM_MonitorPipePingPong", BM_MonitorPipePingPong)
          ->ArgName("place")
          ->Arg(placement)
          ->UseManualTime()
          ->Iterations(20000);
      for (int64_t poll : {0, 1}) {
        benchmark::RegisterBenchmark("BM_MonitorRoundTrip", BM_MonitorRoundTrip)
            ->ArgNames({"poll", "place"})
            ->Args({poll, placement})
            ->UseManualTime()
            ->Iterations(20000);
      }
      benchmark::RegisterBenchmark("BM_MonitorMunmapPlain", BM_MonitorMunmapPlain)
          ->ArgName("place")
          ->Arg(placement)
          ->UseManualTime()
          ->Iterations(20000);
    }
  }
  return true;
}();

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
  const Slot elsewhere;
  char *watched = elsewhere.map();
  if (watched == nullptr ||
      mrc::uffd::watch(reinterpret_cast<uintptr_t>(watched), kRange) != WatchResult::Watched) {
    state.SkipWithError("could not map and watch memory elsewhere");
    return;
  }
  time_munmaps(state, "unwatched_monitor");
  mrc::uffd::unwatch(reinterpret_cast<uintptr_t>(watched), kRange);
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

// A cache whose registration does nothing, so that the munmaps are timed against the monitor
// alone. Churn learning off (MRC_FLAG_CACHE_CHURN): a range mapped and unmapped at one address
// for every iteration would otherwise be learned as churning and registered uncached.
mrc_status_t noop_reg(void *, void *, size_t, unsigned, void **handle, uint64_t *key) {
  *handle = nullptr;
  *key = 0;
  return MRC_OK;
}
void noop_dereg(void *, void *) {}
const mrc_backend_t kNoopBackend = {sizeof(mrc_backend_t), "noop", &noop_reg, &noop_dereg, nullptr};

void BM_MonitorMunmapCached(benchmark::State &state) {
  const int64_t what = state.range(0);
  if (what == 0) {
    time_munmaps(state, "munmap_no_cache");
    return;
  }
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.name = "bench-munmap";
  params.backend = &kNoopBackend;
  params.flags |= MRC_FLAG_CACHE_CHURN;
  mrc_cache_t *cache = nullptr;
  if (mrc_cache_create(&params, &cache) != MRC_OK) std::abort();
  mrc_monitor_info_t info;
  if (mrc_monitor_info(&info) == MRC_OK) state.SetLabel(info.mode_name);
  mrc_stats_t before{};
  mrc_cache_stats(cache, &before);
  if (what == 2) {
    time_munmaps(state, "munmap_uncached");
  } else {
    std::vector<double> samples;
    samples.reserve(1 << 16);
    const Slot slot;
    for (auto _ : state) {
      char *p = slot.map();
      mrc_region_t *region = nullptr;
      // The get drains the last iteration's unmap, then registers and caches the range anew.
      if (p == nullptr || mrc_get(cache, p, kRange, MRC_PROT_READ, &region) != MRC_OK) {
        state.SkipWithError("could not map and get the range");
        break;
      }
      mrc_put(cache, region);
      timed(state, samples, [p] { munmap(p, kRange); });
    }
    report(state, samples, "munmap_cached");
  }
  mrc_stats_t after{};
  mrc_cache_stats(cache, &after);
  state.counters["invalidations_per_op"] =
      benchmark::Counter(static_cast<double>(after.invalidations - before.invalidations),
                         benchmark::Counter::kAvgIterations);
  mrc_cache_destroy(cache);
}
// Alternating runs, four rounds, so that drift on the shared machine hits all three alike; take
// the ratios per round from the JSON output (the summary's running mean weighs later rounds
// more). Run in a process where no other cache lives (--benchmark_filter=BM_MonitorMunmapCached),
// or 0 is no plain munmap.
const bool g_registered_munmaps_cached = [] {
  for (int round = 0; round < 4; ++round) {
    for (int64_t what : {0, 1, 2}) {
      benchmark::RegisterBenchmark("BM_MonitorMunmapCached", BM_MonitorMunmapCached)
          ->ArgName("what")
          ->Arg(what)
          ->UseManualTime()
          ->Iterations(5000);
    }
  }
  return true;
}();

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
    int rc = 0;
    timed(state, samples, [&] { rc = ioctl(uffd, UFFDIO_REGISTER, &request); });
    if (rc != 0) {
      state.SkipWithError("UFFDIO_REGISTER failed");
      break;
    }
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

void BM_MonitorSummary(benchmark::State &state) {
  for (auto _ : state) {
  }
  const auto &m = medians();
  auto has = [&m](const std::string &key) { return m.count(key) != 0; };
  for (const Placement placement : {kOneCpu, kTwoCpus, kUnpinned}) {
    const std::string roundtrip = keyed("roundtrip", placement);
    const std::string poll = keyed("roundtrip_poll", placement);
    const std::string pingpong = keyed("pingpong", placement);
    const std::string plain = keyed("munmap_plain", placement);
    const std::string suffix = std::string("_") + kPlacementName[placement];
    if (!has(pingpong) || !has(plain)) continue;
    state.counters["pingpong_us" + suffix] = m.at(pingpong) * 1e6;
    state.counters["munmap_us" + suffix] = m.at(plain) * 1e6;
    if (has(roundtrip)) {
      const double overhead = m.at(roundtrip) - m.at(plain);
      state.counters["roundtrip_us" + suffix] = m.at(roundtrip) * 1e6;
      state.counters["overhead_over_pingpong" + suffix] = overhead / m.at(pingpong);
    }
    if (has(poll)) {
      state.counters["poll_overhead_over_pingpong" + suffix] =
          (m.at(poll) - m.at(plain)) / m.at(pingpong);
    }
  }
  if (has("unwatched_monitor") && has("unwatched_no_monitor")) {
    state.counters["unwatched_monitor_over_none"] =
        m.at("unwatched_monitor") / m.at("unwatched_no_monitor");
  }
  if (has("munmap_no_cache")) {
    if (has("munmap_cached")) {
      state.counters["munmap_cached_over_plain"] = m.at("munmap_cached") / m.at("munmap_no_cache");
    }
    if (has("munmap_uncached")) {
      state.counters["munmap_uncached_over_plain"] =
          m.at("munmap_uncached") / m.at("munmap_no_cache");
    }
  }
  if (m.empty()) state.SkipWithError("run the other monitor benchmarks in the same process");
}
BENCHMARK(BM_MonitorSummary)->Iterations(1);

}  // namespace
