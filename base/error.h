// SPDX-License-Identifier: BSD-3-Clause
// The calling thread's last error: one thread-local buffer for the whole library, the text that
// mrc_last_error() returns (and its older names mrc_backend_last_error(), mrc_seg_last_error()).
// Every component writes its cause here: the backends through backends::fail and
// mrc_backend_set_error, the segment code through seg::fail and seg::set_error (core/segment/
// internal/sys.h, which formats with fmt and stores the result here).
//
// SYNCHRONIZATION: the only state is the thread-local buffer; each thread reads and writes only
// its own. Nothing is shared.
#pragma once

#include <cstdarg>
#include <cstddef>

namespace mrc {

// Longer causes are truncated to kLastErrorSize - 1 characters.
inline constexpr std::size_t kLastErrorSize = 512;

// Formats (printf-style) the calling thread's last error.
void set_last_error(const char *format, ...) noexcept __attribute__((format(printf, 1, 2)));
void set_last_error_v(const char *format, std::va_list args) noexcept
    __attribute__((format(printf, 1, 0)));
// The last error becomes "" (what a call that succeeded leaves behind, where the API says so).
void clear_last_error() noexcept;
// Never NULL; "" when nothing failed on this thread. Valid until this thread's next error.
const char *last_error() noexcept;

}  // namespace mrc
