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

int run_main(int argc, char **argv) {
  Options opt;
  if (std::optional<int> code = parse_options(argc, argv, &opt)) return *code;
  g_parent_pid.store(getpid(), std::memory_order_relaxed);

  Output out;
  Summary summary;
  summary.version = mrc_version();
  const Baseline before = take_baseline();

  if (!opt.seed_given) opt.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ now_ns();
  std::vector<std::string> notes;

  // Pinning is charged to RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK: size the run so
  // that it fits, rather than failing with "no memory".
  const uint64_t budget = opt.backend == Backend::kNull ? 0 : pin_budget();
  if (budget != 0) {
    const uint64_t per_range = page_down(budget / (4 * (opt.threads + 4)));
    if (!opt.max_size_given)
      opt.max_size = std::max<uint64_t>(page_size(), std::min(opt.max_size, per_range));
    if (!opt.max_bytes && std::getenv("MRC_MAX_BYTES") == nullptr) opt.max_bytes = budget / 2;
    if (!opt.max_unreleased && std::getenv("MRC_MAX_UNRELEASED") == nullptr) {
      opt.max_unreleased = budget / 8;
    }
    notes.push_back("RLIMIT_MEMLOCK is " + format_size(budget) +
                    " and the process lacks CAP_IPC_LOCK: --max-size " + format_size(opt.max_size) +
                    ", --max-bytes " + format_size(*opt.max_bytes) +
                    " (raise `ulimit -l` for more)");
  }
  if (opt.min_size > opt.max_size) opt.min_size = opt.max_size;

  // The oracle for this backend.
  OracleKind oracle_kind = opt.oracle;
  if (oracle_kind == OracleKind::kAuto) {
    oracle_kind = opt.backend == Backend::kIouring ? OracleKind::kIouring
                  : opt.backend == Backend::kVerbs ? OracleKind::kRdma
                                                   : OracleKind::kPfn;
  }
  const bool oracle_fits =
      oracle_kind == OracleKind::kNone || oracle_kind == OracleKind::kPfn ||
      (oracle_kind == OracleKind::kIouring && opt.backend == Backend::kIouring) ||
      (oracle_kind == OracleKind::kRdma && opt.backend == Backend::kVerbs);
  if (!oracle_fits) {
    std::fprintf(stderr, "mrcache-stress: --oracle %s needs --backend %s\n",
                 oracle_name(oracle_kind),
                 oracle_kind == OracleKind::kIouring ? "iouring" : "verbs");
    return kExitUsage;
  }
  int pagemap_fd = -1;
  if (oracle_kind == OracleKind::kPfn) {
    std::string why;
    if (!frames_visible(&why)) {
      std::fprintf(stderr,
                   "mrcache-stress: the pfn oracle cannot work here: %s.\n"
                   "  Use the default backend (iouring: its oracle needs no privilege), run as "
                   "root, or --oracle none (no proof at all).\n",
                   why.c_str());
      return kExitUsage;
    }
    pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    notes.push_back(
        "pfn oracle: mappings get MADV_NOHUGEPAGE and MADV_DONTFORK (the null "
        "backend pins nothing, so THP collapse or copy-on-write would move frames); "
        "page migration by the kernel could still show as a false stale");
  }

  BackendSetup::Config backend_config;
  backend_config.backend = opt.backend;
  backend_config.fail_rate = opt.fail_rate;
  backend_config.seed = opt.seed;
  backend_config.pagemap_fd = pagemap_fd;
  backend_config.rdma_device = opt.rdma_device;
  if (backend_config.rdma_device.empty() && std::getenv("RXE_DEV0") != nullptr) {
    backend_config.rdma_device = std::getenv("RXE_DEV0");
  }
  backend_config.gid_index = opt.gid_index;
  std::string error;
  std::unique_ptr<BackendSetup> backend = BackendSetup::create(backend_config, &error);
  if (backend == nullptr) {
    std::fprintf(stderr, "mrcache-stress: backend %s: %s%s\n", backend_name(opt.backend),
                 error.c_str(), address_space_note().c_str());
    if (pagemap_fd >= 0) close(pagemap_fd);
    return kExitUsage;
  }
  std::unique_ptr<Oracle> oracle;
  switch (oracle_kind) {
    case OracleKind::kIouring:
      oracle = make_iouring_oracle(backend->iouring(), &backend->instrumented(), opt.check_pages);
      break;
    case OracleKind::kPfn:
      oracle = make_pfn_oracle(&backend->instrumented(), pagemap_fd, opt.check_pages);
      break;
    case OracleKind::kRdma:
      oracle = make_rdma_oracle(backend->verbs(), &backend->instrumented(), opt.check_pages);
      break;
    default: oracle = make_no_oracle(); break;
  }
  if (oracle_kind == OracleKind::kNone) {
    notes.push_back(
        "--oracle none: regions were not checked; this run proves nothing about "
        "staleness");
  }

  Run run;
  run.opt = opt;
  run.seed = opt.seed;
  run.out = &out;
  run.backend = backend.get();
  run.oracle = oracle.get();
  run.injecting = opt.fail_rate > 0;
  g_run = &run;
  mrc_set_log_handler(&log_handler, nullptr);

  mrc_cache_params_t params;
  char env_error[256];
  if (mrc_cache_params_init_checked(&params, env_error, sizeof env_error) != MRC_OK) {
    std::fprintf(stderr, "mrcache-stress: %s\n", env_error);
    mrc_set_log_handler(nullptr, nullptr);
    return kExitUsage;
  }
  params.name = "mrcache-stress";
  const bool fast_from_env = (params.flags & MRC_FLAG_ORDERED_UNMAPS) != 0 && !opt.fast;
  if (opt.fast) {
    params.flags = *opt.fast ? params.flags | MRC_FLAG_ORDERED_UNMAPS
                             : params.flags & ~static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS);
  }
  run.fast = (params.flags & MRC_FLAG_ORDERED_UNMAPS) != 0;
  run.window_counted = !run.fast || opt.strict_unmap_window;
  if (fast_from_env) {
    notes.push_back("MRC_ORDERED_UNMAPS is set in the environment: fast mode (--exact overrides)");
  }
  if (!run.fast && opt.strict_unmap_window) {
    notes.push_back("--strict-unmap-window changes nothing in exact mode: in-window hits count");
  }
  params.backend = backend->backend();
  params.backend_ctx = backend->backend_ctx();
  if (opt.max_regions) params.max_regions = *opt.max_regions;
  if (opt.max_bytes) params.max_bytes = *opt.max_bytes;
  if (opt.max_unreleased) params.max_unreleased = *opt.max_unreleased;
  mrc_cache_t *cache = nullptr;
  mrc_status_t status = mrc_cache_create(&params, &cache);
  if (status != MRC_OK) {
    std::fprintf(stderr, "mrcache-stress: mrc_cache_create: %s%s\n", mrc_status_string(status),
                 address_space_note().c_str());
    mrc_set_log_handler(nullptr, nullptr);
    return kExitUsage;
  }
  run.cache = cache;
  mrc_monitor_info_t monitor{};
  if (mrc_monitor_info(&monitor) == MRC_OK) {
    run.monitor_mode = monitor.mode_name != nullptr ? monitor.mode_name : "?";
    summary.monitor_reason = monitor.reason;
  } else {
    run.monitor_mode = "unknown";
  }
  if (monitor.mode == MRC_MONITOR_UNCACHED) {
    notes.push_back(
        "the monitor runs uncached, so nothing is cached and hits stay at 0 (the "
        "run still checks every registration); see the monitor line for why");
  }
  if (std::getenv("MRC_TEST_DROP_EVENTS") != nullptr) {
    notes.push_back(
        "MRC_TEST_DROP_EVENTS is set: the monitor publishes no invalidation (a "
        "deliberately broken cache); the oracle should report stale use");
  }

  PoolConfig pool_config;
  pool_config.slots = opt.slots;
  pool_config.min_size = opt.min_size;
  pool_config.max_size = opt.max_size;
  pool_config.shared_fraction = opt.shared_fraction;
  pool_config.stable_frames = oracle_kind == OracleKind::kPfn;
  pool_config.private_slots = opt.churn;
  pool_config.private_len = opt.churn_size;
  run.start_ns = now_ns();
  backend->instrumented().set_origin(run.start_ns);
  auto pool = std::make_unique<Pool>(pool_config, mix64(opt.seed), run.start_ns);
  if (!pool->setup_error().empty()) {
    // The run never started: a usage or machine problem, not a failure of the cache.
    std::fprintf(stderr,
                 "mrcache-stress: cannot map the pool's mappings (--slots %u of up to %s): %s%s\n",
                 opt.slots, format_size(opt.max_size).c_str(), pool->setup_error().c_str(),
                 address_space_note().c_str());
    pool.reset();
    mrc_cache_destroy(cache);
    mrc_set_log_handler(nullptr, nullptr);
    g_run = nullptr;
    if (pagemap_fd >= 0) close(pagemap_fd);
    return kExitUsage;
  }
  run.pool = pool.get();
  run.next_fork_ns.store(
      opt.fork_rate > 0 ? run.start_ns + static_cast<uint64_t>(1e9 / opt.fork_rate) : 0);
  for (unsigned i = 0; i < opt.threads + opt.mutators + opt.churn + opt.hot_threads; ++i) {
    run.counters.push_back(std::make_unique<ThreadCounters>());
  }

  if (!opt.quiet) {
    char head[512];
    std::snprintf(head, sizeof head,
                  "mrcache-stress %s: %s mode, seed %llu, backend %s, oracle %s, monitor %s; "
                  "%u workers, %u mutators, %u churn, %u hot, %u mappings of %s .. %s, %s",
                  summary.version.c_str(), run.fast ? "fast" : "exact",
                  static_cast<unsigned long long>(opt.seed), backend_name(opt.backend),
                  oracle->name(), run.monitor_mode.c_str(), opt.threads, opt.mutators, opt.churn,
                  opt.hot_threads, opt.slots, format_size(page_up(opt.min_size)).c_str(),
                  format_size(opt.max_size).c_str(), format_duration(opt.duration_s).c_str());
    out.line(head);
    for (const std::string &note : notes) out.line("note: " + note);
  }

  struct sigaction action {};
  action.sa_handler = &on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  std::vector<std::thread> threads;
  try {
    for (unsigned i = 0; i < opt.threads; ++i) {
      threads.emplace_back(guarded, worker, std::ref(run), i);
    }
    for (unsigned i = 0; i < opt.mutators; ++i) {
      threads.emplace_back(guarded, mutator, std::ref(run), i);
    }
    for (unsigned i = 0; i < opt.churn; ++i) {
      threads.emplace_back(guarded, churner, std::ref(run), i);
    }
    for (unsigned i = 0; i < opt.hot_threads; ++i) {
      threads.emplace_back(guarded, hot_thread, std::ref(run), i);
    }
  } catch (const std::exception &e) {
    // A thread could not start (std::system_error: EAGAIN under RLIMIT_AS or RLIMIT_NPROC):
    // stop and join the ones that did, as a resource failure.
    std::lock_guard lock(run.report_mutex);
    run.resource_failure =
        std::string("starting thread ") + std::to_string(threads.size() + 1) + ": " + e.what();
    run.stop.store(true, std::memory_order_relaxed);
  }

  const double interval =
      opt.progress_interval_s > 0 ? opt.progress_interval_s : (out.tty() ? 0.5 : 10.0);
  double next_progress = interval;
  uint64_t last_ops = 0;
  double last_time = 0;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const double elapsed = run.elapsed_s();
    if (g_interrupted.load(std::memory_order_relaxed)) {
      summary.notes.push_back("interrupted by a signal after " + format_duration(elapsed));
      run.stop.store(true, std::memory_order_relaxed);
    }
    if (elapsed >= opt.duration_s || run.stop.load(std::memory_order_relaxed)) break;
    if (!opt.quiet && elapsed >= next_progress) {
      const Totals totals = sum(run.all_counters());
      mrc_stats_t stats{};
      (void)mrc_cache_stats(cache, &stats);
      const double rate = static_cast<double>(totals.ops - last_ops) / (elapsed - last_time);
      out.progress(progress_text(elapsed, opt.duration_s, totals, stats, rate));
      last_ops = totals.ops;
      last_time = elapsed;
      next_progress = elapsed + interval;
    }
  }
  summary.stopped_early = run.stop.load(std::memory_order_relaxed);
  run.stop.store(true, std::memory_order_relaxed);
  for (std::thread &t : threads) t.join();
  summary.duration_s = run.elapsed_s();
  out.finish_progress();

  // Statistics, then tear everything down and look for what was left behind.
  (void)mrc_cache_stats(cache, &summary.cache);
  int json_len = mrc_cache_stats_json(cache, nullptr, 0);
  if (json_len > 0) {
    std::string json(static_cast<size_t>(json_len) + 1, '\0');
    json_len = mrc_cache_stats_json(cache, json.data(), json.size());
    json.resize(static_cast<size_t>(std::max(json_len, 0)));
    summary.cache_json = json;
  }
  summary.unmap_waits = cache_json_counter(summary.cache_json, "unmap_waits");
  mrc_cache_destroy(cache);
  run.cache = nullptr;
  summary.leaks = backend->leaks();
  const uint64_t invalidates = sum(run.all_counters()).invalidates;
  summary.invalidate_callbacks = run.invalidate_callbacks.load();
  if (summary.invalidate_callbacks != invalidates) {
    summary.leaks.push_back(std::to_string(invalidates - summary.invalidate_callbacks) +
                            " mrc_invalidate completion callbacks never ran");
  }
  summary.registrations = backend->instrumented().registrations();
  summary.deregistrations = backend->instrumented().deregistrations();
  summary.injected_backend = backend->injected();
  mrc_set_log_handler(nullptr, nullptr);
  g_run = nullptr;
  pool.reset();
  oracle.reset();
  backend.reset();
  if (pagemap_fd >= 0) close(pagemap_fd);
  for (std::string &leak : process_leaks(before, &notes)) summary.leaks.push_back(std::move(leak));

  summary.seed = opt.seed;
  summary.backend = backend_name(opt.backend);
  summary.oracle = oracle_name(oracle_kind);
  summary.monitor_mode = run.monitor_mode;
  summary.requested_s = opt.duration_s;
  summary.threads = opt.threads;
  summary.mutators = opt.mutators;
  summary.churn = opt.churn;
  summary.churn_size = page_up(opt.churn_size);
  summary.fast = run.fast;
  summary.window_counted = run.window_counted;
  summary.min_size = page_up(opt.min_size);
  summary.max_size = opt.max_size;
  summary.max_regions = params.max_regions;
  summary.max_bytes = params.max_bytes;
  summary.max_unreleased = params.max_unreleased;
  summary.fail_rate = opt.fail_rate;
  summary.totals = sum(run.all_counters());
  const std::string in_window = std::to_string(summary.totals.stale_window);
  if (summary.totals.stale_window != 0 && !run.fast) {
    notes.push_back(in_window +
                    " of the stale hits were on addresses another thread was still unmapping "
                    "when the get began. Exact mode promises those too (each get probes the "
                    "kernel for unmaps in flight and waits for them), so the cache failed; the "
                    "reports' window lines name the unmap");
  } else if (summary.totals.stale_window != 0 && !run.window_counted) {
    notes.push_back(
        in_window +
        " in-window hit(s), on addresses another thread was still unmapping when "
        "the get began: the kernel hands an address to a new mapping before "
        "userfaultfd reports its unmap, and fast mode (MRC_FLAG_ORDERED_UNMAPS) "
        "skips, on hits, the probe that would wait for it, so a thread that maps memory freed "
        "by another thread at that moment can get the old registration. What fast "
        "mode gives up; not counted as stale (--strict-unmap-window counts them, "
        "exact mode closes the window)");
  } else if (run.fast && opt.churn == 0) {
    notes.push_back(
        "fast mode without churn threads (--churn 0): the unmap window is rarely "
        "reached, so 0 in-window hits says little");
  }
  // Every error was for lack of memory, under an address-space limit (each error line names it):
  // the machine could not hold the run, as when the threads or the pool are refused.
  const uint64_t no_memory = run.no_memory_errors.load(std::memory_order_relaxed);
  if (run.resource_failure.empty() && no_memory != 0 && no_memory == summary.totals.errors &&
      summary.totals.stale == 0 && !address_space_reached().empty()) {
    run.resource_failure = std::to_string(no_memory) + " operation(s) failed for lack of memory";
  }
  if (!run.resource_failure.empty()) {
    // Out of memory, address space or threads: the run did not finish, so it proves nothing
    // either way. Exit 2 with the reason, not FAILED.
    std::fprintf(stderr, "mrcache-stress: the run stopped for lack of resources: %s%s\n",
                 run.resource_failure.c_str(), address_space_note().c_str());
    return kExitUsage;
  }
  summary.forks = run.forks.load();
  summary.log_warnings = run.log_warnings.load();
  summary.log_errors = run.log_errors.load();
  // A library error message is an error of the run.
  summary.totals.errors += summary.log_errors;
  summary.stale_reports = run.stale_reports;
  summary.window_reports = run.window_reports;
  summary.errors = run.errors;
  for (std::string &note : notes) summary.notes.push_back(std::move(note));

  if (opt.quiet) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "mrcache-stress: %s: %s mode, %llu ops in %s, %llu stale, %zu leaks, %llu "
                  "errors, %llu injected failures (seed %llu, monitor %s)",
                  summary.passed() ? "PASSED" : "FAILED", run.fast ? "fast" : "exact",
                  static_cast<unsigned long long>(summary.totals.ops),
                  format_duration(summary.duration_s).c_str(),
                  static_cast<unsigned long long>(summary.totals.stale), summary.leaks.size(),
                  static_cast<unsigned long long>(summary.totals.errors),
                  static_cast<unsigned long long>(summary.totals.injected),
                  static_cast<unsigned long long>(summary.seed), summary.monitor_mode.c_str());
    out.line(line);
    if (summary.totals.stale_window != 0) {
      out.line("  " + in_window +
               " stale hit(s) while another thread's unmap of the address was in flight" +
               (!run.fast            ? " (counted: exact mode)"
                : run.window_counted ? " (counted: --strict-unmap-window)"
                                     : " (not counted: fast mode)"));
    }
    for (const std::string &leak : summary.leaks) out.line("  leak: " + leak);
  } else {
    out.line(summary_table(summary));
  }
  if (!opt.json_path.empty()) {
    std::ofstream file(opt.json_path);
    file << summary_json(summary);
    if (!file) {
      std::fprintf(stderr, "mrcache-stress: cannot write %s\n", opt.json_path.c_str());
      return kExitFailed;
    }
  }
  return summary.passed() ? kExitPassed : kExitFailed;
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
