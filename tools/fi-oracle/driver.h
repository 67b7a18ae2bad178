// SPDX-License-Identifier: BSD-3-Clause
// The driver: runs the plan in a receiver and a sender process (fork, before anything touches
// libfabric), collects their per-message lines, ends them when they are done, when a process
// reported an error, or when nothing happened for too long (a hang: both processes are killed,
// with the kernel function each thread was blocked in), and adds the verdicts up. A failure ends
// the scenario it happened in, not the run: the scenarios after it run in a fresh pair (with
// Config::isolate every scenario does, with a fresh cache). A pair that fails before its first
// message ends the run (a set-up error the next pair would repeat).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/fi-oracle/config.h"

namespace fi_oracle {

struct Row {
  std::string op, scenario;    // scenario "warm-up": each block's first message, memory unchanged
  uint64_t messages = 0;       // checked deliveries from the same address as before the change
  uint64_t stale = 0;          // deliveries carrying an older message's bytes
  uint64_t corrupt = 0;        // deliveries carrying neither the current nor an older stamp
  uint64_t errors = 0;         // messages the run did not complete (error or hang)
  uint64_t not_reused = 0;     // deliveries after a change that moved the buffer (not counted)
  uint64_t registrations = 0;  // memory registrations the sender made for `messages`
};

enum class Status { kOk, kError, kHang };

struct Outcome {
  Status status = Status::kOk;
  std::string detail;  // why, when not kOk
  std::vector<Row> rows;
  Row total;
  std::vector<std::string> info;  // the endpoints the processes opened
  double seconds = 0;
  // The scenario of the first message a failed block did not complete (a block's own).
  bool stopped = false;
  Scenario stopped_at = Scenario::kNone;
};

// timeout: bound on the whole run; stall: bound on a stretch without any message completing.
Outcome drive(const Config &config, double timeout, double stall);

const char *status_name(Status status);

}  // namespace fi_oracle
