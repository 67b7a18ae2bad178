// SPDX-License-Identifier: BSD-3-Clause
// Fork: a mutator's fork, and what the child does with a cache of its own.
#pragma once

#include "tools/stress/run.h"

namespace stress {

// Forks a child that runs child_main() and waits for it (killing it after a time limit);
// counts it into `c` and reports a child that found a stale registration, leaked or failed.
// REQUIRES: the caller holds no harness lock (the child uses none of them).
void do_fork(Run &run, ThreadCounters &c);

}  // namespace stress
