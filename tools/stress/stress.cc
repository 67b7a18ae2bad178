// SPDX-License-Identifier: BSD-3-Clause
// mrcache-stress: workers get/check/put random ranges of a pool of mappings while mutators
// change those mappings; an oracle proves every region handed out maps the memory there now.
//
// SYNCHRONIZATION
// - Workers and mutators meet only through the pool's per-slot locks (tools/stress/pool.h):
//   a worker holds one slot shared across get + check + put; a mutator holds it exclusively.
//   A churn thread owns a private slot: it holds it exclusively to remap it and shared to use
//   it; no other thread picks it. Churn threads meet the others only through the kernel (which
//   hands out the addresses) and the cache.
// - Run::stop: relaxed flag polled by every thread; set by the main thread at the end of the
//   duration, by a worker that found a stale registration that counts (unless --keep-going),
//   or by SIGINT.
// - Run::report_mutex guards the lists of stale, in-window and error reports.
// - Counters: per-thread relaxed atomics (report.h), summed by the main thread.
// - Fork: a mutator forks while holding no harness lock; the child uses none of the parent's
//   harness objects (locks, output, cache) — only its own backend, cache and pool.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/common/stdout_check.h"
#include "tools/stress/backend.h"
#include "tools/stress/options.h"
#include "tools/stress/oracle.h"
#include "tools/stress/pool.h"
#include "tools/stress/report.h"
#include "tools/stress/util.h"

namespace stress {
namespace {

constexpr int kExitPassed = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Exit statuses of a fork child.
constexpr int kChildStale = 10;
constexpr int kChildError = 11;
constexpr int kChildLeak = 12;
constexpr int kChildSetup = 13;
constexpr int kChildNoMemory = 14;  // set-up or a get failed for lack of memory
constexpr int kChildTimeoutSeconds = 60;
constexpr size_t kMaxReports = 10;
constexpr size_t kMaxWindowReports = 3;
constexpr int kHotRepeats = 16;  // more than the cache's kPromoteAfter hits
// Hot threads: gets of a hot page in a row (more than kPromoteAfter), and the slots they cycle
// through (more than a parking line's four).
constexpr int kHotRun = 10;
constexpr size_t kHotSlots = 6;

std::atomic<bool> g_interrupted{false};
std::atomic<pid_t> g_parent_pid{0};

void on_signal(int) { g_interrupted.store(true, std::memory_order_relaxed); }

struct Run {
  Options opt;
  uint64_t seed = 0;
  uint64_t start_ns = 0;
  mrc_cache_t *cache = nullptr;
  BackendSetup *backend = nullptr;
  Oracle *oracle = nullptr;
  Pool *pool = nullptr;
  Output *out = nullptr;
  std::string monitor_mode;
  bool injecting = false;  // --fail-rate > 0: MRC_ERR_BACKEND from get is expected
  bool fast = false;       // the caches run with MRC_FLAG_ORDERED_UNMAPS
  // In-window stale hits count as stale: exact mode promises them, fast mode does not.
  bool window_counted = true;
  std::atomic<bool> stop{false};
  // Workers, mutators, churn threads, hot threads.
  std::vector<std::unique_ptr<ThreadCounters>> counters;
  std::atomic<uint64_t> next_fork_ns{0};
  std::atomic<uint64_t> forks{0};
  std::atomic<uint64_t> invalidate_callbacks{0};
  std::atomic<uint64_t> log_warnings{0}, log_errors{0};
  // Errors for lack of memory (says_no_memory): under an address-space limit, the limit's doing.
  std::atomic<uint64_t> no_memory_errors{0};

  std::mutex report_mutex;
  std::vector<std::string> stale_reports;   // report_mutex
  std::vector<std::string> window_reports;  // report_mutex: in-window hits not counted
  std::vector<std::string> errors;          // report_mutex: the first kMaxReports
  // report_mutex: why a thread of the run could not go on for lack of resources (an exception:
  // std::bad_alloc, std::system_error), e.g. under RLIMIT_AS. Not a failure of the cache: the
  // run ends with exit 2 and this reason.
  std::string resource_failure;

  std::vector<ThreadCounters *> all_counters() const {
    std::vector<ThreadCounters *> all;
    for (const auto &c : counters) all.push_back(c.get());
    return all;
  }
  double elapsed_s() const { return static_cast<double>(now_ns() - start_ns) / 1e9; }
};

Run *g_run = nullptr;  // for the log handler

void log_handler(void *, mrc_log_level_t level, const char *message) {
  const char *name = level == MRC_LOG_ERROR ? "error" : level == MRC_LOG_WARN ? "warn" : "info";
  if (getpid() != g_parent_pid.load(std::memory_order_relaxed) || g_run == nullptr) {
    // A fork child: the parent's output lock may have been held by another thread at fork.
    dprintf(STDERR_FILENO, "mrcache %s (child %d): %s\n", name, getpid(), message);
    return;
  }
  if (level == MRC_LOG_ERROR) g_run->log_errors.fetch_add(1, std::memory_order_relaxed);
  if (level == MRC_LOG_WARN) g_run->log_warnings.fetch_add(1, std::memory_order_relaxed);
  g_run->out->line(std::string("mrcache ") + name + ": " + message, true);
}

void on_invalidated(void *arg) {
  static_cast<Run *>(arg)->invalidate_callbacks.fetch_add(1, std::memory_order_relaxed);
}

// A failure for lack of memory: ENOMEM's text, or the library's MRC_ERR_NO_MEMORY.
bool says_no_memory(const std::string &text) {
  return text.find(strerrordesc_np(ENOMEM)) != std::string::npos ||
         text.find(mrc_status_string(MRC_ERR_NO_MEMORY)) != std::string::npos;
}

// "address-space limit RLIMIT_AS=190.7 MiB reached (`ulimit -v`)" when that limit is finite,
// else "": what a failure for lack of memory most likely means then.
std::string address_space_reached() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return "";
  return "address-space limit RLIMIT_AS=" + format_size(limit.rlim_cur) + " reached (`ulimit -v`)";
}

void add_error(Run &run, std::string text) {
  if (says_no_memory(text)) {
    run.no_memory_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string limit = address_space_reached();
    if (!limit.empty()) text += " [" + limit + "]";
  }
  std::lock_guard lock(run.report_mutex);
  if (run.errors.size() < kMaxReports) {
    run.errors.push_back(text);
    run.out->line("error: " + text, true);
  }
}

std::string prot_name(unsigned prot) {
  std::string s;
  s += (prot & MRC_PROT_READ) != 0 ? 'r' : '-';
  s += (prot & MRC_PROT_WRITE) != 0 ? 'w' : '-';
  return s;
}

std::string range_text(uintptr_t start, size_t len) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%#lx, +%s)", static_cast<unsigned long>(start),
                format_size(len).c_str());
  return buf;
}

// REQUIRES: the slot's lock is held (its history is stable).
std::string stale_report(Run &run, unsigned worker, const Slot &slot, uintptr_t start, size_t len,
                         unsigned prot, mrc_region_t *region, const CheckResult &result) {
  const auto region_start = reinterpret_cast<uintptr_t>(mrc_region_start(region));
  const size_t region_len = mrc_region_length(region);
  char head[256];
  std::snprintf(head, sizeof head,
                "STALE REGISTRATION: worker %u at t=%.3fs, seed %llu (backend %s, oracle %s, "
                "monitor %s)\n",
                worker, run.elapsed_s(), static_cast<unsigned long long>(run.seed),
                backend_name(run.opt.backend), run.oracle->name(), run.monitor_mode.c_str());
  std::string text = head;
  text += "  request  " + range_text(start, len) + " prot " + prot_name(prot) + " in slot " +
          std::to_string(slot.index) + " (mapping " + range_text(slot.start, slot.len) +
          (slot.shared ? " shared" : " private") + ")\n";
  text += "  region   " + range_text(region_start, region_len) + " key " +
          std::to_string(mrc_region_key(region)) + " prot " + prot_name(mrc_region_prot(region)) +
          "\n";
  if (const auto info = run.backend->instrumented().lookup(mrc_region_handle(region))) {
    char made[160];
    std::snprintf(made, sizeof made, "  made     t=%.3fms by %s %d while it held slot %d\n",
                  static_cast<double>(info->time_ns) / 1e6, info->worker >= 0 ? "worker" : "thread",
                  info->worker, info->slot);
    text += made;
  }
  char address[64];
  std::snprintf(address, sizeof address,
                "  address  %#lx: ", static_cast<unsigned long>(result.address));
  text += address + result.detail + "\n";
  text += "  slot " + std::to_string(slot.index) + " history (oldest first, times since start):\n";
  for (const Mutation &m : run.pool->history(slot)) text += "    " + describe(m) + "\n";
  text += "  every recent mutation that touched the region:\n";
  for (const Mutation &m : run.pool->overlapping(region_start, region_len, 24)) {
    text += "    " + describe(m) + "\n";
  }
  text += "  replay: mrcache-stress --seed " + std::to_string(run.seed) + " --backend " +
          backend_name(run.opt.backend) +
          " (schedules differ between runs; the seed fixes "
          "every random choice)\n";
  return text;
}

// ---- workers -------------------------------------------------------------------------------

// Gets [start, start+len) and checks that the region covers it; counts the operation, its
// latency (from *began) and any error. Returns nullptr on failure (nothing held).
mrc_region_t *acquire(Run &run, ThreadCounters &c, uintptr_t start, size_t len, unsigned prot,
                      uint64_t *began) {
  mrc_region_t *region = nullptr;
  *began = now_ns();
  const mrc_status_t status =
      mrc_get(run.cache, reinterpret_cast<void *>(start), len, prot, &region);
  c.add_latency(now_ns() - *began);
  c.ops.fetch_add(1, std::memory_order_relaxed);
  if (status != MRC_OK) {
    if (status == MRC_ERR_BACKEND && run.injecting) {
      c.injected.fetch_add(1, std::memory_order_relaxed);
    } else {
      c.errors.fetch_add(1, std::memory_order_relaxed);
      add_error(run, "mrc_get(" + range_text(start, len) + ", " + prot_name(prot) + ") = " +
                         mrc_status_string(status) + " (" + mrc_backend_last_error() + ")");
    }
    return nullptr;
  }
  const auto region_start = reinterpret_cast<uintptr_t>(mrc_region_start(region));
  const size_t region_len = mrc_region_length(region);
  if (region_start > start || start + len > region_start + region_len ||
      (mrc_region_prot(region) & prot) != prot) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "mrc_get(" + range_text(start, len) + ", " + prot_name(prot) +
                       ") returned region " + range_text(region_start, region_len) + " " +
                       prot_name(mrc_region_prot(region)) + ", which does not cover it");
    mrc_put(run.cache, region);
    return nullptr;
  }
  return region;
}

// Counts what the oracle found for a region of `slot` got at t0_ns (now_ns) and reports a
// stale one. REQUIRES: the slot's lock is held shared since before the get (generation read
// then).
void judge(Run &run, ThreadCounters &c, unsigned index, const Slot &slot, uint64_t generation,
           uintptr_t start, size_t len, unsigned prot, mrc_region_t *region,
           const CheckResult &result, uint64_t t0_ns) {
  c.pages.fetch_add(result.pages, std::memory_order_relaxed);
  switch (result.kind) {
    case CheckResult::kOk: c.checked.fetch_add(1, std::memory_order_relaxed); return;
    case CheckResult::kUnchecked: c.unchecked.fetch_add(1, std::memory_order_relaxed); return;
    case CheckResult::kError:
      c.errors.fetch_add(1, std::memory_order_relaxed);
      add_error(run, "oracle: " + result.detail);
      return;
    case CheckResult::kStale: break;
  }
  if (slot.generation.load(std::memory_order_relaxed) != generation) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "harness: slot " + std::to_string(slot.index) +
                       " changed during a check (locking bug); mismatch not counted");
    return;
  }
  // Was the page being unmapped for another slot (by a mutator or a churn thread) when this get
  // began? Then the kernel had handed its addresses to this slot's mapping before the unmapping
  // thread's event reached the monitor: exact mode must have waited for that unmap, fast mode
  // need not have.
  const std::string window =
      run.pool->in_flight(page_down(result.address), page_size(), t0_ns - run.start_ns);
  const bool counted = window.empty() || run.window_counted;
  if (!window.empty()) c.stale_window.fetch_add(1, std::memory_order_relaxed);
  if (counted) c.stale.fetch_add(1, std::memory_order_relaxed);
  std::string report = stale_report(run, index, slot, start, len, prot, region, result);
  if (!window.empty()) {
    report += "  window   when this get began, " + window +
              ": that thread's unmap had not returned, yet the kernel had already given the "
              "address to this slot's new mapping (userfaultfd reports an unmap only after the "
              "address range is free). ";
    if (!run.fast) {
      report +=
          "Exact mode: the get's probe of the kernel's unmaps in flight must have made it wait "
          "for that unmap; counted as stale\n";
    } else if (counted) {
      report += "Fast mode does not promise this; counted (--strict-unmap-window)\n";
    } else {
      report +=
          "Fast mode (MRC_FLAG_ORDERED_UNMAPS) promises only unmaps that happen-before the "
          "get; not counted as stale (--strict-unmap-window counts it)\n";
    }
  }
  std::lock_guard lock(run.report_mutex);
  // Tolerated hits have their own few reports: fast mode may see many, and they must not use
  // up the room of a stale one that counts.
  std::vector<std::string> &reports = counted ? run.stale_reports : run.window_reports;
  if (reports.size() < (counted ? kMaxReports : kMaxWindowReports)) {
    reports.push_back(report);
    run.out->line(report, true);
  }
  if (!run.opt.keep_going && counted) run.stop.store(true, std::memory_order_relaxed);
}

void worker(Run &run, unsigned index) {
  ThreadCounters &c = *run.counters[index];
  Rng rng(mix64(run.seed ^ (0x1000 + index)));
  std::string error;
  std::unique_ptr<OracleThread> oracle = run.oracle->thread(index, &error);
  if (oracle == nullptr) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "worker " + std::to_string(index) + ": oracle set-up failed: " + error);
    return;
  }
  static constexpr unsigned kProts[] = {MRC_PROT_READ, MRC_PROT_WRITE,
                                        MRC_PROT_READ | MRC_PROT_WRITE};
  struct Held {
    mrc_region_t *region;
  };
  while (!run.stop.load(std::memory_order_relaxed)) {
    Slot &slot = run.pool->slot(rng.below(run.pool->size()));
    // Scoped: an exception (std::bad_alloc under RLIMIT_AS, see guarded()) must not leave the
    // slot locked for the mutators.
    std::shared_lock slot_guard(slot.lock);
    Instrumented::set_thread_context(static_cast<int>(index), slot.index);
    if (slot.start == 0) continue;
    const uint64_t generation = slot.generation.load(std::memory_order_relaxed);
    const int wanted = rng.chance(run.opt.nest_rate) ? 2 + static_cast<int>(rng.below(3)) : 1;
    Held held[4];
    int count = 0;
    for (int k = 0; k < wanted; ++k) {
      const uint64_t longest = std::min<uint64_t>(run.opt.max_size, slot.len);
      size_t len = rng.log_uniform(std::min<uint64_t>(run.opt.min_size, longest), longest);
      uintptr_t offset = rng.below(slot.len - len + 1);
      if (rng.chance(0.75)) {  // mostly page-aligned, like most real buffers
        offset = page_down(offset);
        len = std::min<size_t>(page_up(len), slot.len - offset);
      }
      const uintptr_t start = slot.start + offset;
      const unsigned prot = kProts[rng.below(3)];
      uint64_t t0 = 0;
      mrc_region_t *region = acquire(run, c, start, len, prot, &t0);
      if (region != nullptr && wanted == 1 && rng.chance(run.opt.hot_rate)) {
        // A hot range: used again and again, its region parks its references in this thread
        // (core/cache/cache.h); the check below then sees a region taken back from the line.
        for (int repeat = 0; repeat < kHotRepeats && region != nullptr; ++repeat) {
          mrc_put(run.cache, region);
          region = acquire(run, c, start, len, prot, &t0);
        }
        c.hot.fetch_add(1, std::memory_order_relaxed);
      }
      if (region == nullptr) continue;
      held[count++].region = region;
      const CheckResult result = oracle->check(region, start, len, rng);
      judge(run, c, index, slot, generation, start, len, prot, region, result, t0);
    }
    if (count > 1) c.nested.fetch_add(1, std::memory_order_relaxed);
    if (count > 0 && rng.chance(run.opt.invalidate_rate)) {
      mrc_region_t *victim = held[rng.below(static_cast<uint64_t>(count))].region;
      const mrc_status_t status = mrc_invalidate(run.cache, victim, &on_invalidated, &run);
      if (status == MRC_OK) {
        c.invalidates.fetch_add(1, std::memory_order_relaxed);
      } else {
        c.errors.fetch_add(1, std::memory_order_relaxed);
        add_error(run, std::string("mrc_invalidate = ") + mrc_status_string(status));
      }
    }
    for (int k = count - 1; k >= 0; --k) mrc_put(run.cache, held[k].region);
  }
}

// ---- churn threads ---------------------------------------------------------------------------

// Remaps its private slot (munmap, then mmap of the same length) and gets, checks and puts the
// whole new mapping, over and over. The kernel gives a freed range to the next mmap that fits,
// so with two or more of these one often maps the range another is still unmapping (that
// thread waits in munmap until the monitor has read the event) and gets it at once: inside the
// unmap window, with the old region still in the table. Its own unmaps returned before its
// gets: those are the ordered case that both modes promise.
void churner(Run &run, unsigned index) {
  const unsigned id = run.opt.threads + index;  // its oracle lane and its number in reports
  ThreadCounters &c = *run.counters[run.opt.threads + run.opt.mutators + index];
  Rng rng(mix64(run.seed ^ (0x3000 + index)));
  std::string error;
  std::unique_ptr<OracleThread> oracle = run.oracle->thread(id, &error);
  if (oracle == nullptr) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "churn thread " + std::to_string(index) + ": oracle set-up failed: " + error);
    return;
  }
  static constexpr unsigned kProts[] = {MRC_PROT_READ, MRC_PROT_WRITE,
                                        MRC_PROT_READ | MRC_PROT_WRITE};
  Slot &slot = run.pool->private_slot(index);
  while (!run.stop.load(std::memory_order_relaxed)) {
    std::unique_lock remap_guard(slot.lock);
    const Mutation m = run.pool->mutate(slot, MutationKind::kRemap, rng);
    remap_guard.unlock();
    if (m.error != 0) {
      c.refused[static_cast<size_t>(MutationKind::kRemap)].fetch_add(1, std::memory_order_relaxed);
    }
    std::shared_lock use_guard(slot.lock);
    Instrumented::set_thread_context(static_cast<int>(id), slot.index);
    if (slot.start != 0) {
      const uint64_t generation = slot.generation.load(std::memory_order_relaxed);
      const unsigned prot = kProts[rng.below(3)];
      uint64_t t0 = 0;
      if (mrc_region_t *region = acquire(run, c, slot.start, slot.len, prot, &t0)) {
        const CheckResult result = oracle->check(region, slot.start, slot.len, rng);
        judge(run, c, id, slot, generation, slot.start, slot.len, prot, region, result, t0);
        mrc_put(run.cache, region);
        c.churned.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
}

// ---- hot threads ---------------------------------------------------------------------------

// Cycles through the pool's first kHotSlots slots, getting and putting each slot's first page
// kHotRun times in a row and checking the last get. With two or more hot threads every hot page
// parks in several threads' lines at once (core/cache/cache.h, "Parked references"), and with
// more hot slots than a line holds every switch to the next slot replaces a parked reference.
// The mutators' changes of those slots (every kind) take the references back, from lines whose
// owners are parking at that moment.
void hot_thread(Run &run, unsigned index) {
  const unsigned id = run.opt.threads + run.opt.churn + index;  // oracle lane, number in reports
  ThreadCounters &c = *run.counters[run.opt.threads + run.opt.mutators + run.opt.churn + index];
  Rng rng(mix64(run.seed ^ (0x4000 + index)));
  std::string error;
  std::unique_ptr<OracleThread> oracle = run.oracle->thread(id, &error);
  if (oracle == nullptr) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "hot thread " + std::to_string(index) + ": oracle set-up failed: " + error);
    return;
  }
  constexpr unsigned kProt = MRC_PROT_READ | MRC_PROT_WRITE;
  const size_t slots = std::min<size_t>(kHotSlots, run.pool->size());
  for (size_t turn = index; !run.stop.load(std::memory_order_relaxed); ++turn) {
    Slot &slot = run.pool->slot(turn % slots);
    std::shared_lock slot_guard(slot.lock);
    Instrumented::set_thread_context(static_cast<int>(id), slot.index);
    if (slot.start == 0) continue;
    const uint64_t generation = slot.generation.load(std::memory_order_relaxed);
    const size_t len = std::min<size_t>(page_size(), slot.len);
    uint64_t t0 = 0;
    mrc_region_t *region = acquire(run, c, slot.start, len, kProt, &t0);
    for (int hit = 1; hit < kHotRun && region != nullptr; ++hit) {
      mrc_put(run.cache, region);
      region = acquire(run, c, slot.start, len, kProt, &t0);
    }
    if (region == nullptr) continue;
    const CheckResult result = oracle->check(region, slot.start, len, rng);
    judge(run, c, id, slot, generation, slot.start, len, kProt, region, result, t0);
    mrc_put(run.cache, region);
    c.hot.fetch_add(1, std::memory_order_relaxed);
  }
}

// ---- the fork child ------------------------------------------------------------------------

// What a forked child does: a cache of its own over mappings of its own (mutated between
// checks), plus brk: grow the program break, register it, shrink it, grow it again and check
// that the cache did not keep the old pages. brk is only safe here: the child has one thread,
// so no malloc can move the break between our sbrk calls (checked anyway).
int child_main(const Run &run) {
  auto say = [](const std::string &text) {
    dprintf(STDERR_FILENO, "mrcache-stress child %d: %s\n", getpid(), text.c_str());
  };
  Rng rng(mix64(run.seed ^ static_cast<uint64_t>(getpid()) ^ 0xc41d));
  const bool pfn = std::string(run.oracle->name()) == "pfn";
  int pagemap_fd = -1;
  if (pfn) pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  BackendSetup::Config config;
  config.backend = run.opt.backend == Backend::kVerbs ? Backend::kIouring : run.opt.backend;
  config.seed = rng.next();
  config.pagemap_fd = pagemap_fd;
  config.iouring_slots = 64;
  std::string error;
  std::unique_ptr<BackendSetup> backend = BackendSetup::create(config, &error);
  if (backend == nullptr) {
    say("backend set-up failed: " + error);
    return says_no_memory(error) ? kChildNoMemory : kChildSetup;
  }
  std::unique_ptr<Oracle> oracle;
  if (backend->iouring() != nullptr) {
    oracle = make_iouring_oracle(backend->iouring(), &backend->instrumented(), 4);
  } else if (pfn) {
    oracle = make_pfn_oracle(&backend->instrumented(), pagemap_fd, 4);
  } else {
    oracle = make_no_oracle();
  }
  std::unique_ptr<OracleThread> check = oracle->thread(0, &error);
  if (check == nullptr) {
    say("oracle set-up failed: " + error);
    return says_no_memory(error) ? kChildNoMemory : kChildSetup;
  }
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.name = "mrcache-stress-child";
  params.flags = (params.flags & ~static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS)) |
                 (run.fast ? static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS) : 0U);
  params.backend = backend->backend();
  params.backend_ctx = backend->backend_ctx();
  mrc_cache_t *cache = nullptr;
  mrc_status_t status = mrc_cache_create(&params, &cache);
  if (status != MRC_OK) {
    say(std::string("mrc_cache_create: ") + mrc_status_string(status));
    return status == MRC_ERR_NO_MEMORY ? kChildNoMemory : kChildSetup;
  }

  int verdict = 0;
  // One get + check + put; false when the child must stop.
  auto use = [&](uintptr_t start, size_t len, const char *what) {
    mrc_region_t *region = nullptr;
    status = mrc_get(cache, reinterpret_cast<void *>(start), len, MRC_PROT_READ | MRC_PROT_WRITE,
                     &region);
    if (status != MRC_OK) {
      say(std::string(what) + ": mrc_get " + range_text(start, len) + " = " +
          mrc_status_string(status) + " (" + mrc_backend_last_error() + ")");
      verdict = status == MRC_ERR_NO_MEMORY ? kChildNoMemory : kChildError;
      return false;
    }
    const CheckResult result = check->check(region, start, len, rng);
    mrc_put(cache, region);
    if (result.kind == CheckResult::kStale) {
      say(std::string("STALE REGISTRATION in the fork child (") + what + ") at " +
          range_text(start, len) + ": " + result.detail + " (seed " + std::to_string(run.seed) +
          ")");
      verdict = kChildStale;
      return false;
    }
    if (result.kind == CheckResult::kError) {
      say(std::string(what) + ": oracle: " + result.detail);
      verdict = kChildError;
      return false;
    }
    return true;
  };

  {
    PoolConfig pool_config;
    pool_config.slots = 4;
    pool_config.min_size = page_size();
    pool_config.max_size = 1u << 20;
    pool_config.shared_fraction = run.opt.shared_fraction;
    pool_config.stable_frames = pfn;
    Pool pool(pool_config, rng.next(), now_ns());
    static constexpr MutationKind kKinds[] = {MutationKind::kRemap,    MutationKind::kMove,
                                              MutationKind::kShrink,   MutationKind::kGrow,
                                              MutationKind::kDontneed, MutationKind::kFree,
                                              MutationKind::kFixed,    MutationKind::kUnmapTail};
    for (int i = 0; i < 64 && verdict == 0; ++i) {
      Slot &slot = pool.slot(rng.below(pool.size()));
      if (i % 3 == 2) {
        (void)pool.mutate(slot, kKinds[rng.below(std::size(kKinds))], rng);
        continue;
      }
      if (slot.start == 0) continue;
      const size_t len = page_up(rng.log_uniform(page_size(), slot.len));
      const uintptr_t offset = page_down(rng.below(slot.len - std::min(len, slot.len) + 1));
      use(slot.start + offset, std::min(len, slot.len - offset), "pool");
    }

    // brk: the break is process-wide; only this single-threaded child may move it.
    const size_t len = 16 * page_size();
    void *const old_break = sbrk(0);
    const uintptr_t base = page_up(reinterpret_cast<uintptr_t>(old_break));
    if (verdict == 0 && brk(reinterpret_cast<void *>(base + len)) == 0) {
      bool ok = use(base, len, "brk grown");
      if (ok && sbrk(0) == reinterpret_cast<void *>(base + len)) {
        // Shrinking unmaps the top half (an UNMAP event); growing again maps fresh zero pages
        // at the same addresses: the cache must not hand out the old registration.
        if (brk(reinterpret_cast<void *>(base + len / 2)) == 0 &&
            brk(reinterpret_cast<void *>(base + len)) == 0) {
          ok = use(base, len, "brk shrunk and grown again");
        }
      }
      if (sbrk(0) == reinterpret_cast<void *>(base + len)) (void)brk(old_break);
    }
  }

  mrc_cache_destroy(cache);
  check.reset();
  oracle.reset();
  const std::vector<std::string> leaks = backend->leaks();
  for (const std::string &leak : leaks) say("leak: " + leak);
  if (verdict == 0 && !leaks.empty()) verdict = kChildLeak;
  backend.reset();
  if (pagemap_fd >= 0) close(pagemap_fd);
  return verdict;
}

void do_fork(Run &run, ThreadCounters &c) {
  const auto kind = static_cast<size_t>(MutationKind::kFork);
  const pid_t pid = fork();
  if (pid == 0) _exit(child_main(run));
  if (pid < 0) {
    c.refused[kind].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  c.mutations[kind].fetch_add(1, std::memory_order_relaxed);
  run.forks.fetch_add(1, std::memory_order_relaxed);
  int wstatus = 0;
  const uint64_t deadline = now_ns() + kChildTimeoutSeconds * 1000000000ULL;
  pid_t done = 0;
  while ((done = waitpid(pid, &wstatus, WNOHANG)) == 0 && now_ns() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &wstatus, 0);
    c.fork_failures.fetch_add(1, std::memory_order_relaxed);
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "fork child " + std::to_string(pid) + " hung for " +
                       std::to_string(kChildTimeoutSeconds) + " s (killed)");
    return;
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return;
  if (WIFSIGNALED(wstatus) && g_interrupted.load(std::memory_order_relaxed)) {
    return;  // Ctrl-C reached the child too: not a failure of the child
  }
  c.fork_failures.fetch_add(1, std::memory_order_relaxed);
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == kChildStale) {
    c.stale.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(run.report_mutex);
    if (run.stale_reports.size() < kMaxReports) {
      run.stale_reports.push_back("stale registration in fork child " + std::to_string(pid) +
                                  " (its report is on stderr), seed " + std::to_string(run.seed));
    }
    if (!run.opt.keep_going) run.stop.store(true, std::memory_order_relaxed);
    return;
  }
  c.errors.fetch_add(1, std::memory_order_relaxed);
  std::string why;
  if (WIFSIGNALED(wstatus)) {
    why = std::string("killed by signal ") + strsignal(WTERMSIG(wstatus));
  } else {
    const int code = WEXITSTATUS(wstatus);
    why = code == kChildLeak       ? "leaked registrations"
          : code == kChildSetup    ? "could not set up its cache"
          : code == kChildNoMemory ? std::string("ran out of memory: ") + strerrordesc_np(ENOMEM)
          : code == kChildError    ? "hit an error"
                                   : "exited with status " + std::to_string(code);
  }
  add_error(run, "fork child " + std::to_string(pid) + " " + why + " (its messages are on stderr)");
}

// ---- mutators ------------------------------------------------------------------------------

bool fork_due(Run &run, Rng &rng) {
  if (run.opt.fork_rate <= 0) return false;
  uint64_t next = run.next_fork_ns.load(std::memory_order_relaxed);
  const uint64_t now = now_ns();
  if (now < next) return false;
  const auto interval = static_cast<uint64_t>(1e9 / run.opt.fork_rate * (0.5 + rng.uniform()));
  return run.next_fork_ns.compare_exchange_strong(next, now + interval, std::memory_order_relaxed);
}

void mutator(Run &run, unsigned index) {
  ThreadCounters &c = *run.counters[run.opt.threads + index];
  Rng rng(mix64(run.seed ^ (0x2000 + index)));
  double total = 0;
  for (double w : run.opt.mix) total += w;
  while (!run.stop.load(std::memory_order_relaxed)) {
    if (fork_due(run, rng)) {
      do_fork(run, c);
      continue;
    }
    if (total <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    double pick = rng.uniform() * total;
    int kind = 0;
    while (kind < kMutationKinds - 1 && pick >= run.opt.mix[static_cast<size_t>(kind)]) {
      pick -= run.opt.mix[static_cast<size_t>(kind)];
      ++kind;
    }
    const auto chosen = static_cast<MutationKind>(kind);
    if (chosen == MutationKind::kPurge) {
      const mrc_status_t status = mrc_cache_purge(run.cache);
      c.mutations[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
      if (status != MRC_OK) {
        c.errors.fetch_add(1, std::memory_order_relaxed);
        add_error(run, std::string("mrc_cache_purge = ") + mrc_status_string(status));
      }
    } else {
      Slot &slot = run.pool->slot(rng.below(run.pool->size()));
      std::unique_lock slot_guard(slot.lock);
      const Mutation m = run.pool->mutate(slot, chosen, rng);
      if (run.opt.verify_mappings) {
        const std::string wrong = Pool::check_mapped(slot);
        if (!wrong.empty()) {
          c.errors.fetch_add(1, std::memory_order_relaxed);
          std::string history;
          for (const Mutation &h : run.pool->history(slot)) history += "\n    " + describe(h);
          add_error(run, "harness: after " + describe(m) + ": " + wrong + history);
          run.stop.store(true, std::memory_order_relaxed);
        }
      }
      slot_guard.unlock();
      c.mutations[static_cast<size_t>(m.kind)].fetch_add(1, std::memory_order_relaxed);
      if (m.error != 0)
        c.refused[static_cast<size_t>(m.kind)].fetch_add(1, std::memory_order_relaxed);
    }
    if (run.opt.mutate_pause_us != 0) {
      const auto pause =
          static_cast<long>(run.opt.mutate_pause_us / 2 + rng.below(run.opt.mutate_pause_us + 1));
      std::this_thread::sleep_for(std::chrono::microseconds(pause));
    }
  }
}

// A thread of the run. An exception (std::bad_alloc under RLIMIT_AS, std::system_error) would
// call std::terminate; it stops the run instead, as a resource failure (exit 2).
void guarded(void (*body)(Run &, unsigned), Run &run, unsigned index) {
  try {
    body(run, index);
  } catch (const std::exception &e) {
    {
      std::lock_guard lock(run.report_mutex);
      if (run.resource_failure.empty()) run.resource_failure = e.what();
    }
    run.stop.store(true, std::memory_order_relaxed);
  }
}

// ---- set-up helpers --------------------------------------------------------------------------

bool has_cap_ipc_lock() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    unsigned long long caps = 0;
    if (std::sscanf(line.c_str(), "CapEff: %llx", &caps) == 1) return (caps >> 14) & 1;  // 14
  }
  return false;
}

// Memory this process may pin (io_uring and verbs charge RLIMIT_MEMLOCK), 0 = no limit.
uint64_t pin_budget() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  if (has_cap_ipc_lock()) return 0;
  return limit.rlim_cur;
}

// When RLIMIT_AS limits the process: "; RLIMIT_AS is 512 MiB (`ulimit -v`): too small for this
// run?", else "". Set-up failures that an address-space limit explains say so, so that a user
// sees the limit instead of a failed run.
std::string address_space_note() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return "";
  return "; RLIMIT_AS is " + format_size(limit.rlim_cur) +
         " (`ulimit -v`): too small for this run? (fewer --threads/--slots, a smaller --max-size, "
         "or a higher limit)";
}

// "tid name, ..." of every thread of the process.
std::string describe_threads() {
  std::string out;
  DIR *dir = opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (dirent *entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    out += (out.empty() ? "" : ", ") + std::string(entry->d_name) + " " + name;
  }
  closedir(dir);
  return out;
}

struct Baseline {
  ProcessSnapshot snapshot;
  std::vector<OpenFile> files;
};

Baseline take_baseline() { return Baseline{take_snapshot(), list_fds()}; }

// The descriptors opened since the start. The library keeps up to four /proc/self/maps
// descriptors for the life of the process (base/proc_maps.cc: PROCMAP_QUERY needs an open maps
// file): those are listed in *kept, not counted as leaks.
std::vector<OpenFile> new_files(const Baseline &before, std::vector<OpenFile> *kept) {
  std::vector<OpenFile> added;
  const std::string maps = "/proc/" + std::to_string(getpid()) + "/maps";
  for (const OpenFile &file : list_fds()) {
    bool known = false;
    for (const OpenFile &old : before.files)
      known = known || (old.fd == file.fd && old.target == file.target);
    if (known) continue;
    if (file.target == maps && kept->size() < 4) {
      kept->push_back(file);
    } else {
      added.push_back(file);
    }
  }
  return added;
}

// Waits (up to 5 s) for asynchronous teardown — io_uring rings and their io-wq workers go away
// in kernel work items — then compares with the start.
std::vector<std::string> process_leaks(const Baseline &before, std::vector<std::string> *notes) {
  std::vector<std::string> leaks;
  ProcessSnapshot after;
  std::vector<OpenFile> added, kept;
  for (int attempt = 0; attempt < 100; ++attempt) {
    after = take_snapshot();
    kept.clear();
    added = new_files(before, &kept);
    if (after.vm_pin_kib <= before.snapshot.vm_pin_kib &&
        after.vm_lck_kib <= before.snapshot.vm_lck_kib && added.empty() &&
        after.threads <= before.snapshot.threads) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto compare = [&](const char *what, long then, long now, const char *unit) {
    if (now > then) {
      leaks.push_back(std::string(what) + ": " + std::to_string(then) + unit + " at start, " +
                      std::to_string(now) + unit + " at the end");
    }
  };
  compare("VmPin", before.snapshot.vm_pin_kib, after.vm_pin_kib, " kB");
  compare("VmLck", before.snapshot.vm_lck_kib, after.vm_lck_kib, " kB");
  int allowed_threads = before.snapshot.threads;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // The sanitizer's runtime starts a background thread of its own, lazily.
  if (after.threads == allowed_threads + 1) {
    ++allowed_threads;
    notes->push_back("one extra thread at the end: the sanitizer runtime's (not counted)");
  }
#endif
  compare("threads", allowed_threads, after.threads, "");
  if (after.threads > allowed_threads) leaks.push_back("threads now: " + describe_threads());
  for (const OpenFile &file : added) {
    leaks.push_back("open file: fd " + std::to_string(file.fd) + " -> " + file.target);
  }
  if (!kept.empty()) {
    notes->push_back("the library keeps " + std::to_string(kept.size()) +
                     " /proc/self/maps descriptor(s) open for the life of the process "
                     "(base/proc_maps.cc); not counted as leaks");
  }
  return leaks;
}

// One run, as the phases run() goes through top to bottom. A phase that can end the run early
// returns the exit status to end it with; the members are what the phases hand on, declared in
// the order they come to life, so that they are torn down in reverse.
class Harness {
 public:
  explicit Harness(const Options &options) : opt_(options) {}
  Harness(const Harness &) = delete;
  Harness &operator=(const Harness &) = delete;

  // REQUIRES: g_parent_pid is set. Returns the exit status of mrcache-stress.
  int run();

 private:
  // Set-up.
  void record_start();
  void choose_seed();
  void fit_sizes();
  std::optional<int> choose_oracle();
  std::optional<int> open_backend();
  void make_oracle();
  void share_with_threads();
  std::optional<int> create_cache();
  void describe_monitor();
  std::optional<int> map_pool();
  void prepare_threads();
  // The run.
  void print_header();
  void catch_signals();
  void start_threads();
  void wait_for_the_end();
  void stop_threads();
  // The final checks and the report.
  void collect_cache_statistics();
  void destroy_cache();
  void check_registrations();
  void release_everything();
  void fill_summary();
  void explain_unmap_window();
  std::optional<int> check_resources();
  void take_reports();
  void print_result();
  int write_json_and_judge();

  Options opt_;
  Output out_;
  Summary summary_;
  Baseline before_;
  std::vector<std::string> notes_;
  OracleKind oracle_kind_ = OracleKind::kAuto;
  int pagemap_fd_ = -1;
  std::unique_ptr<BackendSetup> backend_;
  std::unique_ptr<Oracle> oracle_;
  Run run_;
  mrc_cache_params_t params_{};
  mrc_cache_t *cache_ = nullptr;
  std::unique_ptr<Pool> pool_;
  std::vector<std::thread> threads_;
};

int Harness::run() {
  record_start();
  choose_seed();
  fit_sizes();
  if (std::optional<int> code = choose_oracle()) return *code;
  if (std::optional<int> code = open_backend()) return *code;
  make_oracle();
  share_with_threads();
  if (std::optional<int> code = create_cache()) return *code;
  describe_monitor();
  if (std::optional<int> code = map_pool()) return *code;
  prepare_threads();

  print_header();
  catch_signals();
  start_threads();
  wait_for_the_end();
  stop_threads();

  collect_cache_statistics();
  destroy_cache();
  check_registrations();
  release_everything();
  fill_summary();
  explain_unmap_window();
  if (std::optional<int> code = check_resources()) return *code;
  take_reports();
  print_result();
  return write_json_and_judge();
}

// ---- set-up ----------------------------------------------------------------------------------

// What the leak check compares with at the end.
void Harness::record_start() {
  summary_.version = mrc_version();
  before_ = take_baseline();
}

void Harness::choose_seed() {
  if (!opt_.seed_given) {
    opt_.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ now_ns();
  }
}

// Pinning is charged to RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK: size the run so
// that it fits, rather than failing with "no memory".
void Harness::fit_sizes() {
  const uint64_t budget = opt_.backend == Backend::kNull ? 0 : pin_budget();
  if (budget != 0) {
    const uint64_t per_range = page_down(budget / (4 * (opt_.threads + 4)));
    if (!opt_.max_size_given)
      opt_.max_size = std::max<uint64_t>(page_size(), std::min(opt_.max_size, per_range));
    if (!opt_.max_bytes && std::getenv("MRC_MAX_BYTES") == nullptr) opt_.max_bytes = budget / 2;
    if (!opt_.max_unreleased && std::getenv("MRC_MAX_UNRELEASED") == nullptr) {
      opt_.max_unreleased = budget / 8;
    }
    notes_.push_back("RLIMIT_MEMLOCK is " + format_size(budget) +
                     " and the process lacks CAP_IPC_LOCK: --max-size " +
                     format_size(opt_.max_size) + ", --max-bytes " + format_size(*opt_.max_bytes) +
                     " (raise `ulimit -l` for more)");
  }
  if (opt_.min_size > opt_.max_size) opt_.min_size = opt_.max_size;
}

// The oracle for this backend; the pfn oracle also needs the frames to be visible.
std::optional<int> Harness::choose_oracle() {
  oracle_kind_ = opt_.oracle;
  if (oracle_kind_ == OracleKind::kAuto) {
    oracle_kind_ = opt_.backend == Backend::kIouring ? OracleKind::kIouring
                   : opt_.backend == Backend::kVerbs ? OracleKind::kRdma
                                                     : OracleKind::kPfn;
  }
  const bool oracle_fits =
      oracle_kind_ == OracleKind::kNone || oracle_kind_ == OracleKind::kPfn ||
      (oracle_kind_ == OracleKind::kIouring && opt_.backend == Backend::kIouring) ||
      (oracle_kind_ == OracleKind::kRdma && opt_.backend == Backend::kVerbs);
  if (!oracle_fits) {
    std::fprintf(stderr, "mrcache-stress: --oracle %s needs --backend %s\n",
                 oracle_name(oracle_kind_),
                 oracle_kind_ == OracleKind::kIouring ? "iouring" : "verbs");
    return kExitUsage;
  }
  if (oracle_kind_ == OracleKind::kPfn) {
    std::string why;
    if (!frames_visible(&why)) {
      std::fprintf(stderr,
                   "mrcache-stress: the pfn oracle cannot work here: %s.\n"
                   "  Use the default backend (iouring: its oracle needs no privilege), run as "
                   "root, or --oracle none (no proof at all).\n",
                   why.c_str());
      return kExitUsage;
    }
    pagemap_fd_ = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    notes_.push_back(
        "pfn oracle: mappings get MADV_NOHUGEPAGE and MADV_DONTFORK (the null "
        "backend pins nothing, so THP collapse or copy-on-write would move frames); "
        "page migration by the kernel could still show as a false stale");
  }
  return std::nullopt;
}

std::optional<int> Harness::open_backend() {
  BackendSetup::Config backend_config;
  backend_config.backend = opt_.backend;
  backend_config.fail_rate = opt_.fail_rate;
  backend_config.seed = opt_.seed;
  backend_config.pagemap_fd = pagemap_fd_;
  backend_config.rdma_device = opt_.rdma_device;
  if (backend_config.rdma_device.empty() && std::getenv("RXE_DEV0") != nullptr) {
    backend_config.rdma_device = std::getenv("RXE_DEV0");
  }
  backend_config.gid_index = opt_.gid_index;
  std::string error;
  backend_ = BackendSetup::create(backend_config, &error);
  if (backend_ == nullptr) {
    std::fprintf(stderr, "mrcache-stress: backend %s: %s%s\n", backend_name(opt_.backend),
                 error.c_str(), address_space_note().c_str());
    if (pagemap_fd_ >= 0) close(pagemap_fd_);
    return kExitUsage;
  }
  return std::nullopt;
}

void Harness::make_oracle() {
  switch (oracle_kind_) {
    case OracleKind::kIouring:
      oracle_ =
          make_iouring_oracle(backend_->iouring(), &backend_->instrumented(), opt_.check_pages);
      break;
    case OracleKind::kPfn:
      oracle_ = make_pfn_oracle(&backend_->instrumented(), pagemap_fd_, opt_.check_pages);
      break;
    case OracleKind::kRdma:
      oracle_ = make_rdma_oracle(backend_->verbs(), &backend_->instrumented(), opt_.check_pages);
      break;
    default: oracle_ = make_no_oracle(); break;
  }
  if (oracle_kind_ == OracleKind::kNone) {
    notes_.push_back(
        "--oracle none: regions were not checked; this run proves nothing about "
        "staleness");
  }
}

// From here on the library's log messages count into the run.
void Harness::share_with_threads() {
  run_.opt = opt_;
  run_.seed = opt_.seed;
  run_.out = &out_;
  run_.backend = backend_.get();
  run_.oracle = oracle_.get();
  run_.injecting = opt_.fail_rate > 0;
  g_run = &run_;
  mrc_set_log_handler(&log_handler, nullptr);
}

// The cache as the environment configures it, with the mode and the limits the options
// override.
std::optional<int> Harness::create_cache() {
  char env_error[256];
  if (mrc_cache_params_init_checked(&params_, env_error, sizeof env_error) != MRC_OK) {
    std::fprintf(stderr, "mrcache-stress: %s\n", env_error);
    mrc_set_log_handler(nullptr, nullptr);
    return kExitUsage;
  }
  params_.name = "mrcache-stress";
  const bool fast_from_env = (params_.flags & MRC_FLAG_ORDERED_UNMAPS) != 0 && !opt_.fast;
  if (opt_.fast) {
    params_.flags = *opt_.fast ? params_.flags | MRC_FLAG_ORDERED_UNMAPS
                               : params_.flags & ~static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS);
  }
  run_.fast = (params_.flags & MRC_FLAG_ORDERED_UNMAPS) != 0;
  run_.window_counted = !run_.fast || opt_.strict_unmap_window;
  if (fast_from_env) {
    notes_.push_back("MRC_ORDERED_UNMAPS is set in the environment: fast mode (--exact overrides)");
  }
  if (!run_.fast && opt_.strict_unmap_window) {
    notes_.push_back("--strict-unmap-window changes nothing in exact mode: in-window hits count");
  }
  params_.backend = backend_->backend();
  params_.backend_ctx = backend_->backend_ctx();
  if (opt_.max_regions) params_.max_regions = *opt_.max_regions;
  if (opt_.max_bytes) params_.max_bytes = *opt_.max_bytes;
  if (opt_.max_unreleased) params_.max_unreleased = *opt_.max_unreleased;
  mrc_status_t status = mrc_cache_create(&params_, &cache_);
  if (status != MRC_OK) {
    std::fprintf(stderr, "mrcache-stress: mrc_cache_create: %s%s\n", mrc_status_string(status),
                 address_space_note().c_str());
    mrc_set_log_handler(nullptr, nullptr);
    return kExitUsage;
  }
  run_.cache = cache_;
  return std::nullopt;
}

void Harness::describe_monitor() {
  mrc_monitor_info_t monitor{};
  if (mrc_monitor_info(&monitor) == MRC_OK) {
    run_.monitor_mode = monitor.mode_name != nullptr ? monitor.mode_name : "?";
    summary_.monitor_reason = monitor.reason;
  } else {
    run_.monitor_mode = "unknown";
  }
  if (monitor.mode == MRC_MONITOR_UNCACHED) {
    notes_.push_back(
        "the monitor runs uncached, so nothing is cached and hits stay at 0 (the "
        "run still checks every registration); see the monitor line for why");
  }
  if (std::getenv("MRC_TEST_DROP_EVENTS") != nullptr) {
    notes_.push_back(
        "MRC_TEST_DROP_EVENTS is set: the monitor publishes no invalidation (a "
        "deliberately broken cache); the oracle should report stale use");
  }
}

// The pool's mappings; the run's clock starts here.
std::optional<int> Harness::map_pool() {
  PoolConfig pool_config;
  pool_config.slots = opt_.slots;
  pool_config.min_size = opt_.min_size;
  pool_config.max_size = opt_.max_size;
  pool_config.shared_fraction = opt_.shared_fraction;
  pool_config.stable_frames = oracle_kind_ == OracleKind::kPfn;
  pool_config.private_slots = opt_.churn;
  pool_config.private_len = opt_.churn_size;
  run_.start_ns = now_ns();
  backend_->instrumented().set_origin(run_.start_ns);
  pool_ = std::make_unique<Pool>(pool_config, mix64(opt_.seed), run_.start_ns);
  if (!pool_->setup_error().empty()) {
    // The run never started: a usage or machine problem, not a failure of the cache.
    std::fprintf(stderr,
                 "mrcache-stress: cannot map the pool's mappings (--slots %u of up to %s): %s%s\n",
                 opt_.slots, format_size(opt_.max_size).c_str(), pool_->setup_error().c_str(),
                 address_space_note().c_str());
    pool_.reset();
    mrc_cache_destroy(cache_);
    mrc_set_log_handler(nullptr, nullptr);
    g_run = nullptr;
    if (pagemap_fd_ >= 0) close(pagemap_fd_);
    return kExitUsage;
  }
  run_.pool = pool_.get();
  return std::nullopt;
}

void Harness::prepare_threads() {
  run_.next_fork_ns.store(
      opt_.fork_rate > 0 ? run_.start_ns + static_cast<uint64_t>(1e9 / opt_.fork_rate) : 0);
  for (unsigned i = 0; i < opt_.threads + opt_.mutators + opt_.churn + opt_.hot_threads; ++i) {
    run_.counters.push_back(std::make_unique<ThreadCounters>());
  }
}

// ---- the run ---------------------------------------------------------------------------------

void Harness::print_header() {
  if (opt_.quiet) return;
  char head[512];
  std::snprintf(head, sizeof head,
                "mrcache-stress %s: %s mode, seed %llu, backend %s, oracle %s, monitor %s; "
                "%u workers, %u mutators, %u churn, %u hot, %u mappings of %s .. %s, %s",
                summary_.version.c_str(), run_.fast ? "fast" : "exact",
                static_cast<unsigned long long>(opt_.seed), backend_name(opt_.backend),
                oracle_->name(), run_.monitor_mode.c_str(), opt_.threads, opt_.mutators, opt_.churn,
                opt_.hot_threads, opt_.slots, format_size(page_up(opt_.min_size)).c_str(),
                format_size(opt_.max_size).c_str(), format_duration(opt_.duration_s).c_str());
  out_.line(head);
  for (const std::string &note : notes_) out_.line("note: " + note);
}

// SIGINT and SIGTERM end the run early, with its report.
void Harness::catch_signals() {
  struct sigaction action {};
  action.sa_handler = &on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

void Harness::start_threads() {
  try {
    for (unsigned i = 0; i < opt_.threads; ++i) {
      threads_.emplace_back(guarded, worker, std::ref(run_), i);
    }
    for (unsigned i = 0; i < opt_.mutators; ++i) {
      threads_.emplace_back(guarded, mutator, std::ref(run_), i);
    }
    for (unsigned i = 0; i < opt_.churn; ++i) {
      threads_.emplace_back(guarded, churner, std::ref(run_), i);
    }
    for (unsigned i = 0; i < opt_.hot_threads; ++i) {
      threads_.emplace_back(guarded, hot_thread, std::ref(run_), i);
    }
  } catch (const std::exception &e) {
    // A thread could not start (std::system_error: EAGAIN under RLIMIT_AS or RLIMIT_NPROC):
    // stop and join the ones that did, as a resource failure.
    std::lock_guard lock(run_.report_mutex);
    run_.resource_failure =
        std::string("starting thread ") + std::to_string(threads_.size() + 1) + ": " + e.what();
    run_.stop.store(true, std::memory_order_relaxed);
  }
}

// Until the duration is over, a thread stops the run or a signal comes; with progress lines.
void Harness::wait_for_the_end() {
  const double interval =
      opt_.progress_interval_s > 0 ? opt_.progress_interval_s : (out_.tty() ? 0.5 : 10.0);
  double next_progress = interval;
  uint64_t last_ops = 0;
  double last_time = 0;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const double elapsed = run_.elapsed_s();
    if (g_interrupted.load(std::memory_order_relaxed)) {
      summary_.notes.push_back("interrupted by a signal after " + format_duration(elapsed));
      run_.stop.store(true, std::memory_order_relaxed);
    }
    if (elapsed >= opt_.duration_s || run_.stop.load(std::memory_order_relaxed)) break;
    if (!opt_.quiet && elapsed >= next_progress) {
      const Totals totals = sum(run_.all_counters());
      mrc_stats_t stats{};
      (void)mrc_cache_stats(cache_, &stats);
      const double rate = static_cast<double>(totals.ops - last_ops) / (elapsed - last_time);
      out_.progress(progress_text(elapsed, opt_.duration_s, totals, stats, rate));
      last_ops = totals.ops;
      last_time = elapsed;
      next_progress = elapsed + interval;
    }
  }
}

void Harness::stop_threads() {
  summary_.stopped_early = run_.stop.load(std::memory_order_relaxed);
  run_.stop.store(true, std::memory_order_relaxed);
  for (std::thread &t : threads_) t.join();
  summary_.duration_s = run_.elapsed_s();
  out_.finish_progress();
}

// ---- the final checks and the report ---------------------------------------------------------

void Harness::collect_cache_statistics() {
  (void)mrc_cache_stats(cache_, &summary_.cache);
  int json_len = mrc_cache_stats_json(cache_, nullptr, 0);
  if (json_len > 0) {
    std::string json(static_cast<size_t>(json_len) + 1, '\0');
    json_len = mrc_cache_stats_json(cache_, json.data(), json.size());
    json.resize(static_cast<size_t>(std::max(json_len, 0)));
    summary_.cache_json = json;
  }
  summary_.unmap_waits = cache_json_counter(summary_.cache_json, "unmap_waits");
}

void Harness::destroy_cache() {
  mrc_cache_destroy(cache_);
  run_.cache = nullptr;
}

// With the cache gone, every registration must have been deregistered and every invalidation
// completed.
void Harness::check_registrations() {
  summary_.leaks = backend_->leaks();
  const uint64_t invalidates = sum(run_.all_counters()).invalidates;
  summary_.invalidate_callbacks = run_.invalidate_callbacks.load();
  if (summary_.invalidate_callbacks != invalidates) {
    summary_.leaks.push_back(std::to_string(invalidates - summary_.invalidate_callbacks) +
                             " mrc_invalidate completion callbacks never ran");
  }
  summary_.registrations = backend_->instrumented().registrations();
  summary_.deregistrations = backend_->instrumented().deregistrations();
  summary_.injected_backend = backend_->injected();
}

// Then the process must be back where it started: pinned and locked memory, files, threads.
void Harness::release_everything() {
  mrc_set_log_handler(nullptr, nullptr);
  g_run = nullptr;
  pool_.reset();
  oracle_.reset();
  backend_.reset();
  if (pagemap_fd_ >= 0) close(pagemap_fd_);
  for (std::string &leak : process_leaks(before_, &notes_)) {
    summary_.leaks.push_back(std::move(leak));
  }
}

void Harness::fill_summary() {
  summary_.seed = opt_.seed;
  summary_.backend = backend_name(opt_.backend);
  summary_.oracle = oracle_name(oracle_kind_);
  summary_.monitor_mode = run_.monitor_mode;
  summary_.requested_s = opt_.duration_s;
  summary_.threads = opt_.threads;
  summary_.mutators = opt_.mutators;
  summary_.churn = opt_.churn;
  summary_.churn_size = page_up(opt_.churn_size);
  summary_.fast = run_.fast;
  summary_.window_counted = run_.window_counted;
  summary_.min_size = page_up(opt_.min_size);
  summary_.max_size = opt_.max_size;
  summary_.max_regions = params_.max_regions;
  summary_.max_bytes = params_.max_bytes;
  summary_.max_unreleased = params_.max_unreleased;
  summary_.fail_rate = opt_.fail_rate;
  summary_.totals = sum(run_.all_counters());
}

// What the stale hits inside the unmap window mean in this mode.
void Harness::explain_unmap_window() {
  const std::string in_window = std::to_string(summary_.totals.stale_window);
  if (summary_.totals.stale_window != 0 && !run_.fast) {
    notes_.push_back(in_window +
                     " of the stale hits were on addresses another thread was still unmapping "
                     "when the get began. Exact mode promises those too (each get probes the "
                     "kernel for unmaps in flight and waits for them), so the cache failed; the "
                     "reports' window lines name the unmap");
  } else if (summary_.totals.stale_window != 0 && !run_.window_counted) {
    notes_.push_back(
        in_window +
        " in-window hit(s), on addresses another thread was still unmapping when "
        "the get began: the kernel hands an address to a new mapping before "
        "userfaultfd reports its unmap, and fast mode (MRC_FLAG_ORDERED_UNMAPS) "
        "skips, on hits, the probe that would wait for it, so a thread that maps memory freed "
        "by another thread at that moment can get the old registration. What fast "
        "mode gives up; not counted as stale (--strict-unmap-window counts them, "
        "exact mode closes the window)");
  } else if (run_.fast && opt_.churn == 0) {
    notes_.push_back(
        "fast mode without churn threads (--churn 0): the unmap window is rarely "
        "reached, so 0 in-window hits says little");
  }
}

// Out of memory, address space or threads: the run did not finish, so it proves nothing
// either way. Exit 2 with the reason, not FAILED.
std::optional<int> Harness::check_resources() {
  // Every error was for lack of memory, under an address-space limit (each error line names it):
  // the machine could not hold the run, as when the threads or the pool are refused.
  const uint64_t no_memory = run_.no_memory_errors.load(std::memory_order_relaxed);
  if (run_.resource_failure.empty() && no_memory != 0 && no_memory == summary_.totals.errors &&
      summary_.totals.stale == 0 && !address_space_reached().empty()) {
    run_.resource_failure = std::to_string(no_memory) + " operation(s) failed for lack of memory";
  }
  if (!run_.resource_failure.empty()) {
    std::fprintf(stderr, "mrcache-stress: the run stopped for lack of resources: %s%s\n",
                 run_.resource_failure.c_str(), address_space_note().c_str());
    return kExitUsage;
  }
  return std::nullopt;
}

void Harness::take_reports() {
  summary_.forks = run_.forks.load();
  summary_.log_warnings = run_.log_warnings.load();
  summary_.log_errors = run_.log_errors.load();
  // A library error message is an error of the run.
  summary_.totals.errors += summary_.log_errors;
  summary_.stale_reports = run_.stale_reports;
  summary_.window_reports = run_.window_reports;
  summary_.errors = run_.errors;
  for (std::string &note : notes_) summary_.notes.push_back(std::move(note));
}

// --quiet: one line (and any in-window hits and leaks); else the summary table.
void Harness::print_result() {
  if (!opt_.quiet) {
    out_.line(summary_table(summary_));
    return;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "mrcache-stress: %s: %s mode, %llu ops in %s, %llu stale, %zu leaks, %llu "
                "errors, %llu injected failures (seed %llu, monitor %s)",
                summary_.passed() ? "PASSED" : "FAILED", run_.fast ? "fast" : "exact",
                static_cast<unsigned long long>(summary_.totals.ops),
                format_duration(summary_.duration_s).c_str(),
                static_cast<unsigned long long>(summary_.totals.stale), summary_.leaks.size(),
                static_cast<unsigned long long>(summary_.totals.errors),
                static_cast<unsigned long long>(summary_.totals.injected),
                static_cast<unsigned long long>(summary_.seed), summary_.monitor_mode.c_str());
  out_.line(line);
  if (summary_.totals.stale_window != 0) {
    out_.line("  " + std::to_string(summary_.totals.stale_window) +
              " stale hit(s) while another thread's unmap of the address was in flight" +
              (!run_.fast            ? " (counted: exact mode)"
               : run_.window_counted ? " (counted: --strict-unmap-window)"
                                     : " (not counted: fast mode)"));
  }
  for (const std::string &leak : summary_.leaks) out_.line("  leak: " + leak);
}

int Harness::write_json_and_judge() {
  if (!opt_.json_path.empty()) {
    std::ofstream file(opt_.json_path);
    file << summary_json(summary_);
    if (!file) {
      std::fprintf(stderr, "mrcache-stress: cannot write %s\n", opt_.json_path.c_str());
      return kExitFailed;
    }
  }
  return summary_.passed() ? kExitPassed : kExitFailed;
}

int run_main(int argc, char **argv) {
  Options opt;
  if (std::optional<int> code = parse_options(argc, argv, &opt)) return *code;
  g_parent_pid.store(getpid(), std::memory_order_relaxed);
  Harness harness(opt);
  return harness.run();
}

}  // namespace
}  // namespace stress

int main(int argc, char **argv) {
  // Exit 2, as for set-up: 1 says the cache failed (scripts/soak.sh stops on it).
  mrc_tools::check_stdout_at_exit("mrcache-stress", 2);
  try {
    return stress::run_main(argc, argv);
  } catch (const std::exception &e) {
    // Thread creation or an allocation failed (std::system_error, std::bad_alloc): the run
    // could not be set up; under RLIMIT_AS the limit is the likely cause.
    std::fprintf(stderr, "mrcache-stress: %s%s\n", e.what(), stress::address_space_note().c_str());
    return 2;
  }
}
