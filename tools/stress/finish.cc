// SPDX-License-Identifier: BSD-3-Clause
// The last phases of a run (harness.h): the final checks — statistics, registrations and
// invalidations, what the process was left with — and the report.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "tools/stress/harness.h"

namespace stress {

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

}  // namespace stress
