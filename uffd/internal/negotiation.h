// SPDX-License-Identifier: BSD-3-Clause
// Negotiation, private to uffd/: which userfaultfd mode the kernel and the sandbox allow (and
// MRC_MONITOR asks for), and the unmap probe that tells whether changes of watched memory are in
// flight (probe.h). Called under the registry mutex (monitor_state.h).
#pragma once

#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "mrcache/mrcache.h"
#include "uffd/internal/probe.h"

namespace mrc::uffd::detail {

// Appends formatted text to a fixed buffer, truncating silently.
struct Text {
  char *buf;
  size_t len;
  size_t used = 0;
  // Drops a trailing "; " separator.
  const char *trimmed() noexcept {
    if (used >= 2 && buf[used - 2] == ';' && buf[used - 1] == ' ') buf[used -= 2] = '\0';
    return buf;
  }
  void add(const char *format, ...) noexcept __attribute__((format(printf, 2, 3))) {
    if (used + 1 >= len) return;
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(buf + used, len - used, format, args);
    va_end(args);
    if (n > 0) used = std::min(len - 1, used + static_cast<size_t>(n));
  }
};

struct Negotiated {
  mrc_monitor_mode_t mode = MRC_MONITOR_UNCACHED;
  int fd = -1;
  uint64_t features = 0;
  uint64_t register_mode = 0;
  bool unavailable = false;  // uncached because the kernel or the sandbox refused
  bool probe_ok = false;     // the unmap probe answers (exact gets can trust the table)
};

// Chooses the best userfaultfd mode allowed by MRC_MONITOR, the kernel and the sandbox; writes
// why. MRC_MONITOR=bpf counts as auto here: the eBPF monitor is tried before (monitor.cc).
Negotiated negotiate(char *reason, size_t reason_len) noexcept;
// Whether MRC_MONITOR asks for the eBPF monitor; whether it leaves the choice to us (auto,
// unset, or a value not understood).
bool bpf_wanted() noexcept;
bool auto_wanted() noexcept;

}  // namespace mrc::uffd::detail
