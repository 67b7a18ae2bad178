// SPDX-License-Identifier: BSD-3-Clause
// libmrcache-fi.so loaded by libfabric into a program that is not mrcache's
// (fi_init_probe.c): libfabric takes the import and says so; a later import is refused; an
// import that comes second says why and changes nothing; MRC_FI_MONITOR=off imports nothing.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

// Runs the probe with `env` added, stdout and stderr together; returns what it printed.
std::string run_probe(const std::vector<std::string> &env, const char *argument = nullptr) {
  int out[2];
  if (pipe(out) != 0) return "pipe failed";
  const pid_t child = fork();
  if (child == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    for (const std::string &assignment : env) putenv(const_cast<char *>(assignment.c_str()));
    execl(MRC_FI_PROBE, MRC_FI_PROBE, argument, static_cast<char *>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  close(out[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) text += "\n[probe failed]";
  return text;
}

const std::vector<std::string> kWithPlugin = {std::string("FI_PROVIDER_PATH=") + MRC_FI_PLUGIN_DIR,
                                              "FI_LOG_LEVEL=info", "FI_PROVIDER=tcp"};

bool has(const std::string &text, const char *needle) {
  return text.find(needle) != std::string::npos;
}

TEST(LibfabricPlugin, LibfabricTakesTheImportAndRefusesALaterOne) {
  const std::string text = run_probe(kWithPlugin);
  EXPECT_TRUE(has(text, "imported mrcache's monitor")) << text;
  EXPECT_TRUE(has(text, "setting imported memory monitor as default")) << text;  // libfabric's
  EXPECT_TRUE(has(text, "fi_getinfo: ok")) << text;
  EXPECT_TRUE(has(text, "own import after init: -16")) << "-FI_EBUSY expected:\n" << text;
  EXPECT_FALSE(has(text, "[probe failed]")) << text;
}

TEST(LibfabricPlugin, AnImportThatComesSecondSaysWhyAndChangesNothing) {
  const std::string text = run_probe(kWithPlugin, "first");
  EXPECT_TRUE(has(text, "own import before init: 0")) << text;
  EXPECT_TRUE(has(text, "libfabric refused mrcache's monitor")) << text;
  EXPECT_TRUE(has(text, "another monitor was imported first")) << text;
  EXPECT_FALSE(has(text, "imported mrcache's monitor (")) << text;
  EXPECT_TRUE(has(text, "fi_getinfo: ok")) << text;
  EXPECT_FALSE(has(text, "[probe failed]")) << text;
}

TEST(LibfabricPlugin, SwitchedOffItImportsNothing) {
  std::vector<std::string> env = kWithPlugin;
  env.emplace_back("MRC_FI_MONITOR=off");
  const std::string text = run_probe(env);
  EXPECT_TRUE(has(text, "MRC_FI_MONITOR=off")) << text;
  EXPECT_FALSE(has(text, "imported mrcache's monitor")) << text;
  // So the program's own import, later, is libfabric's first.
  EXPECT_TRUE(has(text, "own import after init: 0")) << text;
}

TEST(LibfabricPlugin, WithoutThePluginLibfabricKeepsItsOwnMonitor) {
  const std::string text = run_probe({"FI_LOG_LEVEL=info", "FI_PROVIDER=tcp"});
  EXPECT_FALSE(has(text, "mrcache")) << text;
  EXPECT_TRUE(has(text, "fi_getinfo: ok")) << text;
}

}  // namespace
