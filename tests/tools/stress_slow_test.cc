// A minute of mrcache-stress with the defaults (label slow; the 10-minute run of the issue is
// `mrcache-stress -d 10m`).
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
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
  EXPECT_EQ(summary["stale"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["errors"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["leak_count"].get<uint64_t>(), 0u);
  EXPECT_GT(summary["forks"].get<uint64_t>(), 0u) << "a minute at the default fork rate forks";
  unlink(json_path.c_str());
}

}  // namespace
