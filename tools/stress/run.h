// SPDX-License-Identifier: BSD-3-Clause
// The state a run of mrcache-stress shares between its threads, and the ways they report into
// it: errors, the library's log messages, and what a lack of memory means.
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
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/stress/backend.h"
#include "tools/stress/options.h"
#include "tools/stress/oracle.h"
#include "tools/stress/pool.h"
#include "tools/stress/report.h"
#include "tools/stress/util.h"

namespace stress {

// Stale and error reports kept (and printed) per run.
constexpr size_t kMaxReports = 10;

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

// Set by SIGINT and SIGTERM.
extern std::atomic<bool> g_interrupted;
// The harness's own process: a fork child, which shares its memory, is any other.
extern std::atomic<pid_t> g_parent_pid;
// The run the log handler counts into; nullptr outside it.
extern Run *g_run;

// mrc_set_log_handler's handler: counts the library's warnings and errors into g_run and prints
// them.
void log_handler(void *, mrc_log_level_t level, const char *message);
// mrc_invalidate's completion callback; `arg` is the Run.
void on_invalidated(void *arg);

// A failure for lack of memory: ENOMEM's text, or the library's MRC_ERR_NO_MEMORY.
bool says_no_memory(const std::string &text);
// "address-space limit RLIMIT_AS=190.7 MiB reached (`ulimit -v`)" when that limit is finite,
// else "": what a failure for lack of memory most likely means then.
std::string address_space_reached();
// When RLIMIT_AS limits the process: "; RLIMIT_AS is 512 MiB (`ulimit -v`): too small for this
// run?", else "". Set-up failures that an address-space limit explains say so, so that a user
// sees the limit instead of a failed run.
std::string address_space_note();

// Records an error of the run (the first kMaxReports are kept and printed), naming the
// address-space limit when it is for lack of memory.
void add_error(Run &run, std::string text);

std::string prot_name(unsigned prot);                 // "rw", "r-", "-w"
std::string range_text(uintptr_t start, size_t len);  // "[0x7f0000000000, +4 KiB)"

// A thread of the run. An exception (std::bad_alloc under RLIMIT_AS, std::system_error) would
// call std::terminate; it stops the run instead, as a resource failure (exit 2).
void guarded(void (*body)(Run &, unsigned), Run &run, unsigned index);

}  // namespace stress
