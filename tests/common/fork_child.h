// SPDX-License-Identifier: BSD-3-Clause
// Checks inside a forked test child, where gtest's assertions cannot report: a failed check ends
// the child with the line number as its exit status, which the parent's wait_child() returns.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

// In a child: a failed check ends it with the line number as exit status.
#define CHILD_CHECK(cond)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "child check failed: %s (line %d)\n", #cond, __LINE__); \
      _exit(__LINE__ % 250 + 1);                                              \
    }                                                                         \
  } while (0)

// The child's exit status; 1000 + the signal's number when a signal ended it.
inline int wait_child(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 1000 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
