// SPDX-License-Identifier: BSD-3-Clause
// What the run left behind: the process's pinned and locked memory, open files and threads at
// the start, compared with the end.
#pragma once

#include <string>
#include <vector>

#include "tools/stress/util.h"

namespace stress {

// What the process holds at the start.
struct Baseline {
  ProcessSnapshot snapshot;
  std::vector<OpenFile> files;
};

Baseline take_baseline();

// Waits (up to 5 s) for asynchronous teardown — io_uring rings and their io-wq workers go away
// in kernel work items — then compares with the start. Notes what it does not count in *notes.
std::vector<std::string> process_leaks(const Baseline &before, std::vector<std::string> *notes);

}  // namespace stress
