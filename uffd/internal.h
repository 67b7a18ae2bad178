// Private plumbing between the files of uffd/ (not for other layers).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::uffd::detail {

// maps.cc: the /proc/self/maps descriptors across fork (called by monitor.cc's atfork handlers,
// after the registry mutex in prepare, before it in parent/child).
void maps_prepare_fork() noexcept;
void maps_parent_after_fork() noexcept;
void maps_child_after_fork() noexcept;

// Registers the pthread_atfork handlers (once): before the first subscription, and before the
// first /proc/self/maps descriptor is kept open.
void ensure_fork_handlers() noexcept;

// Copies text into buf (always terminated, truncated to fit); used for `why` and reasons.
void set_text(char *buf, size_t len, const char *text) noexcept;

}  // namespace mrc::uffd::detail
