// SPDX-License-Identifier: BSD-3-Clause
// mrcache-appbench as a user runs it: bad arguments are usage errors, a short run measures every
// path and writes a report whose ratios follow from its raw figures, and a trial that runs too
// long is killed and reported instead of hanging the run.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tools/tools_test.h"

namespace {

using mrc_tools_test::read_json;
using mrc_tools_test::run;
using mrc_tools_test::run_into_full_stdout;

const std::string kAppbench = MRC_APPBENCH_PATH;

std::string temp_dir(const std::string &name) {
  const std::string dir =
      testing::TempDir() + "mrc-appbench-" + std::to_string(getpid()) + "-" + name;
  EXPECT_EQ(run("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").status, 0);
  return dir;
}

std::string slurp(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(AppbenchTool, BadArgumentsAreUsageErrorsNamingTheOption) {
  const std::pair<const char *, const char *> cases[] = {
      {"-r 0", "--repetitions"},       {"--min-time nan", "--min-time"},
      {"--min-time -1", "--min-time"}, {"--seed -1", "--seed"},
      {"--min-ops -1", "--min-ops"},   {"--timeout inf", "--timeout"},
      {"-p exact,bogus", "--paths"},   {"-e nosuch", "--engines"},
      {"-w '('", "--workloads"},       {"-w nomatch", "no workload matches"},
      {"-b sideways", "--binding"},    {"--workload fresh/1M", "--trial"},
  };
  for (const auto &[arguments, named] : cases) {
    const auto result = run(kAppbench + " " + arguments);
    EXPECT_EQ(result.status, 2) << arguments << ": " << result.output;
    EXPECT_NE(result.output.find(named), std::string::npos) << arguments << ": " << result.output;
  }
}

TEST(AppbenchTool, ListsTheApplicationWorkloads) {
  const auto result = run(kAppbench + " --list");
  ASSERT_EQ(result.status, 0) << result.output;
  for (const char *name :
       {"fresh/64K", "fresh/1M", "fresh/16M", "fresh-mmap/64K", "fresh-mmap/1M", "fresh-mmap/16M",
        "pool/64x64K", "pool-churn/other-arena", "pool-churn/same-arena", "halo/k1", "halo/k10",
        "halo/k100", "halo-mmap/k1", "halo-mmap/k10", "halo-mmap/k100", "pipeline/16Mx1M",
        "pipeline-mmap/16Mx1M"}) {
    EXPECT_NE(result.output.find(name), std::string::npos) << "--list lacks " << name;
  }
}

// Every path runs (UCX where this build has its module, else it is named as not run), both
// bindings, and the report's ratios are the medians of the per-repetition ratios of its figures.
TEST(AppbenchTool, AShortRunMeasuresEveryPathAndReportsRatiosOfItsFigures) {
  const std::string dir = temp_dir("short");
  const auto result = run(kAppbench +
                          " -w 'fresh-mmap/64K|^pool/' -e null -r 3 --min-time 0.005 --min-ops 2"
                          " -o '" +
                          dir + "'");
  ASSERT_EQ(result.status, 0) << result.output;
  const auto json = read_json(dir + "/app.json");
  ASSERT_TRUE(json.is_object()) << slurp(dir + "/app.json");
  ASSERT_EQ(json["groups"].size(), 4u);  // 2 workloads x (unbound, bound)
  std::vector<std::string> paths = {"exact", "fast", "none"};
#ifdef MRC_APPBENCH_HAVE_UCX
  paths.push_back("ucx");
#else
  EXPECT_TRUE(json["unavailable"].contains("null/ucx")) << json.dump();
#endif
  std::vector<int> cpus;
  for (const auto &group : json["groups"]) {
    cpus.push_back(group["cpu"].get<int>());
    for (const std::string &path : paths) {
      ASSERT_TRUE(group["ns"].contains(path)) << path << " in " << group.dump();
      ASSERT_EQ(group["ns"][path].size(), 3u);
      for (const auto &ns : group["ns"][path]) {
        ASSERT_TRUE(ns.is_number()) << path << " in " << group.dump();
        EXPECT_GT(ns.get<double>(), 0);
      }
    }
    std::vector<double> ratios;
    for (size_t rep = 0; rep < 3; ++rep) {
      ratios.push_back(group["ns"]["exact"][rep].get<double>() /
                       group["ns"]["none"][rep].get<double>());
    }
    std::sort(ratios.begin(), ratios.end());
    const auto &reported = group["ratios"]["exact/none"];
    EXPECT_DOUBLE_EQ(reported["median"].get<double>(), ratios[1]);
    EXPECT_DOUBLE_EQ(reported["min"].get<double>(), ratios[0]);
    EXPECT_DOUBLE_EQ(reported["max"].get<double>(), ratios[2]);
  }
  EXPECT_EQ(std::count(cpus.begin(), cpus.end(), -1), 2) << "two unbound groups";
  EXPECT_EQ(std::count_if(cpus.begin(), cpus.end(), [](int cpu) { return cpu >= 0; }), 2);
  const std::string table = slurp(dir + "/app.md");
  EXPECT_NE(table.find("| fresh-mmap/64K |"), std::string::npos) << table;
  EXPECT_NE(table.find("exact/UCX"), std::string::npos) << table;
  EXPECT_NE(table.find("### Goals"), std::string::npos) << table;
  for (const char *data : {"/app-null-unbound.dat", "/app-null-bound.dat"}) {
    EXPECT_NE(slurp(dir + data).find("\"pool/64x64K\""), std::string::npos) << data;
  }
}

// A malformed MRC_* variable refuses the run with the library's reason (exit 2, as a bad option),
// instead of running without mrcache's paths and exiting 0.
TEST(AppbenchTool, MalformedMrcVariableIsAUsageError) {
  for (const char *variable : {"MRC_MONITOR=bogus", "MRC_MAX_BYTES=12q", "MRC_STATS=maybe"}) {
    const auto result = run(std::string(variable) + " " + kAppbench +
                            " -w '^pool/' -e null -b unbound -r 1 --min-time 0.001");
    EXPECT_EQ(result.status, 2) << variable << ": " << result.output;
    EXPECT_NE(result.output.find(variable), std::string::npos) << variable << ": " << result.output;
    EXPECT_EQ(result.output.find("| pool/"), std::string::npos)
        << variable << ": " << result.output;
  }
}

// A report that cannot be written is a failure, named: standard output, and each file of -o.
TEST(AppbenchTool, UnwritableOutputIsAnError) {
  for (const char *args : {" --list", " --help"}) {
    const auto result = run_into_full_stdout(kAppbench + args);
    EXPECT_EQ(result.status, 1) << args << ": " << result.output;
    EXPECT_NE(result.output.find("mrcache-appbench: cannot write standard output"),
              std::string::npos)
        << args << ": " << result.output;
  }
  const std::string brief = " -w '^pool/' -p none -e null -b unbound -r 1 --min-time 0.001";
  auto result = run_into_full_stdout(kAppbench + brief);
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("cannot write standard output"), std::string::npos) << result.output;
  for (const char *file : {"app.md", "app.json", "app-null-unbound.dat"}) {
    const std::string dir = temp_dir(std::string("full-") + file);
    ASSERT_EQ(symlink("/dev/full", (dir + "/" + file).c_str()), 0);
    result = run(kAppbench + brief + " -o '" + dir + "'");
    EXPECT_EQ(result.status, 1) << file << ": " << result.output;
    EXPECT_NE(result.output.find("cannot write " + dir + "/" + file), std::string::npos)
        << file << ": " << result.output;
  }
}

TEST(AppbenchTool, ATrialThatRunsTooLongIsKilledAndReported) {
  const auto result =
      run(kAppbench + " -w '^pool/' -p none -e null -b unbound -r 1 --min-time 30 --timeout 1");
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("FAILED"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("still running after 1 s"), std::string::npos) << result.output;
}

}  // namespace
