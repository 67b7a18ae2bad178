// SPDX-License-Identifier: BSD-3-Clause
// Standard output that could not be written is an error of the program: `mrcache-info >
// /dev/full` must not exit 0 with its report lost. stdio keeps a failed write in the stream's
// error flag, and the final flush that exit() does reports to nobody; so every tool checks its
// standard output itself, as the last thing its process does.
#pragma once

namespace mrc_tools {

// Call from main, once. At exit, after every static destructor of the program (some print
// their summaries then), standard output is flushed; when that or an earlier write to it failed,
// "<program>: cannot write standard output: <reason>" goes to stderr and the process exits with
// `failure_status` instead of 0 (a non-zero status the program chose is kept).
void check_stdout_at_exit(const char *program, int failure_status = 1);

}  // namespace mrc_tools
