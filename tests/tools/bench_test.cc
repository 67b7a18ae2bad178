// SPDX-License-Identifier: BSD-3-Clause
// mrcache-bench as a user runs it: Google Benchmark's flags are checked before any benchmark runs
// (values it would take on trust hang, abort, or print the usage and exit 0), a malformed MRC_*
// variable is named instead of an abort, a filter that matches nothing fails, and standard output
// that cannot be written is an error. Every run is bounded by timeout(1), so that a value that
// hangs fails the test instead of hanging it.
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tests/tools/tools_test.h"

namespace {

using mrc_tools_test::run;

const std::string kBench = "timeout 60 " + std::string(MRC_BENCH_PATH);
// A benchmark that needs nothing of the machine and takes nanoseconds.
const std::string kOne = " --benchmark_filter='^EpochGuard$'";

TEST(BenchTool, BadArgumentsAreUsageErrorsNamingTheFlag) {
  const std::pair<const char *, const char *> cases[] = {
      {"--benchmark_min_time=inf", "--benchmark_min_time"},
      {"--benchmark_min_time=nan", "--benchmark_min_time"},
      {"--benchmark_min_time=1e30", "--benchmark_min_time"},
      {"--benchmark_min_time=-1", "--benchmark_min_time"},
      {"--benchmark_min_time=", "--benchmark_min_time"},
      {"--benchmark_min_time=0.5s", "--benchmark_min_time"},
      {"--benchmark_min_time", "--benchmark_min_time"},
      {"--benchmark_min_warmup_time=nan", "--benchmark_min_warmup_time"},
      {"--benchmark_min_warmup_time=inf", "--benchmark_min_warmup_time"},
      {"--benchmark_repetitions=0", "--benchmark_repetitions"},
      {"--benchmark_repetitions=-1", "--benchmark_repetitions"},
      {"--benchmark_repetitions=x", "--benchmark_repetitions"},
      {"--benchmark_format=bogus", "--benchmark_format"},
      {"--benchmark_out_format=xml", "--benchmark_out_format"},
      {"--benchmark_color=", "--benchmark_color"},
      {"--benchmark_time_unit=ps", "--benchmark_time_unit"},
      {"--benchmark_out=", "--benchmark_out"},
      {"--benchmark_filter=", "--benchmark_filter"},
      {"--benchmark_list_tests=maybe", "--benchmark_list_tests"},
      {"--benchmark_counters_tabular=no", "--benchmark_counters_tabular"},
      {"--benchmark_context=novalue", "--benchmark_context"},
      {"--v=abc", "--v"},
      {"--benchmark_bogus=1", "--benchmark_bogus"},
      {"--benchmark_filter EpochGuard", "--benchmark_filter"},
      {"stray", "stray"},
      {"-h", "-h"},
  };
  for (const auto &[args, named] : cases) {
    const auto result = run(kBench + kOne + " " + args);
    EXPECT_EQ(result.status, 2) << args << ":\n" << result.output;
    EXPECT_NE(result.output.find("mrcache-bench: "), std::string::npos) << args << ":\n"
                                                                        << result.output;
    EXPECT_NE(result.output.find(named), std::string::npos) << args << ":\n" << result.output;
    EXPECT_EQ(result.output.find("EpochGuard "), std::string::npos)
        << args << ": a benchmark ran:\n"
        << result.output;
  }
  // The variables that set the flags' defaults are checked alike.
  const auto result = run("BENCHMARK_MIN_TIME=nan " + kBench + kOne);
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_NE(result.output.find("BENCHMARK_MIN_TIME=nan"), std::string::npos) << result.output;
}

TEST(BenchTool, GoodArgumentsRun) {
  auto result = run(kBench + kOne +
                    " --benchmark_min_time=0.01 --benchmark_repetitions=2"
                    " --benchmark_counters_tabular=true --benchmark_format=json"
                    " --benchmark_context=run=test");
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("\"EpochGuard\""), std::string::npos) << result.output;
  result = run(kBench + kOne + " --benchmark_list_tests");
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_EQ(result.output, "EpochGuard\n");
  result = run(kBench + " --help");
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("--benchmark_filter"), std::string::npos) << result.output;
}

// The cache benchmarks create caches: a malformed MRC_* variable made mrc_cache_create refuse
// and the benchmark abort. It is named up front instead.
TEST(BenchTool, MalformedMrcVariableIsAUsageError) {
  for (const char *variable : {"MRC_MONITOR=bogus", "MRC_MAX_BYTES=12q"}) {
    const auto result = run(std::string(variable) + " " + kBench +
                            " --benchmark_filter='^BM_CacheHit' --benchmark_min_time=0.01");
    EXPECT_EQ(result.status, 2) << variable << ":\n" << result.output;
    EXPECT_NE(result.output.find(variable), std::string::npos) << variable << ":\n"
                                                               << result.output;
  }
}

TEST(BenchTool, AFilterThatMatchesNothingFails) {
  for (const char *filter : {"'^nothing-is-called-this$'", "'('"}) {
    const auto result = run(kBench + " --benchmark_filter=" + filter);
    EXPECT_EQ(result.status, 1) << filter << ":\n" << result.output;
    EXPECT_NE(result.output.find("mrcache-bench: no benchmark ran"), std::string::npos)
        << filter << ":\n"
        << result.output;
  }
}

TEST(BenchTool, FullStandardOutputIsAnError) {
  const auto result =
      mrc_tools_test::run_into_full_stdout(kBench + kOne + " --benchmark_min_time=0.01");
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("mrcache-bench: cannot write standard output"), std::string::npos)
      << result.output;
}

}  // namespace
