// SPDX-License-Identifier: BSD-3-Clause
// mrcache-stress and mrcache-info as a user runs them: short runs that must pass (in exact mode,
// the default, and in fast mode), a run with injected failures that must end cleanly, and a
// deliberately blind monitor that the oracle must catch in either mode (the proof that the oracle
// can fail).
#include <unistd.h>

#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "mrcache/mrcache.h"
#include "tests/tools/tools_test.h"

namespace {

using mrc_tools_test::read_json;
using mrc_tools_test::run;
using mrc_tools_test::run_into_full_stdout;

const std::string kStress = MRC_STRESS_PATH;
const std::string kInfo = MRC_INFO_PATH;

std::string temp_path(const std::string &name) {
  return testing::TempDir() + "mrc-tools-" + std::to_string(getpid()) + "-" + name;
}

bool monitor_uncached() {
  mrc_monitor_info_t info{};
  return mrc_monitor_info(&info) == MRC_OK && info.mode == MRC_MONITOR_UNCACHED;
}

TEST(StressTool, HelpExplainsTheToolAndItsOptions) {
  const auto result = run(kStress + " --help");
  EXPECT_EQ(result.status, 0) << result.output;
  for (const char *text : {"Usage:", "--duration", "--threads", "--backend", "--fail-rate",
                           "--json", "--seed", "oracle", "Exit status", "Examples", "--fast",
                           "--exact", "--churn", "--strict-unmap-window"}) {
    EXPECT_NE(result.output.find(text), std::string::npos) << "--help lacks " << text;
  }
}

TEST(StressTool, BadOptionsAreUsageErrors) {
  EXPECT_EQ(run(kStress + " --threads 0").status, 2);
  EXPECT_EQ(run(kStress + " --backend nosuch").status, 2);
  EXPECT_EQ(run(kStress + " --mix nosuch=1").status, 2);
  EXPECT_EQ(run(kStress + " --oracle iouring --backend null").status, 2);
  EXPECT_EQ(run(kStress + " --fast --exact").status, 2);
  EXPECT_EQ(run(kStress + " --churn 17").status, 2);
  EXPECT_EQ(run("MRC_MAX_BYTES=12q " + kStress + " -d 1").status, 2);
}

// Values CLI11 used to accept (NaN passes CLI::Range; "-1" wraps to 2^64-1 in a uint64_t;
// infinite mix weights; sizes the machine cannot map): each is a usage error (exit 2) that
// names its option, never a run (the short -d keeps a run that wrongly starts brief).
TEST(StressTool, BadNumbersAreUsageErrorsNamingTheOption) {
  const std::pair<const char *, const char *> cases[] = {
      {"--shared-fraction nan", "--shared-fraction"},
      {"--shared-fraction inf", "--shared-fraction"},
      {"--fail-rate nan", "--fail-rate"},
      {"--invalidate-rate nan", "--invalidate-rate"},
      {"--nest-rate nan", "--nest-rate"},
      {"--hot-rate -nan", "--hot-rate"},
      {"--fork-rate nan", "--fork-rate"},
      {"--progress-interval nan", "--progress-interval"},
      {"--mix remap=inf", "--mix"},
      {"--mix remap=nan", "--mix"},
      {"--mix remap=1e300,move=1e300", "--mix"},
      {"--seed -1", "--seed"},
      {"--seed 18446744073709551616", "--seed"},
      {"--max-regions -1", "--max-regions"},
      {"--max-bytes -1", "--max-bytes"},
      {"--max-unreleased -1", "--max-unreleased"},
      {"--churn-size -1", "--churn-size"},
      {"--min-size -1", "--min-size"},
      {"--max-size -1", "--max-size"},
      {"--max-size 15e", "--max-size"},
      {"--max-size 16777216t", "--max-size"},
      {"--max-size 2g", "--max-size"},  // io_uring: above the kernel's 1 GiB per buffer
      {"--mutate-pause -1", "--mutate-pause"},
      {"--threads 0x4", "--threads"},
      {"--gid-index -1", "--gid-index"},
  };
  for (const auto &[args, option] : cases) {
    const auto result = run(kStress + " -q -d 0.2 " + args);
    EXPECT_EQ(result.status, 2) << args << ":\n" << result.output;
    EXPECT_NE(result.output.find(option), std::string::npos)
        << args << ": the message does not name " << option << ":\n"
        << result.output;
    EXPECT_EQ(result.output.find("FAILED"), std::string::npos) << args << ":\n" << result.output;
  }
  // The limits themselves and unit sizes stay accepted.
  EXPECT_EQ(run(kStress + " -q -d 0.2 --seed 18446744073709551615 --max-regions 0 --min-size 4k "
                          "--max-size 1m --shared-fraction 1 --mix remap=1e6,move=0")
                .status,
            0);
}

// An empty --mix, an empty item in it, a mix that leaves the mutators nothing to do, and an empty
// --json FILE are usage errors naming the option: each used to run (without the mutations meant,
// or without the summary) and pass.
TEST(StressTool, EmptyMixOrJsonIsAUsageError) {
  const std::pair<const char *, const char *> cases[] = {
      {"--mix ''", "--mix"},
      {"--mix ,", "--mix"},
      {"--mix remap=1,", "--mix"},
      {"--mix ,remap=1", "--mix"},
      {"--mix remap=1,,move=1", "--mix"},
      {"--mix remap=0 --fork-rate 0", "--mix"},
      {"--json ''", "--json"},
  };
  for (const auto &[args, option] : cases) {
    const auto result = run(kStress + " -q -d 0.2 " + args);
    EXPECT_EQ(result.status, 2) << args << ":\n" << result.output;
    EXPECT_NE(result.output.find(option), std::string::npos)
        << args << ": the message does not name " << option << ":\n"
        << result.output;
    EXPECT_EQ(result.output.find("PASSED"), std::string::npos) << args << ":\n" << result.output;
  }
  // Forks alone, or no mutator at all, are still runs.
  EXPECT_EQ(run(kStress + " -q -d 0.2 --mix remap=0").status, 0);
  EXPECT_EQ(run(kStress + " -q -d 0.2 --mix remap=0 --fork-rate 0 -m 0").status, 0);
}

// An address-space limit too small for the run is named: exit 2 with RLIMIT_AS in the message,
// never FAILED (as if the cache broke), never std::terminate. Limits from too small to map the
// pool to too small for the threads' stacks.
TEST(StressTool, AddressSpaceLimitIsNamedNotAFailure) {
  for (const int kib : {40000, 60000, 100000}) {
    const auto result =
        run("ulimit -v " + std::to_string(kib) + " && exec " + kStress + " -q -d 1");
    if (result.status == 0) continue;  // the run fitted after all
    EXPECT_EQ(result.status, 2) << "ulimit -v " << kib << ":\n" << result.output;
    EXPECT_NE(result.output.find("RLIMIT_AS"), std::string::npos) << "ulimit -v " << kib << ":\n"
                                                                  << result.output;
    EXPECT_EQ(result.output.find("FAILED"), std::string::npos) << result.output;
  }
}

// Output that cannot be written is not a pass: the error is named on stderr and the exit status is
// 2, as for set-up (1 says the cache failed). The JSON summary's file likewise (exit 1, as
// before for a file that cannot be opened).
TEST(StressTool, UnwritableOutputIsAnError) {
  for (const char *args : {" --help", " -q -d 0.2", " -d 0.2"}) {
    const auto result = run_into_full_stdout(kStress + args);
    EXPECT_EQ(result.status, 2) << args << ": " << result.output;
    EXPECT_NE(result.output.find("mrcache-stress: cannot write standard output"), std::string::npos)
        << args << ": " << result.output;
  }
  const auto result = run(kStress + " -q -d 0.2 --json /dev/full");
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("cannot write /dev/full"), std::string::npos) << result.output;
}

// Memory refused in the middle of a run (the address-space limit lowered under the running
// program, below what it uses: every new mapping fails, fork children cannot set up their caches)
// is named too: RLIMIT_AS in the message, exit 2, never FAILED as if the cache broke.
TEST(StressTool, MemoryRefusedMidRunNamesTheAddressSpaceLimit) {
  if (run("command -v prlimit").status != 0) GTEST_SKIP() << "no prlimit (util-linux)";
  // In braces: run() sends the group's stderr, the background program's too, to the output.
  const auto result =
      run("{ " + kStress +
          " -q -d 4 --fork-rate 20 & pid=$!; sleep 1.5; "
          "vm=$(awk '/^VmSize/ {print $2}' /proc/$pid/status); "
          "[ -n \"$vm\" ] && prlimit --pid $pid --as=$(( (vm - 100000) * 1024 )); wait $pid; }");
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_NE(result.output.find("RLIMIT_AS"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("FAILED"), std::string::npos) << result.output;
}

// The main job, short: the defaults for five seconds, no stale use, no leak, no error.
TEST(StressTool, FiveSecondsWithTheDefaultsPass) {
  const std::string json_path = temp_path("default.json");
  const auto result = run(kStress + " -d 5 --json " + json_path);
  EXPECT_EQ(result.status, 0) << result.output;
  const auto summary = read_json(json_path);
  ASSERT_TRUE(summary.is_object()) << "no JSON summary; output:\n" << result.output;
  EXPECT_TRUE(summary["passed"].get<bool>());
  EXPECT_EQ(summary["stale"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["errors"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["leak_count"].get<uint64_t>(), 0u) << summary["leaks"].dump();
  EXPECT_GT(summary["ops"].get<uint64_t>(), 0u);
  EXPECT_GT(summary["checked_regions"].get<uint64_t>(), 0u) << "the oracle checked nothing";
  EXPECT_EQ(summary["backend"], "iouring");
  EXPECT_EQ(summary["oracle"], "iouring");
  EXPECT_EQ(summary["mode"], "exact");
  EXPECT_GT(summary["churned_mappings"].get<uint64_t>(), 0u) << "the churn threads did nothing";
  for (const char *key :
       {"seed", "monitor_mode", "duration_s", "hits", "misses", "invalidations",
        "injected_failures", "mutations", "figures", "cache_stats", "stale_unmap_in_flight"}) {
    EXPECT_TRUE(summary.contains(key)) << "the JSON summary lacks " << key;
  }
  EXPECT_NE(result.output.find("PASSED"), std::string::npos);
  EXPECT_NE(result.output.find("seed"), std::string::npos);
  unlink(json_path.c_str());
}

// Both modes, briefly, with twice the default churn threads (the window shows more often). Exact
// mode counts a stale hit in the unmap window like any other, so it passes only with none; its
// gets waited for unmaps in flight. Fast mode never probes, and the in-window hits it may show
// are reported but not counted: it passes too.
TEST(StressTool, ExactAndFastModesPassBriefly) {
  const bool cached = !monitor_uncached();
  const std::string exact_path = temp_path("exact.json");
  auto result = run(kStress + " -d 5 -q --churn 4 --json " + exact_path);
  EXPECT_EQ(result.status, 0) << result.output;
  auto summary = read_json(exact_path);
  ASSERT_TRUE(summary.is_object()) << result.output;
  EXPECT_EQ(summary["mode"], "exact");
  EXPECT_NE(result.output.find("exact mode"), std::string::npos) << result.output;
  EXPECT_EQ(summary["stale"].get<uint64_t>(), 0u) << summary["stale_reports"].dump();
  EXPECT_EQ(summary["stale_unmap_in_flight"].get<uint64_t>(), 0u);
  EXPECT_TRUE(summary["stale_unmap_in_flight_counted"].get<bool>());
  EXPECT_EQ(summary["errors"].get<uint64_t>(), 0u) << summary["error_samples"].dump();
  EXPECT_GT(summary["churned_mappings"].get<uint64_t>(), 0u);
  if (cached) {
    EXPECT_GT(summary["unmap_waits"].get<uint64_t>(), 0u)
        << "no get found another thread's unmap in flight: the churn threads miss the window";
  }
  unlink(exact_path.c_str());

  const std::string fast_path = temp_path("fast.json");
  result = run(kStress + " -d 5 -q --churn 4 --fast --json " + fast_path);
  EXPECT_EQ(result.status, 0) << result.output;
  summary = read_json(fast_path);
  ASSERT_TRUE(summary.is_object()) << result.output;
  EXPECT_EQ(summary["mode"], "fast");
  EXPECT_NE(result.output.find("fast mode"), std::string::npos) << result.output;
  EXPECT_TRUE(summary["passed"].get<bool>());
  EXPECT_EQ(summary["stale"].get<uint64_t>(), 0u) << summary["stale_reports"].dump();
  EXPECT_FALSE(summary["stale_unmap_in_flight_counted"].get<bool>());
  EXPECT_EQ(summary["errors"].get<uint64_t>(), 0u) << summary["error_samples"].dump();
  // Fast mode probes on misses only (before a registration), never on hits.
  EXPECT_LE(summary["unmap_waits"].get<uint64_t>(), summary["misses"].get<uint64_t>())
      << "fast mode waited for unmaps on hits";
  const auto in_window = summary["stale_unmap_in_flight"].get<uint64_t>();
  RecordProperty("fast_in_window_hits", std::to_string(in_window));
  if (in_window != 0) {
    EXPECT_FALSE(summary["in_window_reports"].empty());
    EXPECT_NE(result.output.find("not counted: fast mode"), std::string::npos) << result.output;
  }
  unlink(fast_path.c_str());
}

// Injected backend failures are counted, expected, and leave nothing behind.
TEST(StressTool, InjectedFailuresAreCountedAndTheRunEndsCleanly) {
  const std::string json_path = temp_path("fail.json");
  const auto result = run(kStress + " -d 5 -q --fail-rate 0.1 --json " + json_path);
  EXPECT_EQ(result.status, 0) << result.output;
  const auto summary = read_json(json_path);
  ASSERT_TRUE(summary.is_object()) << result.output;
  EXPECT_GT(summary["injected_failures"].get<uint64_t>(), 0u);
  EXPECT_GT(summary["injected_by_backend"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["errors"].get<uint64_t>(), 0u) << summary["error_samples"].dump();
  EXPECT_EQ(summary["leak_count"].get<uint64_t>(), 0u) << summary["leaks"].dump();
  EXPECT_EQ(summary["registrations"], summary["deregistrations"]);
  unlink(json_path.c_str());
}

TEST(StressTool, NullBackendWithInjectedFailures) {
  // The pfn oracle reads page frames, which /proc/self/pagemap shows to root only.
  const std::string oracle = geteuid() == 0 ? "" : " --oracle none";
  const std::string json_path = temp_path("null.json");
  const auto result =
      run(kStress + " -d 3 -q --backend null --fail-rate 0.1" + oracle + " --json " + json_path);
  EXPECT_EQ(result.status, 0) << result.output;
  const auto summary = read_json(json_path);
  ASSERT_TRUE(summary.is_object()) << result.output;
  EXPECT_GT(summary["injected_by_backend"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["leak_count"].get<uint64_t>(), 0u) << summary["leaks"].dump();
  unlink(json_path.c_str());
}

// The proof that the oracle can fail: with the monitor's test-only switch, events are read but
// never published, so the cache keeps handing out registrations of memory that is gone. The
// oracle must say so within seconds, and the run must fail; in fast mode too, whose tolerance
// of the unmap window must not hide stale hits outside it.
TEST(StressTool, OracleCatchesABlindMonitorWithinSeconds) {
  if (monitor_uncached()) {
    GTEST_SKIP() << "no userfaultfd here: nothing is cached, so a blind monitor cannot make "
                    "anything stale";
  }
  for (const std::string mode : {"exact", "fast"}) {
    SCOPED_TRACE(mode + " mode");
    const std::string json_path = temp_path("blind-" + mode + ".json");
    const auto result =
        run("MRC_TEST_DROP_EVENTS=1 " + kStress + " --" + mode + " -d 30 -q --json " + json_path);
    EXPECT_EQ(result.status, 1) << result.output;
    EXPECT_NE(result.output.find("STALE"), std::string::npos) << result.output;
    const auto summary = read_json(json_path);
    ASSERT_TRUE(summary.is_object()) << result.output;
    EXPECT_EQ(summary["mode"], mode);
    EXPECT_GT(summary["stale"].get<uint64_t>(), 0u);
    EXPECT_FALSE(summary["passed"].get<bool>());
    EXPECT_LT(summary["duration_s"].get<double>(), 10.0) << "caught, but not within seconds";
    ASSERT_FALSE(summary["stale_reports"].empty());
    const std::string report = summary["stale_reports"][0].get<std::string>();
    EXPECT_NE(report.find("seed"), std::string::npos) << report;
    unlink(json_path.c_str());
  }
}

// Without a terminal, progress comes as plain lines, not carriage returns.
TEST(StressTool, PlainProgressLinesWithoutATerminal) {
  const auto result = run(kStress + " -d 3 --slots 1 --progress-interval 1");
  EXPECT_EQ(result.output.find('\r'), std::string::npos);
  size_t lines = 0;
  for (size_t at = 0; (at = result.output.find("ops/s", at)) != std::string::npos; ++at) ++lines;
  EXPECT_GE(lines, 2u) << result.output;
}

TEST(InfoTool, PrintsTheMonitorModeAndTheConfiguration) {
  const auto result = run(kInfo);
  EXPECT_EQ(result.status, 0) << result.output;
  mrc_monitor_info_t info{};
  ASSERT_EQ(mrc_monitor_info(&info), MRC_OK);
  EXPECT_NE(result.output.find(std::string("mode       ") + info.mode_name), std::string::npos)
      << result.output;
  for (const char *text : {"MRC_MAX_REGIONS", "MRC_MAX_BYTES", "MRC_MAX_UNRELEASED",
                           "MRC_PURGE_ON_FORK", "MRC_MONITOR", "MRC_VERIFY_PFN", "MRC_LOG_LEVEL",
                           "MRC_STATS", "vm.max_map_count", "RLIMIT_MEMLOCK", "iouring", "verbs"}) {
    EXPECT_NE(result.output.find(text), std::string::npos) << "mrcache-info lacks " << text;
  }
}

TEST(InfoTool, ShowsEffectiveValuesWithUnitsAndRejectsBadOnes) {
  auto result = run("MRC_MAX_BYTES=64k MRC_MONITOR=off " + kInfo);
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("64 KiB"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("uncached"), std::string::npos) << result.output;
  result = run("MRC_MAX_BYTES=64q " + kInfo);
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("MRC_MAX_BYTES=64q"), std::string::npos) << result.output;
}

TEST(InfoTool, JsonHasEverySection) {
  const std::string json_path = temp_path("info.json");
  const auto result = run(kInfo + " --json > " + json_path);
  EXPECT_EQ(result.status, 0) << result.output;
  const auto info = read_json(json_path);
  ASSERT_TRUE(info.is_object());
  for (const char *key : {"version", "configuration", "monitor", "limits", "backends"}) {
    EXPECT_TRUE(info.contains(key)) << key;
  }
  EXPECT_EQ(info["configuration"].size(), 10u);
  bool churn_shown = false;
  for (const auto &var : info["configuration"])
    churn_shown |= var.value("name", "") == "MRC_CACHE_CHURN";
  EXPECT_TRUE(churn_shown) << info["configuration"].dump();
  EXPECT_TRUE(info["monitor"].contains("mode"));
  EXPECT_NE(info["monitor"].value("gets", "").find("exact"), std::string::npos)
      << "exact mode is the default";
  EXPECT_TRUE(info["backends"].contains("iouring"));
  unlink(json_path.c_str());
}

TEST(InfoTool, FullStandardOutputIsAnError) {
  for (const char *args : {"", " --json", " --help"}) {
    const auto result = run_into_full_stdout(kInfo + args);
    EXPECT_EQ(result.status, 1) << args << ": " << result.output;
    EXPECT_NE(result.output.find("mrcache-info: cannot write standard output: No space left"),
              std::string::npos)
        << args << ": " << result.output;
  }
}

TEST(InfoTool, Help) {
  const auto result = run(kInfo + " --help");
  EXPECT_EQ(result.status, 0);
  EXPECT_NE(result.output.find("--json"), std::string::npos);
}

}  // namespace
