// SPDX-License-Identifier: BSD-3-Clause
// The check of standard output at exit (stdout_check.h).
//
// SYNCHRONIZATION: main sets the program's name and status before any other thread exists; the
// exit handler reads them on the thread that calls exit(), after the program's threads ended.
#include "tools/common/stdout_check.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mrc_tools {

namespace {

const char *g_program = nullptr;
int g_failure_status = 1;
int g_error = 0;  // errno of the first failed flush, when a flush failed

// Flushes stdout; false when a write to it failed, now or before. The reason of a failure now is
// kept: a write that failed earlier leaves nothing to flush and no errno behind.
bool flush_stdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 && g_error == 0) g_error = errno;
  return std::ferror(stdout) == 0;
}

// Registered by check_stdout_at_exit, so it runs before the static destructors: the first flush
// of what the program printed, whose reason the last check names (the destructor of
// std::ios_base::Init flushes std::cout, and with it stdout, before that check).
void flush_stdout_early(int /*status*/, void * /*unused*/) { (void)flush_stdout(); }

void check_stdout(int status, void * /*unused*/) {
  if (g_program == nullptr) return;  // a program that did not ask (a test linking this library)
  if (flush_stdout()) return;
  std::fprintf(stderr, "%s: cannot write standard output: %s\n", g_program,
               g_error != 0 ? std::strerror(g_error) : "a write failed");
  // _exit: the status must change, and exit handlers do not return one. Those skipped are the
  // shared libraries' destructors and stdio's last flush, which stdout would fail again.
  _exit(status != 0 ? status : g_failure_status);
}

// Exit handlers run in the reverse order of their registration, static destructors among them
// (each is registered when its object has been constructed). Registered by a constructor that
// runs before the program's own (priority 101, the first one not reserved), the check comes after
// every destructor of the program, among them those that print summaries (mrcache-bench's).
// on_exit, unlike atexit, passes the status the program exits with.
__attribute__((constructor(101))) void register_check() { on_exit(&check_stdout, nullptr); }

}  // namespace

void check_stdout_at_exit(const char *program, int failure_status) {
  g_program = program;
  g_failure_status = failure_status;
  on_exit(&flush_stdout_early, nullptr);
}

}  // namespace mrc_tools
