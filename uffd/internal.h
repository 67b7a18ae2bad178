// Private plumbing between the files of uffd/ (not for other layers).
#pragma once

#include <cstddef>

#include "mrcache/mrcache.h"

namespace mrc::uffd::detail {

// Registers the pthread_atfork handlers (once), before the first subscription.
void ensure_fork_handlers() noexcept;

// Copies text into buf (always terminated, truncated to fit); used for `why` and reasons.
void set_text(char *buf, size_t len, const char *text) noexcept;

}  // namespace mrc::uffd::detail
