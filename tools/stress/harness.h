// SPDX-License-Identifier: BSD-3-Clause
// One run of mrcache-stress as phases: its set-up (setup.cc), the run itself (stress.cc), and
// the final checks and the report (finish.cc).
//
// SYNCHRONIZATION: only the main thread calls the phases; the run's threads share only the Run
// (run.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/stress/backend.h"
#include "tools/stress/leaks.h"
#include "tools/stress/options.h"
#include "tools/stress/oracle.h"
#include "tools/stress/pool.h"
#include "tools/stress/report.h"
#include "tools/stress/run.h"

namespace stress {

constexpr int kExitPassed = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

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

}  // namespace stress
