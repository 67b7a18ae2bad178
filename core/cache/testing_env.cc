// SPDX-License-Identifier: BSD-3-Clause
// Test switches of the cache from the environment, for test programs and tools only: like
// uffd/testing_env.cc, this file is not part of libmrcache (CMakeLists.txt adds it to the
// programs that link mrcache_internal), so the installed library honours no test switch.
//
//   MRC_TEST_PARK_WINDOW=N   a put that replaces a slot of its full parking line spins N
//                            iterations between reading the line and choosing what to replace
//                            (testing::set_park_window_spins): the soak's hot runs use it to meet
//                            a reclaimer emptying that line within seconds, not by chance.
//
// SYNCHRONIZATION: set once during static initialisation.
#include <cstdlib>

#include "core/cache/testing.h"

namespace {

[[maybe_unused]] const bool g_installed = [] {
  const char *value = std::getenv("MRC_TEST_PARK_WINDOW");  // NOLINT(concurrency-mt-unsafe)
  if (value == nullptr) return false;
  char *end = nullptr;
  const unsigned long spins = std::strtoul(value, &end, 10);
  if (*value != '\0' && *end == '\0' && spins <= 1000000) {
    mrc::cache::testing::set_park_window_spins(static_cast<uint32_t>(spins));
  }
  return true;
}();

}  // namespace
