// SPDX-License-Identifier: BSD-3-Clause
#include "core/cache/config.h"

#include <strings.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/cache/log.h"
#include "uffd/modes.h"

namespace mrc::config {

bool parse_size(const char *text, size_t *out) noexcept {
  if (text == nullptr) return false;
  while (std::isspace(static_cast<unsigned char>(*text))) ++text;
  if (strcasecmp(text, "inf") == 0 || strcasecmp(text, "unlimited") == 0) {
    *out = std::numeric_limits<size_t>::max();
    return true;
  }
  if (!std::isdigit(static_cast<unsigned char>(*text))) return false;
  errno = 0;
  char *end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0) return false;
  unsigned shift = 0;
  switch (std::tolower(static_cast<unsigned char>(*end))) {
    case 'k':
      shift = 10;
      ++end;
      break;
    case 'm':
      shift = 20;
      ++end;
      break;
    case 'g':
      shift = 30;
      ++end;
      break;
    case 't':
      shift = 40;
      ++end;
      break;
    default: break;
  }
  if (shift != 0 && std::tolower(static_cast<unsigned char>(*end)) == 'i') ++end;
  if (std::tolower(static_cast<unsigned char>(*end)) == 'b') ++end;
  while (std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (*end != '\0') return false;
  if (shift != 0 && value > (std::numeric_limits<unsigned long long>::max() >> shift)) return false;
  value <<= shift;
  if (value > std::numeric_limits<size_t>::max()) return false;
  *out = static_cast<size_t>(value);
  return true;
}

bool parse_bool(const char *text, bool *out) noexcept {
  static constexpr const char *kTrue[] = {"1", "yes", "true", "on", "y"};
  static constexpr const char *kFalse[] = {"0", "no", "false", "off", "n"};
  for (const char *word : kTrue) {
    if (strcasecmp(text, word) == 0) return (*out = true);
  }
  for (const char *word : kFalse) {
    if (strcasecmp(text, word) == 0) {
      *out = false;
      return true;
    }
  }
  return false;
}

namespace {

const char *env(const char *name) noexcept {
  const char *value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): no setenv here
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

// Every malformed variable is reported, not only the last: "A=x is not ...; B=y is not ...".
mrc_status_t bad(char *errbuf, size_t errlen, const char *name, const char *value,
                 const char *expected) noexcept {
  if (errbuf != nullptr && errlen > 0) {
    const size_t used = strnlen(errbuf, errlen);
    if (used + 1 < errlen) {
      std::snprintf(errbuf + used, errlen - used, "%s%s=%s is not %s", used != 0 ? "; " : "", name,
                    value, expected);
    }
  }
  return MRC_ERR_INVALID;
}

}  // namespace

mrc_status_t apply_environment(mrc_cache_params_t *params, char *errbuf, size_t errlen) noexcept {
  struct SizeVar {
    const char *name;
    size_t *field;
  };
  const SizeVar sizes[] = {{"MRC_MAX_REGIONS", &params->max_regions},
                           {"MRC_MAX_BYTES", &params->max_bytes},
                           {"MRC_MAX_UNRELEASED", &params->max_unreleased}};
  mrc_status_t status = MRC_OK;
  if (errbuf != nullptr && errlen > 0) errbuf[0] = '\0';
  for (const SizeVar &var : sizes) {
    const char *value = env(var.name);
    if (value == nullptr) continue;
    size_t parsed = 0;
    if (!parse_size(value, &parsed)) {
      status = bad(errbuf, errlen, var.name, value, "a size (4096, 64k, 1g, inf)");
      continue;
    }
    *var.field = parsed == std::numeric_limits<size_t>::max() ? 0 : parsed;  // inf = unlimited
  }
  struct FlagVar {
    const char *name;
    unsigned flag;
  };
  const FlagVar flag_vars[] = {{"MRC_PURGE_ON_FORK", MRC_FLAG_PURGE_ON_FORK},
                               {"MRC_ORDERED_UNMAPS", MRC_FLAG_ORDERED_UNMAPS},
                               {"MRC_CACHE_CHURN", MRC_FLAG_CACHE_CHURN}};
  for (const FlagVar &var : flag_vars) {
    const char *value = env(var.name);
    if (value == nullptr) continue;
    bool on = false;
    if (!parse_bool(value, &on)) {
      status = bad(errbuf, errlen, var.name, value, "a boolean (0/1, yes/no)");
    } else if (on) {
      params->flags |= var.flag;
    } else {
      params->flags &= ~var.flag;
    }
  }
  // MRC_VERIFY_PFN=N: check N pages per hit (0 = off; "yes" = 1 page).
  if (const char *value = env("MRC_VERIFY_PFN")) {
    size_t pages = 0;
    bool on = false;
    bool understood = true;
    if (parse_size(value, &pages) && pages != std::numeric_limits<size_t>::max()) {
      on = pages != 0;
    } else if (parse_bool(value, &on)) {
      pages = on ? 1 : 0;
    } else {
      status = bad(errbuf, errlen, "MRC_VERIFY_PFN", value, "a page count or a boolean");
      understood = false;
    }
    if (understood && on) {
      params->flags |= MRC_FLAG_VERIFY_PFN;
      params->verify_pfn_pages = pages;
    } else if (understood) {
      params->flags &= ~static_cast<unsigned>(MRC_FLAG_VERIFY_PFN);
    }
  }
  // Variables that are no cache parameter but that a cache created now obeys (the monitor's mode,
  // the log level, statistics at destroy): a malformed one is reported here too, so that
  // mrc_cache_params_init_checked and mrcache-info name it instead of a silent default.
  if (const char *value = env("MRC_MONITOR")) {
    mrc_monitor_mode_t mode = MRC_MONITOR_UNCACHED;
    if (std::strcmp(value, uffd::detail::kAutoModeSetting) != 0 &&
        !uffd::detail::parse_mode_setting(value, &mode)) {
      status = bad(errbuf, errlen, "MRC_MONITOR", value,
                   "a mode (auto, bpf, wp-async, wp, missing, off)");
    }
  }
  if (const char *value = env("MRC_LOG_LEVEL")) {
    mrc_log_level_t level = MRC_LOG_WARN;
    if (!log::parse_level(value, &level)) {
      status =
          bad(errbuf, errlen, "MRC_LOG_LEVEL", value, "a level (error, warn, info, debug, trace)");
    }
  }
  if (const char *value = env("MRC_STATS")) {
    bool on = false;
    if (!parse_bool(value, &on))
      status = bad(errbuf, errlen, "MRC_STATS", value, "a boolean (0/1, yes/no)");
  }
  return status;
}

bool stats_at_destroy() noexcept {
  const char *value = env("MRC_STATS");
  bool on = false;
  return value != nullptr && parse_bool(value, &on) && on;
}

}  // namespace mrc::config
