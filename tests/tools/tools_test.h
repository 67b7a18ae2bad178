// SPDX-License-Identifier: BSD-3-Clause
// Helpers for the tests of the command-line tools: run a program, capture its output and exit
// status, read its JSON summary.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace mrc_tools_test {

struct Result {
  int status = -1;     // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
};

// Runs `command` through /bin/sh (so "VAR=value program args" works).
inline Result run(const std::string &command) {
  Result result;
  FILE *pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  if (WIFEXITED(status)) {
    result.status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.status = 128 + WTERMSIG(status);
  }
  return result;
}

// Runs `command` with its standard output on /dev/full (every write fails with ENOSPC); the
// result's output is its stderr.
inline Result run_into_full_stdout(const std::string &command) {
  return run("{ " + command + " >/dev/full; }");
}

inline nlohmann::json read_json(const std::string &path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

}  // namespace mrc_tools_test
