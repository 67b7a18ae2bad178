// SPDX-License-Identifier: BSD-3-Clause
// A minute of mrcache-stress with the defaults (label slow; the 10-minute run of the issue is
// `mrcache-stress -d 10m`), and the proof that its churn threads reach the unmap window.
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "mrcache/mrcache.h"
#include "tests/tools/tools_test.h"

namespace {

TEST(StressToolSlow, OneMinuteWithTheDefaultsPasses) {
  const std::string json_path =
      testing::TempDir() + "mrc-tools-slow-" + std::to_string(getpid()) + ".json";
  const auto result =
      mrc_tools_test::run(std::string(MRC_STRESS_PATH) + " -d 60 -q --json " + json_path);
  EXPECT_EQ(result.status, 0) << result.output;
  const auto summary = mrc_tools_test::read_json(json_path);
  ASSERT_TRUE(summary.is_object()) << result.output;
  EXPECT_EQ(summary["mode"], "exact");
  EXPECT_EQ(summary["stale"].get<uint64_t>(), 0u) << summary["stale_reports"].dump();
  EXPECT_EQ(summary["stale_unmap_in_flight"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["errors"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["leak_count"].get<uint64_t>(), 0u);
  EXPECT_GT(summary["forks"].get<uint64_t>(), 0u) << "a minute at the default fork rate forks";
  unlink(json_path.c_str());
}

// Fast mode gives up gets concurrent with another thread's unmap of their memory. With the
// window counted (--strict-unmap-window), a run must therefore find such a hit and fail: else
// the churn threads no longer reach the window, and the exact runs prove less than they claim.
// Several per second on a two-core machine; the run stops at the first.
TEST(StressToolSlow, FastModeShowsTheUnmapWindow) {
  mrc_monitor_info_t info{};
  if (mrc_monitor_info(&info) == MRC_OK && info.mode == MRC_MONITOR_UNCACHED) {
    GTEST_SKIP() << "no userfaultfd here: nothing is cached, so there is no window";
  }
  const std::string json_path =
      testing::TempDir() + "mrc-tools-slow-window-" + std::to_string(getpid()) + ".json";
  // MRC_CACHE_CHURN=1: the churn threads' mappings cached every time (the cache would learn to
  // register most of them uncached, which has no window).
  const auto result = mrc_tools_test::run("MRC_CACHE_CHURN=1 " + std::string(MRC_STRESS_PATH) +
                                          " --fast --strict-unmap-window --churn 4 -d 60 -q "
                                          "--json " +
                                          json_path);
  EXPECT_EQ(result.status, 1) << result.output;
  const auto summary = mrc_tools_test::read_json(json_path);
  ASSERT_TRUE(summary.is_object()) << result.output;
  EXPECT_EQ(summary["mode"], "fast");
  EXPECT_TRUE(summary["stale_unmap_in_flight_counted"].get<bool>());
  const auto in_window = summary["stale_unmap_in_flight"].get<uint64_t>();
  EXPECT_GT(in_window, 0u) << "no in-window hit in fast mode: the churn threads miss the window";
  EXPECT_EQ(summary["stale"].get<uint64_t>(), in_window)
      << "a stale hit outside the window: " << summary["stale_reports"].dump();
  ASSERT_FALSE(summary["stale_reports"].empty());
  const std::string report = summary["stale_reports"][0].get<std::string>();
  EXPECT_NE(report.find("window"), std::string::npos) << report;
  unlink(json_path.c_str());
}

}  // namespace
