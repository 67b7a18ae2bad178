// SPDX-License-Identifier: BSD-3-Clause
// The driver (driver.h).
#include "tools/appbench/driver.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tools/appbench/report.h"
#include "tools/appbench/trial.h"

namespace appbench {

namespace {

struct TrialOutcome {
  int exit_code = -1;  // -1: did not exit normally (signal, time-out)
  std::string line;    // the trial's JSON line
  std::string why;     // set when something went wrong outside the trial's own report
};

double monotonic_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// This program again, with --trial: a fresh process, so that no trial inherits another's
// mappings, allocator state or (for UCX) patched libc.
TrialOutcome spawn_trial(const TrialSpec &spec, double timeout) {
  const std::vector<std::string> args = {"mrcache-appbench",
                                         "--trial",
                                         "--workload",
                                         spec.workload,
                                         "--path",
                                         spec.path,
                                         "--engine",
                                         spec.engine,
                                         "--cpu",
                                         std::to_string(spec.cpu),
                                         "--min-time",
                                         fmt::format("{}", spec.timing.min_seconds),
                                         "--min-ops",
                                         std::to_string(spec.timing.min_ops),
                                         "--seed",
                                         std::to_string(spec.timing.seed)};
  std::vector<char *> argv;
  for (const std::string &arg : args) argv.push_back(const_cast<char *>(arg.c_str()));
  argv.push_back(nullptr);
  TrialOutcome outcome;
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    outcome.why = "pipe failed";
    return outcome;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    outcome.why = "fork failed";
    return outcome;
  }
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  const double deadline = monotonic_seconds() + timeout;
  bool timed_out = false;
  char buffer[4096];
  for (;;) {
    const double left = deadline - monotonic_seconds();
    if (left <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd fd = {pipe_fds[0], POLLIN, 0};
    const int ready = poll(&fd, 1, static_cast<int>(std::ceil(left * 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    outcome.line.append(buffer, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    outcome.why = fmt::format("still running after {} s (killed)", timeout);
  } else if (WIFEXITED(status)) {
    outcome.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    outcome.why =
        fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  return outcome;
}

std::string binding_name(int cpu) { return cpu < 0 ? "unbound" : fmt::format("cpu{}", cpu); }

}  // namespace

Results run_driver(const DriverConfig &config) {
  Results results;
  const size_t paths = config.paths.size();
  for (const std::string &engine : config.engines) {
    for (int cpu : config.cpus) {
      for (const Workload *workload : config.workloads) {
        Group group{engine, cpu, workload, {}, {}};
        for (const std::string &path : config.paths) {
          group.ns[path].assign(static_cast<size_t>(config.repetitions), NAN);
        }
        for (int rep = 0; rep < config.repetitions; ++rep) {
          // Each repetition starts with the next path, so that none always runs first.
          for (size_t i = 0; i < paths; ++i) {
            const std::string &path = config.paths[(i + static_cast<size_t>(rep)) % paths];
            const std::string key = engine + "/" + path;
            if (results.unavailable.count(key) != 0) continue;
            TrialSpec spec{workload->name, path, engine, cpu, config.timing};
            spec.timing.seed = config.timing.seed + static_cast<uint64_t>(rep);
            const TrialOutcome outcome = spawn_trial(spec, config.trial_timeout);
            nlohmann::json line = nlohmann::json::parse(outcome.line, nullptr, false);
            const std::string where = fmt::format("{} {} {} {} (repetition {})", engine,
                                                  binding_name(cpu), workload->name, path, rep + 1);
            if (outcome.exit_code == kTrialUnavailable && line.is_object()) {
              results.unavailable[key] = line.value("error", "unavailable");
              fmt::print(stderr, "appbench: {} does not run here: {}\n", key,
                         results.unavailable[key]);
              continue;
            }
            if (outcome.exit_code != 0 || !line.is_object() || !line.contains("ns_per_op")) {
              std::string why = outcome.why;
              if (why.empty() && line.is_object()) why = line.value("error", "");
              if (why.empty())
                why = fmt::format("exit {}, output '{}'", outcome.exit_code, outcome.line);
              results.failures.push_back(where + ": " + why);
              fmt::print(stderr, "appbench: FAILED {}: {}\n", where, why);
              continue;
            }
            group.ns[path][static_cast<size_t>(rep)] = line["ns_per_op"].get<double>();
            group.counters[path] = line.value("counters", "");
            if (config.verbose) {
              fmt::print(stderr, "appbench: {}: {:.0f} ns ({} ops; {})\n", where,
                         line["ns_per_op"].get<double>(), line.value("ops", 0),
                         group.counters[path]);
            }
          }
        }
        std::string summary;
        for (const std::string &path : config.paths) {
          if (auto m = median(group.ns[path])) summary += fmt::format("  {} {:.0f}", path, *m);
        }
        fmt::print(stderr, "appbench: {} {} {}:{} ns\n", engine, binding_name(cpu), workload->name,
                   summary);
        results.groups.push_back(std::move(group));
      }
    }
  }
  return results;
}

}  // namespace appbench
