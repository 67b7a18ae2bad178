// SPDX-License-Identifier: BSD-3-Clause
// A cheap, monotonic count of CPU ticks, for comparing costs measured in one process: the
// churn learner weighs a registration's cost against a watch's and an unmap's round trip to
// the monitor (docs/DESIGN.md, "Churn"). Never converted to time, never compared across
// processes: the tick rate differs between machines, and only ratios of ticks are used.
#pragma once

#include <time.h>

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace mrc::os {

inline uint64_t ticks() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();  // constant-rate on every CPU this runs on; a few cycles, no syscall
#elif defined(__aarch64__)
  uint64_t value;
  asm volatile("mrs %0, cntvct_el0" : "=r"(value));
  return value;
#else
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
#endif
}

// A tick count that fits a 32-bit field: longer costs (over a second) all weigh the same.
inline uint32_t saturated_ticks(uint64_t ticks) noexcept {
  return ticks > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(ticks);
}

}  // namespace mrc::os
