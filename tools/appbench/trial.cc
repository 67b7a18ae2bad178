// SPDX-License-Identifier: BSD-3-Clause
// One trial in this process (trial.h).
#include "tools/appbench/trial.h"

#include <sched.h>
#include <sys/resource.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace appbench {

namespace {

int report_error(const std::string &what, int code) {
  std::printf("%s\n", nlohmann::json{{"error", what}}.dump().c_str());
  std::fflush(stdout);
  return code;
}

}  // namespace

int run_trial(const TrialSpec &spec) {
  const Workload *workload = find_workload(spec.workload);
  if (workload == nullptr) return report_error("unknown workload " + spec.workload, kTrialFailed);
  if (spec.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<size_t>(spec.cpu), &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
      return report_error("cannot bind to CPU " + std::to_string(spec.cpu), kTrialFailed);
    }
  }
  // io_uring pins against RLIMIT_MEMLOCK (without CAP_IPC_LOCK): as much as the hard limit lets.
  rlimit memlock;
  if (getrlimit(RLIMIT_MEMLOCK, &memlock) == 0 && memlock.rlim_cur != memlock.rlim_max) {
    memlock.rlim_cur = memlock.rlim_max;
    setrlimit(RLIMIT_MEMLOCK, &memlock);
  }
  // The application configures its allocator first, then its runtime starts.
  configure_allocator(workload->allocation);
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Path> path;
  try {
    engine = std::make_unique<Engine>(spec.engine);
    path = make_path(spec.path, *engine);
  } catch (const std::exception &e) {
    return report_error(e.what(), kTrialUnavailable);
  }
  try {
    const Timing timing = workload->run(*workload, *path, spec.timing);
    nlohmann::json line = {{"ns_per_op", timing.ns_per_op()},
                           {"ops", timing.ops},
                           {"seconds", timing.seconds},
                           {"counters", path->counters()}};
    path.reset();  // its teardown is not timed, but must work
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
    return 0;
  } catch (const std::exception &e) {
    return report_error(e.what(), kTrialFailed);
  }
}

}  // namespace appbench
