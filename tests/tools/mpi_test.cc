// SPDX-License-Identifier: BSD-3-Clause
// mrcache-mpi as a user runs it, without an RDMA device or mpirun: bad arguments are usage
// errors that name the option (checked before MPI starts), and `report` turns bench output into
// medians and ratios that follow from the raw figures. The runs across nodes are the rxe-pair
// lane's (scripts/rxe/pair-tests.sh).
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tools/tools_test.h"

namespace {

using mrc_tools_test::run;

const std::string kMpi = MRC_MPI_PATH;

std::string temp_file(const std::string &name, const std::string &text) {
  const std::string path = testing::TempDir() + "mrc-mpi-" + std::to_string(getpid()) + "-" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(MpiTool, BadArgumentsAreUsageErrorsNamingTheOption) {
  const std::pair<const char *, const char *> cases[] = {
      {"", "subcommand"},
      {"stress --path bogus", "--path"},
      {"stress --slots 0", "--slots"},
      {"stress --mutate 2", "--mutate"},
      {"stress --seconds nan", "--seconds"},
      {"stress --probes 9", "--probes"},
      {"stress --probes -1", "--probes"},
      {"stress --mutations fork,bogus", "--mutations"},
      {"stress --mutations ''", "--mutations"},
      {"stress --gid-index -1", "--gid-index"},
      {"bench --k 0", "--k"},
      {"bench --k 1,,inf", "--k"},
      {"bench --sizes 4", "--sizes"},
      {"bench --sizes 32m", "--sizes"},
      {"bench --messages 7", "--messages"},
      {"report", "files"},
  };
  for (const auto &[arguments, named] : cases) {
    const auto result = run(kMpi + " " + arguments);
    EXPECT_EQ(result.status, 2) << arguments << ": " << result.output;
    EXPECT_NE(result.output.find(named), std::string::npos) << arguments << ": " << result.output;
  }
}

TEST(MpiTool, ReportGivesMediansAndTheirRatios) {
  // Three repetitions per path at one size and k, as bench prints them (one line is from a
  // --json file: no prefix), plus noise that is not a result.
  std::string text = "mrcache-mpi bench: path exact\n";
  const double exact[] = {10, 30, 20}, none[] = {40, 40, 100}, ucx[] = {25, 5, 25};
  for (int rep = 0; rep < 3; ++rep) {
    for (const auto &[path, us] : {std::pair{"exact", exact[rep]}, std::pair{"none", none[rep]},
                                   std::pair{"ucx", ucx[rep]}}) {
      text += std::string(rep == 1 ? "" : "MRCMPI-BENCH ") + R"({"path":")" + path +
              R"(","size":4096,"k":"inf","messages":16,"us_per_msg":)" + std::to_string(us) +
              R"(,"reg_us":1.5,"xfer_us":0,"ranks":2,"nodes":2,"rep":)" + std::to_string(rep) +
              "}\n";
    }
  }
  const auto result = run(kMpi + " report " + temp_file("bench.txt", text));
  ASSERT_EQ(result.status, 0) << result.output;
  // Medians: exact 20, none 40, ucx 25; fast absent. Ratios exact/none 0.50, exact/ucx 0.80.
  // Registration: 1.5 on every path.
  EXPECT_NE(result.output.find("| 2 | 4096 | inf | 20.0 | - | 25.0 | 40.0 | 0.50 | 0.80 | - | - |"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("| 2 | 4096 | inf | 1.5 | - | 1.5 | 1.5 | 1.00 | 1.00 | - | - |"),
            std::string::npos)
      << result.output;
}

TEST(MpiTool, FullStandardOutputIsAnError) {
  const std::string bench = temp_file(
      "full.txt",
      R"(MRCMPI-BENCH {"path":"exact","size":4096,"k":"inf","messages":16,"us_per_msg":1,)"
      R"("reg_us":1,"xfer_us":0,"ranks":2,"nodes":2,"rep":0})"
      "\n");
  for (const std::string &args : std::vector<std::string>{" --help", " report " + bench}) {
    const auto result = mrc_tools_test::run_into_full_stdout(kMpi + args);
    EXPECT_EQ(result.status, 1) << args << ": " << result.output;
    EXPECT_NE(result.output.find("mrcache-mpi: cannot write standard output: No space left"),
              std::string::npos)
        << args << ": " << result.output;
  }
}

TEST(MpiTool, ReportRefusesInputWithoutResults) {
  const auto empty = run(kMpi + " report " + temp_file("empty.txt", "nothing here\n{\"x\":1}\n"));
  EXPECT_EQ(empty.status, 1) << empty.output;
  EXPECT_NE(empty.output.find("no MRCMPI-BENCH lines"), std::string::npos) << empty.output;
  const auto missing = run(kMpi + " report /nonexistent/bench.txt");
  EXPECT_EQ(missing.status, 2) << missing.output;
  EXPECT_NE(missing.output.find("cannot read"), std::string::npos) << missing.output;
}

}  // namespace
