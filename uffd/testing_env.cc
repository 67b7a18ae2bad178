// SPDX-License-Identifier: BSD-3-Clause
// Test switches from the environment, for test programs and tools only: this file is not part
// of libmrcache (CMakeLists.txt adds it to the programs that link mrcache_internal), so the
// installed library honours no test switch, whatever the environment says.
//
//   MRC_TEST_DROP_EVENTS=1   the monitor reads and counts events but publishes none
//                            (testing::set_drop_events): a deliberately blind cache, with which
//                            the stress harness and the oracle tests prove they catch stale
//                            registrations. Read at each monitor start, like MRC_MONITOR.
//
// SYNCHRONIZATION: set once during static initialisation; the monitor calls the function under
// its registry mutex.
#include <cstdlib>
#include <cstring>

#include "uffd/testing.h"

namespace {

bool drop_events_wanted() {
  const char *value = std::getenv("MRC_TEST_DROP_EVENTS");  // NOLINT(concurrency-mt-unsafe)
  return value != nullptr && std::strcmp(value, "1") == 0;
}

[[maybe_unused]] const bool g_installed = [] {
  mrc::uffd::testing::set_drop_events(&drop_events_wanted);
  return true;
}();

}  // namespace
