// SPDX-License-Identifier: BSD-3-Clause
// One trial: one workload on one path and engine, in a process of its own (the driver starts
// it), printing its figure as one JSON line on stdout.
#pragma once

#include <string>

#include "tools/appbench/workloads.h"

namespace appbench {

struct TrialSpec {
  std::string workload;
  std::string path;
  std::string engine;
  int cpu = -1;  // >= 0: this process and all its threads (the monitor's too) on that CPU
  TimingConfig timing;
};

// The trial's exit codes besides 0; the JSON line's "error" says why.
constexpr int kTrialFailed = 3;
constexpr int kTrialUnavailable = 4;  // the path or engine cannot run here (no UCX, no io_uring)

int run_trial(const TrialSpec &spec);

}  // namespace appbench
