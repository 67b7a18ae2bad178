// SPDX-License-Identifier: BSD-3-Clause
// mrcache-appbench: what an application sees of its registration cache. Application workloads
// (fresh buffers per message, pools, pools beside allocator churn, halo exchanges; workloads.h)
// through mrcache (exact and fast mode), UCX's ucs_rcache (where libucx-dev was installed at
// build time) and no cache, over the null and io_uring engines, unbound and bound to one CPU.
// Every trial is a fresh process; the paths alternate within each repetition; the report gives
// medians and per-repetition ratios (report.h). scripts/bench.sh runs it.
//
// Exit status: 0 = every trial ran; 1 = a trial failed (the report names it) or standard output
// could not be written; 2 = bad usage (a malformed MRC_* variable too).
#include <fmt/format.h>
#include <sched.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <regex>

#include "mrcache/mrcache.h"
#include "tools/appbench/driver.h"
#include "tools/appbench/report.h"
#include "tools/appbench/trial.h"
#include "tools/common/cli_numbers.h"
#include "tools/common/stdout_check.h"

namespace {

std::vector<std::string> split(const std::string &list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const size_t end = comma == std::string::npos ? list.size() : comma;
    if (end > start) out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The CPU a bound trial runs on: the last this process may use (CPU 0 takes most interrupts).
int cpu_to_bind() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  for (size_t cpu = CPU_SETSIZE; cpu-- > 0;) {
    if (CPU_ISSET(cpu, &set)) return static_cast<int>(cpu);
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  mrc_tools::check_stdout_at_exit("mrcache-appbench");
  CLI::App app{
      "mrcache-appbench: application workloads through mrcache, UCX's rcache and no "
      "cache, each trial a fresh process"};
  bool trial = false, list = false, verbose = false;
  appbench::TrialSpec spec;
  std::string workload_regex = ".*", paths = "exact,fast,ucx,none", engines = "null,iouring";
  std::string binding = "both", out_dir;
  int repetitions = 5;
  double timeout = 120;
  app.add_flag("--list", list, "list the workloads and exit");
  app.add_option("-w,--workloads", workload_regex, "workloads whose name matches this regex")
      ->capture_default_str();
  app.add_option("-p,--paths", paths, "paths, comma-separated: exact, fast, ucx, none")
      ->capture_default_str();
  app.add_option("-e,--engines", engines, "engines, comma-separated: null, iouring")
      ->capture_default_str();
  app.add_option("-b,--binding", binding,
                 "unbound, bound (every thread of a trial on one CPU: the last this "
                 "process may use; taskset the driver to choose it) or both")
      ->check(CLI::IsMember({"unbound", "bound", "both"}))
      ->capture_default_str();
  app.add_option("-r,--repetitions", repetitions, "trials of each path per workload")
      ->check(mrc_tools::unsigned_range(1, 1000))
      ->capture_default_str();
  app.add_option("--min-time", spec.timing.min_seconds, "seconds timed per trial")
      ->check(mrc_tools::finite_range(0.001, 3600))
      ->capture_default_str();
  app.add_option("--min-ops", spec.timing.min_ops, "messages timed per trial, at least")
      ->check(mrc_tools::unsigned_range(1, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--seed", spec.timing.seed, "seed of the pools' choices")
      ->check(mrc_tools::unsigned_range(0, UINT64_MAX))
      ->capture_default_str();
  app.add_option("--timeout", timeout, "seconds before a trial is killed and counted as failed")
      ->check(mrc_tools::finite_range(1, 86400))
      ->capture_default_str();
  app.add_option("-o,--out", out_dir, "write app.md, app.json and the plot's data files here");
  app.add_flag("-v,--verbose", verbose, "one line per trial on stderr");
  // The driver's own call of this program for one trial.
  app.add_flag("--trial", trial, "run one trial here (the driver's call)")->group("");
  app.add_option("--workload", spec.workload)->group("");
  app.add_option("--path", spec.path)->group("");
  app.add_option("--engine", spec.engine)->group("");
  app.add_option("--cpu", spec.cpu)->group("")->check(CLI::Range(-1, CPU_SETSIZE - 1));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e) == 0 ? 0 : 2;  // usage errors are exit 2, as in every mrcache tool
  }

  if (trial) return appbench::run_trial(spec);
  for (const char *option : {"--workload", "--path", "--engine", "--cpu"}) {
    if (app.count(option) != 0) {
      fmt::print(stderr,
                 "mrcache-appbench: {} is for --trial (the driver's own call); see --help\n",
                 option);
      return 2;
    }
  }
  if (list) {
    for (const appbench::Workload &w : appbench::workloads()) {
      fmt::print("{:24} {}\n", w.name, w.about);
    }
    return 0;
  }

  // A malformed MRC_* variable makes every mrcache trial's mrc_cache_create refuse: the driver
  // would call those paths unavailable and report the others, exit 0 with no mrcache figure.
  // The library names the variable; the run is refused, as a bad option would be.
  mrc_cache_params_t params;
  char why[512] = "";
  if (mrc_cache_params_init_checked(&params, why, sizeof why) != MRC_OK) {
    fmt::print(stderr, "mrcache-appbench: {}\n", why);
    return 2;
  }

  appbench::DriverConfig config;
  std::regex pattern;
  try {
    pattern = std::regex(workload_regex);
  } catch (const std::regex_error &e) {
    fmt::print(stderr, "mrcache-appbench: --workloads '{}' is not a regex: {}\n", workload_regex,
               e.what());
    return 2;
  }
  for (const appbench::Workload &w : appbench::workloads()) {
    if (std::regex_search(w.name, pattern)) config.workloads.push_back(&w);
  }
  if (config.workloads.empty()) {
    fmt::print(stderr, "mrcache-appbench: no workload matches '{}' (see --list)\n", workload_regex);
    return 2;
  }
  config.paths = split(paths);
  config.engines = split(engines);
  for (const std::string &path : config.paths) {
    if (path != "exact" && path != "fast" && path != "ucx" && path != "none") {
      fmt::print(stderr, "mrcache-appbench: --paths: unknown path '{}' (exact, fast, ucx, none)\n",
                 path);
      return 2;
    }
  }
  for (const std::string &engine : config.engines) {
    if (engine != "null" && engine != "iouring") {
      fmt::print(stderr, "mrcache-appbench: --engines: unknown engine '{}' (null, iouring)\n",
                 engine);
      return 2;
    }
  }
  if (config.paths.empty() || config.engines.empty()) {
    fmt::print(stderr, "mrcache-appbench: --paths and --engines need at least one each\n");
    return 2;
  }
  if (binding != "bound") config.cpus.push_back(-1);
  if (binding != "unbound") config.cpus.push_back(cpu_to_bind());
  config.repetitions = repetitions;
  config.timing = spec.timing;
  config.trial_timeout = timeout;
  config.verbose = verbose;

  const appbench::Results results = appbench::run_driver(config);
  fmt::print("{}", appbench::markdown(config, results));
  if (!out_dir.empty()) {
    mkdir(out_dir.c_str(), 0755);
    try {
      appbench::write_report(config, results, out_dir);
    } catch (const std::exception &e) {
      fmt::print(stderr, "mrcache-appbench: {}\n", e.what());
      return 1;
    }
  }
  return results.failures.empty() ? 0 : 1;
}
