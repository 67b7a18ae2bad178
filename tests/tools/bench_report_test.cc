// SPDX-License-Identifier: BSD-3-Clause
// mrcache-bench-report on a small Google Benchmark JSON: the pairing convention, the ratios,
// medians of repetitions, and the plot data.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/tools/tools_test.h"

namespace {

constexpr const char *kFixture = R"({
  "context": {"date": "2026-01-01T00:00:00", "host_name": "test", "num_cpus": 2,
              "mhz_per_cpu": 3000, "library_build_type": "release", "load_avg": [0.5, 0.4, 0.3]},
  "benchmarks": [
    {"name": "PgtLookup/ours/dense/1000", "run_name": "PgtLookup/ours/dense/1000",
     "run_type": "iteration", "threads": 1, "iterations": 100, "real_time": 10.0,
     "cpu_time": 10.0, "time_unit": "ns", "B/region": 24.0},
    {"name": "PgtLookup/ucx/dense/1000", "run_name": "PgtLookup/ucx/dense/1000",
     "run_type": "iteration", "threads": 1, "iterations": 100, "real_time": 40.0,
     "cpu_time": 40.0, "time_unit": "ns", "B/region": 96.0},
    {"name": "PgtLookup/ours/dense/1000000", "run_name": "PgtLookup/ours/dense/1000000",
     "run_type": "iteration", "threads": 1, "iterations": 100, "real_time": 0.02,
     "cpu_time": 0.02, "time_unit": "us"},
    {"name": "BM_CacheHit/shared:0/real_time/threads:2",
     "run_name": "BM_CacheHit/shared:0/real_time/threads:2", "run_type": "aggregate",
     "aggregate_name": "mean", "threads": 2, "real_time": 999.0, "time_unit": "ns"},
    {"name": "BM_CacheHit/shared:0/real_time/threads:2_median",
     "run_name": "BM_CacheHit/shared:0/real_time/threads:2", "run_type": "aggregate",
     "aggregate_name": "median", "threads": 2, "real_time": 20.0, "time_unit": "ns",
     "items_per_second": 1.0e8},
    {"name": "BM_UcxRcacheHit/shared:0/real_time/threads:2_median",
     "run_name": "BM_UcxRcacheHit/shared:0/real_time/threads:2", "run_type": "aggregate",
     "aggregate_name": "median", "threads": 2, "real_time": 200.0, "time_unit": "ns",
     "items_per_second": 1.0e7},
    {"name": "BM_BackendNullRegDereg/0", "run_name": "BM_BackendNullRegDereg/0",
     "run_type": "iteration", "threads": 1, "iterations": 10, "real_time": 5.0,
     "time_unit": "ns", "label": "no context"}
  ]
})";

std::string slurp(const std::string &path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(BenchReport, PairsOursWithUcxAndWritesPlotData) {
  const std::string dir = testing::TempDir() + "mrc-bench-report-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/bench.json") << kFixture;
  const auto result =
      mrc_tools_test::run(std::string(MRC_BENCH_REPORT_PATH) + " " + dir + "/bench.json " + dir);
  ASSERT_EQ(result.status, 0) << result.output;
  for (const char *flag :
       {"plot_lookup_mrcache=1", "plot_lookup_ucx=1", "plot_hits_mrcache=1", "plot_hits_ucx=1"}) {
    EXPECT_NE(result.output.find(flag), std::string::npos) << result.output;
  }

  const std::string md = slurp(dir + "/results.md");
  // "ours" <-> "ucx" path component; time and the B/region counter both compared.
  EXPECT_NE(
      md.find("| PgtLookup/ours/dense/1000 | 10.0 ns | 40.0 ns | 0.25 | B/region 24 vs 96 (0.25)"),
      std::string::npos)
      << md;
  // BM_Cache<Work> <-> BM_UcxRcache<Work>, the median of the repetitions (not the mean).
  EXPECT_NE(md.find("| BM_CacheHit/shared:0/real_time/threads:2 | 20.0 ns | 200.0 ns | 0.10 |"),
            std::string::npos)
      << md;
  EXPECT_EQ(md.find("999"), std::string::npos) << "the mean was used instead of the median";
  // Unpaired figures are listed too.
  EXPECT_NE(md.find("BM_BackendNullRegDereg/0"), std::string::npos);
  EXPECT_NE(md.find("no context"), std::string::npos);

  // One data file per implementation, one block per series.
  const std::string lookup = slurp(dir + "/lookup-mrcache.dat");
  EXPECT_EQ(lookup, "\"mrcache dense\"\n1000 10\n1e+06 20\n") << lookup;
  EXPECT_EQ(slurp(dir + "/lookup-ucx.dat"), "\"UCX dense\"\n1000 40\n");
  EXPECT_EQ(slurp(dir + "/hits-mrcache.dat"), "\"mrcache, a region per thread\"\n2 100\n");
  EXPECT_EQ(slurp(dir + "/hits-ucx.dat"), "\"UCX, a region per thread\"\n2 10\n");

  for (const char *file : {"bench.json", "results.md", "lookup-mrcache.dat", "lookup-ucx.dat",
                           "hits-mrcache.dat", "hits-ucx.dat"}) {
    unlink((dir + "/" + file).c_str());
  }
  rmdir(dir.c_str());
}

// A new mapping's first get against UCX's miss: a goal row per case, met or not.
TEST(BenchReport, JudgesTheFirstGetOfANewMappingAgainstUcxsMiss) {
  const std::string dir = testing::TempDir() + "mrc-bench-first-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  auto figure = [](const char *name, double ns) {
    return std::string(R"({"name": ")") + name + R"(", "run_name": ")" + name +
           R"(", "run_type": "iteration", "threads": 1, "real_time": )" + std::to_string(ns) +
           R"(, "time_unit": "ns"})";
  };
  std::ofstream(dir + "/bench.json")
      << R"({"context": {}, "benchmarks": [)" << figure("BM_CacheMissNewMapping/exact", 3600) << ","
      << figure("BM_UcxRcacheMissNewMapping", 200) << ","
      << figure("BM_CacheMissChurning/exact/manual_time", 190) << ","
      << figure("BM_UcxRcacheMissChurning/manual_time", 320) << "]}";
  const auto result =
      mrc_tools_test::run(std::string(MRC_BENCH_REPORT_PATH) + " " + dir + "/bench.json " + dir);
  ASSERT_EQ(result.status, 0) << result.output;
  const std::string md = slurp(dir + "/results.md");
  EXPECT_NE(md.find("| first get of a mapping never seen <= 2 x UCX's miss | exact 3.60 us, UCX "
                    "200.0 ns | 18.00 | NO |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| get of a buffer re-mapped per message <= 2 x UCX's miss | exact 190.0 ns, "
                    "UCX 320.0 ns | 0.59 | yes |"),
            std::string::npos)
      << md;
  for (const char *file : {"bench.json", "results.md", "lookup-mrcache.dat", "lookup-ucx.dat",
                           "hits-mrcache.dat", "hits-ucx.dat"}) {
    unlink((dir + "/" + file).c_str());
  }
  rmdir(dir.c_str());
}

// bench.sh runs the monitor's benchmarks in a process of their own: two files, one report.
TEST(BenchReport, MergesSeveralRuns) {
  const std::string dir = testing::TempDir() + "mrc-bench-merge-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/a.json") << kFixture;
  std::ofstream(dir + "/b.json") << R"({"context": {}, "benchmarks": [
    {"name": "BM_MonitorRoundTrip/0", "run_name": "BM_MonitorRoundTrip/0",
     "run_type": "iteration", "threads": 1, "real_time": 13.0, "time_unit": "us",
     "median_us": 12.5}]})";
  const auto result = mrc_tools_test::run(std::string(MRC_BENCH_REPORT_PATH) + " " + dir +
                                          "/a.json " + dir + "/b.json " + dir);
  ASSERT_EQ(result.status, 0) << result.output;
  const std::string md = slurp(dir + "/results.md");
  EXPECT_NE(md.find("| BM_MonitorRoundTrip/0 | 13.00 us |"), std::string::npos) << md;
  EXPECT_NE(md.find("median_us 12.50"), std::string::npos) << md;
  EXPECT_NE(md.find("PgtLookup/ours/dense/1000"), std::string::npos) << md;
  for (const char *file : {"a.json", "b.json", "results.md", "lookup-mrcache.dat", "lookup-ucx.dat",
                           "hits-mrcache.dat", "hits-ucx.dat"}) {
    unlink((dir + "/" + file).c_str());
  }
  rmdir(dir.c_str());
}

// A report that cannot be written is a failure, named: standard output (scripts/bench.sh reads
// the plot flags there) and each file of OUT_DIR.
TEST(BenchReport, UnwritableOutputIsAnError) {
  const std::string dir = testing::TempDir() + "mrc-bench-report-full-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/bench.json") << kFixture;
  const std::string report = std::string(MRC_BENCH_REPORT_PATH) + " " + dir + "/bench.json " + dir;
  auto result = mrc_tools_test::run_into_full_stdout(report);
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("mrcache-bench-report: cannot write standard output"),
            std::string::npos)
      << result.output;
  for (const char *file : {"results.md", "lookup-mrcache.dat", "hits-ucx.dat"}) {
    const std::string path = dir + "/" + file;
    unlink(path.c_str());
    ASSERT_EQ(symlink("/dev/full", path.c_str()), 0);
    result = mrc_tools_test::run(report);
    EXPECT_EQ(result.status, 1) << file << ": " << result.output;
    EXPECT_NE(result.output.find("cannot write " + path), std::string::npos)
        << file << ": " << result.output;
    unlink(path.c_str());
  }
  for (const char *file : {"bench.json", "results.md", "lookup-mrcache.dat", "lookup-ucx.dat",
                           "hits-mrcache.dat", "hits-ucx.dat"}) {
    unlink((dir + "/" + file).c_str());
  }
  rmdir(dir.c_str());
}

TEST(BenchReport, UsageErrorWithoutArguments) {
  const auto result = mrc_tools_test::run(MRC_BENCH_REPORT_PATH);
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.output.find("usage"), std::string::npos);
}

}  // namespace
