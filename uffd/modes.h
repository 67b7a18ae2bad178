// SPDX-License-Identifier: BSD-3-Clause
// The monitor modes' names: one table gives each mode its name (mrc_monitor_info_t::mode_name,
// the reasons the monitor writes) and the MRC_MONITOR value that asks for it.
#pragma once

#include <cstring>

#include "mrcache/mrcache.h"

namespace mrc::uffd::detail {

struct ModeSpelling {
  mrc_monitor_mode_t mode;
  const char *name;     // mrc_monitor_info_t::mode_name
  const char *setting;  // the MRC_MONITOR value that forces it
};

// Best first: the order negotiation tries them in, and the order MRC_MONITOR's help lists them.
// bpf is tried only when MRC_MONITOR asks for it (docs/DESIGN.md, "The eBPF monitor's mode").
inline constexpr ModeSpelling kModeSpellings[] = {
    {MRC_MONITOR_BPF, "bpf", "bpf"},
    {MRC_MONITOR_WP_ASYNC, "wp-async", "wp-async"},
    {MRC_MONITOR_WP, "wp", "wp"},
    {MRC_MONITOR_MISSING, "missing", "missing"},
    {MRC_MONITOR_UNCACHED, "uncached", "off"},
};

// MRC_MONITOR's value that lets negotiation choose (as does an empty or unset variable).
inline constexpr const char *kAutoModeSetting = "auto";

// A value outside the table is named as uncached.
inline const char *mode_name(mrc_monitor_mode_t mode) noexcept {
  for (const ModeSpelling &spelling : kModeSpellings) {
    if (spelling.mode == mode) return spelling.name;
  }
  return mode_name(MRC_MONITOR_UNCACHED);
}

// The mode an MRC_MONITOR value forces ("off": uncached). false if it names none (including
// "auto", which forces nothing).
inline bool parse_mode_setting(const char *value, mrc_monitor_mode_t *mode) noexcept {
  for (const ModeSpelling &spelling : kModeSpellings) {
    if (strcmp(value, spelling.setting) == 0) {
      *mode = spelling.mode;
      return true;
    }
  }
  return false;
}

}  // namespace mrc::uffd::detail
