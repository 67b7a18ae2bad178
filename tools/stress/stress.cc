// SPDX-License-Identifier: BSD-3-Clause
// mrcache-stress: workers get/check/put random ranges of a pool of mappings while mutators
// change those mappings; an oracle proves every region handed out maps the memory there now.
//
// A run goes through the phases of Harness (harness.h): set-up, the run, the final checks.
// SYNCHRONIZATION: see run.h.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "mrcache/mrcache.h"
#include "tools/common/stdout_check.h"
#include "tools/stress/harness.h"
#include "tools/stress/threads.h"

namespace stress {
namespace {

void on_signal(int) { g_interrupted.store(true, std::memory_order_relaxed); }

int run_main(int argc, char **argv) {
  Options opt;
  if (std::optional<int> code = parse_options(argc, argv, &opt)) return *code;
  g_parent_pid.store(getpid(), std::memory_order_relaxed);
  Harness harness(opt);
  return harness.run();
}

}  // namespace

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
