// SPDX-License-Identifier: BSD-3-Clause
// The driver: runs every trial in a fresh process, alternating the paths within each
// repetition, and collects the figures for the report.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tools/appbench/workloads.h"

namespace appbench {

struct DriverConfig {
  std::vector<const Workload *> workloads;
  std::vector<std::string> paths;    // exact, fast, ucx, none
  std::vector<std::string> engines;  // null, iouring
  std::vector<int> cpus;             // -1: unbound; >= 0: bound to that CPU
  int repetitions = 5;
  TimingConfig timing;
  double trial_timeout = 120;  // seconds; a trial still running then is killed and fails
  bool verbose = false;        // one line per trial
};

// The figures of one workload on one engine and binding: ns per message (or step) of each
// path, one per repetition (NaN where that trial failed).
struct Group {
  std::string engine;
  int cpu = -1;
  const Workload *workload = nullptr;
  std::map<std::string, std::vector<double>> ns;
  std::map<std::string, std::string> counters;  // the path's counters from its last trial
};

struct Results {
  std::vector<Group> groups;
  std::map<std::string, std::string> unavailable;  // "engine/path" -> why it did not run
  std::vector<std::string> failures;               // trials that failed, and why
};

// Runs the trials; progress on stderr.
Results run_driver(const DriverConfig &config);

}  // namespace appbench
