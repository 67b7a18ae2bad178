// SPDX-License-Identifier: BSD-3-Clause
// Private plumbing between the files of uffd/ (not for other layers).
#pragma once

#include <cstddef>
#include <cstdio>

#include "mrcache/mrcache.h"

namespace mrc::uffd::detail {

// Registers the pthread_atfork handlers (once), before the first subscription.
void ensure_fork_handlers() noexcept;

// Copies text into buf (always terminated, truncated to fit); used for `why` and reasons.
inline void set_text(char *buf, size_t len, const char *text) noexcept {
  if (buf == nullptr || len == 0) return;
  snprintf(buf, len, "%s", text);
}

}  // namespace mrc::uffd::detail
