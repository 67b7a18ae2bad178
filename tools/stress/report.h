// SPDX-License-Identifier: BSD-3-Clause
// Counting, the progress line, the summary table and the JSON summary.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/stress/options.h"

namespace stress {

constexpr int kLatencyBuckets = 256;  // four per power of two of nanoseconds

// One per thread; relaxed atomics: statistics read by the progress thread while the owner
// counts, and exactly after the join.
struct alignas(64) ThreadCounters {
  std::atomic<uint64_t> ops{0};        // gets (each get of a hot range counts)
  std::atomic<uint64_t> checked{0};    // regions the oracle checked
  std::atomic<uint64_t> pages{0};      // stamps checked
  std::atomic<uint64_t> unchecked{0};  // regions too small for the worker's lane
  std::atomic<uint64_t> stale{0};
  // Stale hits while another thread's unmap of the address was in flight: of the stale ones
  // (exact mode, or --strict-unmap-window), else besides them (fast mode tolerates them).
  std::atomic<uint64_t> stale_window{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> injected{0};     // gets that failed with an injected failure
  std::atomic<uint64_t> invalidates{0};  // mrc_invalidate calls that returned MRC_OK
  std::atomic<uint64_t> nested{0};       // operations holding several regions
  std::atomic<uint64_t> hot{0};          // ranges got and put again and again before the check
  std::atomic<uint64_t> churned{0};      // fresh mappings a churn thread mapped and used
  std::atomic<uint64_t> mutations[kMutationKinds] = {};
  std::atomic<uint64_t> refused[kMutationKinds] = {};  // the kernel said no (errno recorded)
  std::atomic<uint64_t> fork_failures{0};
  std::atomic<uint64_t> latency[kLatencyBuckets] = {};  // mrc_get, nanoseconds

  void add_latency(uint64_t ns);
};

struct Totals {
  uint64_t ops = 0, checked = 0, pages = 0, unchecked = 0, stale = 0, stale_window = 0, errors = 0,
           injected = 0, invalidates = 0, nested = 0, hot = 0, churned = 0, fork_failures = 0;
  uint64_t mutations[kMutationKinds] = {};
  uint64_t refused[kMutationKinds] = {};
  uint64_t latency[kLatencyBuckets] = {};
  uint64_t mutations_total() const;
  double latency_percentile_ns(double p) const;  // 0 when nothing was measured
};
Totals sum(const std::vector<ThreadCounters *> &counters);

// Writes lines and the progress line: on a terminal the progress line is redrawn in place and
// other lines are printed above it; otherwise every line is a plain line. Thread-safe.
class Output {
 public:
  Output();
  bool tty() const { return tty_; }
  void line(const std::string &text, bool to_stderr = false);
  void progress(const std::string &text);  // on a terminal: redraw; else a plain line
  void finish_progress();                  // leaves the terminal on a fresh line

 private:
  std::mutex mutex_;
  bool tty_;
  bool progress_shown_ = false;
};

struct Summary {
  std::string version;
  uint64_t seed = 0;
  std::string backend, oracle, monitor_mode, monitor_reason;
  double duration_s = 0, requested_s = 0;
  unsigned threads = 0, mutators = 0, churn = 0;
  uint64_t min_size = 0, max_size = 0, churn_size = 0;
  bool fast = false;           // MRC_FLAG_ORDERED_UNMAPS on the run's caches
  bool window_counted = true;  // in-window stale hits count as stale (exact mode, or strict)
  uint64_t unmap_waits = 0;    // gets that waited for an unmap in flight (cache statistics)
  uint64_t max_regions = 0, max_bytes = 0, max_unreleased = 0;
  double fail_rate = 0;
  Totals totals;
  mrc_stats_t cache{};
  std::string cache_json;  // mrc_cache_stats_json
  uint64_t forks = 0;
  uint64_t injected_backend = 0;  // as the backend counted them
  uint64_t registrations = 0, deregistrations = 0;
  uint64_t invalidate_callbacks = 0;
  uint64_t log_warnings = 0, log_errors = 0;
  std::vector<std::string> leaks, stale_reports, window_reports, errors, notes;
  bool stopped_early = false;
  bool passed() const { return totals.stale == 0 && totals.errors == 0 && leaks.empty(); }
};

// A counter of mrc_cache_stats_json's object (0 when absent: an older library).
uint64_t cache_json_counter(const std::string &cache_json, const char *key);

std::string progress_text(double elapsed, double requested, const Totals &totals,
                          const mrc_stats_t &cache, double ops_per_s);
std::string summary_table(const Summary &summary);
std::string summary_json(const Summary &summary);  // pretty-printed JSON

}  // namespace stress
