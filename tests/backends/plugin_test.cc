// SPDX-License-Identifier: BSD-3-Clause
// The plugin interface: a C runtime's ops table (plugin_c.c) completed with the not-supported
// defaults, and the built-in tables being complete already.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "mrcache/mrcache.h"
#include "plugin_c.h"

namespace {

char g_memory[8192];

TEST(Plugin, CompletedCTableCallsThePluginAndTheDefaults) {
  ASSERT_TRUE(plugin_c_original_has_no_dereg());
  mrc_backend_t ops{};
  ASSERT_EQ(plugin_c_complete(&ops), MRC_OK);
  EXPECT_STREQ(ops.name, "c-plugin");
  ASSERT_NE(ops.reg, nullptr);
  ASSERT_NE(ops.dereg, nullptr);
  ASSERT_NE(ops.describe, nullptr);

  void *ctx = plugin_c_ctx();
  void *handle = nullptr;
  uint64_t key = 0;
  const unsigned live_before = plugin_c_live();
  ASSERT_EQ(ops.reg(ctx, g_memory, sizeof g_memory, MRC_PROT_WRITE, &handle, &key), MRC_OK);
  EXPECT_EQ(handle, g_memory);
  EXPECT_EQ(key & 0xffff0000u, 0xc0de0000u);
  EXPECT_EQ(plugin_c_live(), live_before + 1);

  // The default describe names the handle; the default dereg does nothing (and exists).
  char buf[64];
  const int n = ops.describe(ctx, handle, buf, sizeof buf);
  EXPECT_GT(n, 0);
  EXPECT_EQ(std::string(buf).rfind("handle 0x", 0), 0u) << buf;
  ops.dereg(ctx, handle);
  EXPECT_EQ(plugin_c_live(), live_before + 1);
}

TEST(Plugin, PluginErrorsReachLastError) {
  mrc_backend_t ops{};
  ASSERT_EQ(plugin_c_complete(&ops), MRC_OK);
  void *handle = nullptr;
  uint64_t key = 0;
  EXPECT_EQ(ops.reg(plugin_c_ctx(), g_memory, size_t{2} << 20, MRC_PROT_READ, &handle, &key),
            MRC_ERR_NO_MEMORY);
  EXPECT_STREQ(mrc_backend_last_error(), "c-plugin: 2097152 bytes is more than this engine pins");
}

TEST(Plugin, EmptyTableGetsNotSupportedDefaults) {
  mrc_backend_t ops{};
  ASSERT_EQ(plugin_c_complete_empty(&ops), MRC_OK);
  EXPECT_STREQ(ops.name, "plugin");
  void *handle = nullptr;
  uint64_t key = 0;
  EXPECT_EQ(ops.reg(nullptr, g_memory, 64, MRC_PROT_READ, &handle, &key), MRC_ERR_UNSUPPORTED);
  EXPECT_STREQ(mrc_backend_last_error(), "plugin: the plugin has no reg operation");
  ops.dereg(nullptr, nullptr);  // a no-op, not a crash
}

TEST(Plugin, CompleteRejectsNullAndAcceptsInPlace) {
  mrc_backend_t ops{};
  EXPECT_EQ(mrc_backend_complete(nullptr, &ops), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_backend_complete(&ops, nullptr), MRC_ERR_INVALID);
  ASSERT_EQ(plugin_c_complete(&ops), MRC_OK);
  const mrc_backend_t before = ops;
  ASSERT_EQ(mrc_backend_complete(&ops, &ops), MRC_OK);  // completing twice changes nothing
  EXPECT_EQ(ops.reg, before.reg);
  EXPECT_EQ(ops.dereg, before.dereg);
  EXPECT_EQ(ops.describe, before.describe);
}

TEST(Plugin, BuiltInTablesAreAlreadyComplete) {
  for (const mrc_backend_t *builtin :
       {mrc_backend_null(), mrc_backend_iouring(), mrc_backend_verbs()}) {
    ASSERT_NE(builtin, nullptr);
    mrc_backend_t completed{};
    ASSERT_EQ(mrc_backend_complete(builtin, &completed), MRC_OK);
    EXPECT_EQ(completed.name, builtin->name);
    EXPECT_EQ(completed.reg, builtin->reg) << builtin->name;
    EXPECT_EQ(completed.dereg, builtin->dereg) << builtin->name;
    EXPECT_EQ(completed.describe, builtin->describe) << builtin->name;
  }
}

TEST(Plugin, SetErrorWithoutBackendNameSaysPlugin) {
  mrc_backend_set_error(nullptr, "code %d", 7);
  EXPECT_STREQ(mrc_backend_last_error(), "plugin: code 7");
}

TEST(Plugin, LastErrorIsPerThread) {
  mrc_backend_set_error("main", "here");
  std::string other;
  std::thread([&] { other = mrc_backend_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_STREQ(mrc_backend_last_error(), "main: here");
}

}  // namespace
