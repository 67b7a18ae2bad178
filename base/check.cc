// SPDX-License-Identifier: BSD-3-Clause
#include "base/check.h"

#include <unistd.h>
#include <cstdio>
#include <cstdlib>

namespace mrc::detail {

// Writes with one write(2) and no allocation: this may run on the monitor thread.
void check_failed(const char *expr, const char *file, int line, const char *func) noexcept {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "mrcache: internal check failed: %s at %s:%d (%s)\n", expr,
                        file, line, func);
  if (n > 0) {
    ssize_t ignored =
        ::write(STDERR_FILENO, buf,
                static_cast<size_t>(n) < sizeof buf ? static_cast<size_t>(n) : sizeof buf - 1);
    (void)ignored;
  }
  std::abort();
}

}  // namespace mrc::detail
