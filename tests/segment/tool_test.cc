// SPDX-License-Identifier: BSD-3-Clause
// mrcache-seg against live domains: show (text and JSON), scan, repair, remove NAME, remove --all,
// and its exit codes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "mrcache/mrcache.h"
#include "seg_test_util.h"

namespace {

using segtest::Child;
using segtest::shm_files;

struct ToolRun {
  int status;
  std::string out;
};

// stderr joins stdout unless `quiet` (then it is dropped).
ToolRun tool(const std::string &args, bool quiet = false) {
  const std::string cmd =
      std::string(MRC_SEG_TOOL) + " " + args + (quiet ? " 2>/dev/null" : " 2>&1");
  FILE *f = popen(cmd.c_str(), "r");
  if (f == nullptr) throw std::runtime_error("popen");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

class Tool : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = segtest::unique_prefix("tool");
    children_.reserve(8);
  }
  void TearDown() override {
    children_.clear();
    segtest::remove_shm(prefix_);
  }
  Child &spawn(const std::string &cmd, std::vector<std::string> extra) {
    std::vector<std::string> a{cmd, "prefix=" + prefix_, "timeout=10000"};
    a.insert(a.end(), extra.begin(), extra.end());
    children_.push_back(Child::spawn(a));
    return children_.back();
  }
  std::string p() const { return "--prefix " + prefix_ + " "; }
  std::string prefix_;
  std::vector<Child> children_;
};

TEST_F(Tool, ShowScanRemove) {
  Child &a = spawn("join", {"seg=kept", "segsize=1048576", "flags=1", "hold=1"});
  a.expect("ok");
  Child &b = spawn("join", {"seg=dying", "segsize=65536", "hold=1"});
  b.expect("ok");
  const pid_t dead = b.pid();
  b.kill9();

  ToolRun r = tool(p() + "show --verbose");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("domain " + prefix_), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kept"), std::string::npos);
  EXPECT_NE(r.out.find("heap: 0 of 1048576 bytes used"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dead"), std::string::npos) << r.out;

  r = tool(p() + "--json show");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["domains"].size(), 1u);
  auto &dom = j["domains"][0];
  EXPECT_EQ(dom["prefix"], prefix_);
  ASSERT_EQ(dom["clients"].size(), 2u);
  for (auto &c : dom["clients"]) {
    EXPECT_EQ(c["alive"], c["pid"] != dead) << c.dump();
  }
  EXPECT_EQ(dom["segments"].size(), 2u);

  // Without --prefix, show lists every domain, ours among them (other tests' domains come and
  // go meanwhile, and some are hostile on purpose: the exit status is theirs).
  r = tool("--json show", true);
  bool found = false;
  const auto all = nlohmann::json::parse(r.out);
  for (const auto &d : all["domains"]) found |= d["prefix"] == prefix_;
  EXPECT_TRUE(found) << r.out;

  r = tool(p() + "--json scan");
  ASSERT_EQ(r.status, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["domains"][0]["clients_removed"], 1);
  EXPECT_EQ(j["domains"][0]["segments_removed"], 1);
  EXPECT_EQ(shm_files(prefix_).size(), 2u);

  r = tool(p() + "remove kept");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("open in 1 live processes"), std::string::npos) << r.out;
  r = tool(p() + "remove nothing");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("no segment nothing"), std::string::npos) << r.out;
  r = tool(p() + "--json remove --all");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("live processes still use"), std::string::npos) << r.out;
  EXPECT_EQ(shm_files(prefix_).size(), 2u);

  a.kill9();
  r = tool(p() + "--json remove --all");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["files_removed"], 2);
  EXPECT_TRUE(shm_files(prefix_).empty());
  r = tool(p() + "show");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("no domain under prefix"), std::string::npos) << r.out;
}

TEST_F(Tool, RepairRecoversALockWhoseOwnerDied) {
  Child &a = spawn("join", {"seg=data", "segsize=65536", "hold=1"});
  a.expect("ok");
  Child &h = spawn("holdlock", {"state=creating"});
  h.expect("locked");
  ToolRun r = tool(p() + "show");
  EXPECT_NE(r.out.find("lock: held by thread " + std::to_string(h.pid())), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(creating)"), std::string::npos) << r.out;
  h.kill9();
  r = tool(p() + "show");
  EXPECT_NE(r.out.find("owner died"), std::string::npos) << r.out;
  EXPECT_EQ(shm_files(prefix_).size(), 3u);  // root, data, the half-made segment
  r = tool(p() + "--json repair");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["domains"][0]["locks_recovered"], 1);
  EXPECT_EQ(j["domains"][0]["consistent"], true);
  EXPECT_EQ(shm_files(prefix_).size(), 2u);
  r = tool(p() + "repair");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("0 locks recovered"), std::string::npos) << r.out;
  a.finish_input();
  EXPECT_EQ(a.wait(), 0);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

// Anyone can drop a "<x>:root" file into /dev/shm: without --prefix, another user's is reported
// once and skipped, and does not make show (or scan, repair) fail.
TEST_F(Tool, AnotherUsersRootFileIsSkipped) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user (chown)";
  Child &a = spawn("join", {"seg=mine", "segsize=65536", "hold=1"});
  a.expect("ok");
  const std::string foreign = segtest::unique_prefix("foreign");
  const std::string name = "/" + foreign + ":root";
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchown(fd, 65534, 65534), 0);
  struct Unlink {
    std::string n;
    ~Unlink() { shm_unlink(n.c_str()); }
  } unlink_at_end{name};
  ASSERT_EQ(write(fd, "not a domain", 12), 12);
  close(fd);
  for (const char *cmd : {"show", "scan", "repair"}) {
    SCOPED_TRACE(cmd);
    const ToolRun r = tool(std::string("--json ") + cmd, true);
    const auto j = nlohmann::json::parse(r.out);
    bool ours = false, skipped = false, failed = false;
    for (const auto &d : j["domains"]) {
      EXPECT_NE(d.value("prefix", ""), foreign) << d.dump();
      ours |= d.value("prefix", "") == prefix_;
      failed |= d.contains("error");  // other tests' domains (some hostile on purpose)
    }
    ASSERT_TRUE(j.contains("skipped")) << r.out;
    for (const auto &k : j["skipped"]) {
      skipped |= k["file"] == "/dev/shm" + name &&
                 k["why"].get<std::string>().find("uid 65534") != std::string::npos;
    }
    EXPECT_TRUE(ours) << r.out;
    EXPECT_TRUE(skipped) << r.out;
    EXPECT_EQ(r.status, failed ? 1 : 0) << r.out;
  }
  const ToolRun r = tool("show");
  EXPECT_NE(r.out.find("mrcache-seg: skipped /dev/shm" + name + ": owned by uid 65534"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("mrcache-seg: " + foreign + ":"), std::string::npos) << r.out;
  a.finish_input();
  EXPECT_EQ(a.wait(), 0);
}

// A command whose output cannot be written failed (exit 1), with the error on stderr.
TEST_F(Tool, FullStandardOutputIsAnError) {
  Child &a = spawn("join", {"seg=kept", "segsize=65536", "hold=1"});
  a.expect("ok");
  for (const std::string &args :
       std::vector<std::string>{p() + "show", p() + "--json show", p() + "scan", "--help"}) {
    const std::string cmd = "{ " + std::string(MRC_SEG_TOOL) + " " + args + " >/dev/full; } 2>&1";
    FILE *f = popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string err;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, f)) err.append(buf, n);
    const int st = pclose(f);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << args << ": status " << st << ": " << err;
    EXPECT_NE(err.find("mrcache-seg: cannot write standard output: No space left"),
              std::string::npos)
        << args << ": " << err;
  }
  a.finish_input();
  EXPECT_EQ(a.wait(), 0);
}

TEST_F(Tool, UsageErrors) {
  EXPECT_EQ(tool("").status, 2);
  EXPECT_EQ(tool("frobnicate").status, 2);
  EXPECT_EQ(tool("--prefix a/b show").status, 2);
  EXPECT_EQ(tool("remove --all").status, 2);  // remove needs --prefix
  EXPECT_EQ(tool(p() + "remove").status, 2);
  EXPECT_EQ(tool(p() + "remove x --all").status, 2);
  EXPECT_EQ(tool("--help").status, 0);
}

}  // namespace
