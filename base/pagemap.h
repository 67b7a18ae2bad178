// SPDX-License-Identifier: BSD-3-Clause
// Page frame numbers from /proc/self/pagemap, for MRC_FLAG_VERIFY_PFN.
//
// Since Linux 4.0 an unprivileged reader (without CAP_SYS_ADMIN) gets the present bit but a
// PFN of 0; available() detects that and explains it, and the cache then turns verification
// off instead of comparing zeros.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mrc::os::pagemap {

// Whether PFNs can be read here; otherwise `why` says why.
bool available(char *why, size_t why_len) noexcept;
// Reads the pagemap entry (present bit | PFN) of `pages` pages from `start`.
bool read(uintptr_t start, uint64_t *entries, size_t pages) noexcept;
// Whether the pages still map the recorded frames (a page that became absent does not match).
bool matches(uintptr_t start, const uint64_t *entries, size_t pages) noexcept;

}  // namespace mrc::os::pagemap
