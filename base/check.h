// SPDX-License-Identifier: BSD-3-Clause
// The two tiers of internal checks shared by every library layer.
//
// MRC_CHECK(cond):   always on; a broken invariant that would corrupt memory or registrations
//                    if execution went on. Aborts with the location.
// MRC_DASSERT(cond): debug builds only (NDEBUG unset); for checks too costly for hot paths.
//
// Expected failures (bad input, a full table, a kernel without a feature) are never checked
// here: they are mrc_status_t values.
#pragma once

namespace mrc::detail {
[[noreturn]] void check_failed(const char *expr, const char *file, int line,
                               const char *func) noexcept;
}  // namespace mrc::detail

#define MRC_CHECK(cond)                                                 \
  do {                                                                  \
    if (__builtin_expect(!(cond), 0))                                   \
      ::mrc::detail::check_failed(#cond, __FILE__, __LINE__, __func__); \
  } while (0)

#ifdef NDEBUG
#define MRC_DASSERT(cond) \
  do {                    \
    (void)sizeof(cond);   \
  } while (0)
#else
#define MRC_DASSERT(cond) MRC_CHECK(cond)
#endif
