// SPDX-License-Identifier: BSD-3-Clause
// Configuration from MRC_* environment variables: sizes with units, booleans, counts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::config {

// "4096", "64k", "1m", "1g", "2t", "inf" (SIZE_MAX); case-insensitive; optional "b"/"ib" suffix.
[[nodiscard]] bool parse_size(const char *text, size_t *out) noexcept;
// "1|0|yes|no|true|false|on|off|y|n".
[[nodiscard]] bool parse_bool(const char *text, bool *out) noexcept;

// Applies every MRC_* variable that names a cache parameter, and checks those a cache obeys
// otherwise (MRC_MONITOR, MRC_LOG_LEVEL, MRC_STATS). On a malformed value the params are left as
// they were for that variable and errbuf names every malformed variable with its value
// ("A=x is not ...; B=y is not ..."); MRC_ERR_INVALID.
[[nodiscard]] mrc_status_t apply_environment(mrc_cache_params_t *params, char *errbuf,
                                             size_t errlen) noexcept;

// MRC_STATS: print statistics at destroy.
bool stats_at_destroy() noexcept;

}  // namespace mrc::config
