// SPDX-License-Identifier: BSD-3-Clause
// One last error for the whole library (base/error.h): a backend's failure and a segment call's
// failure both read back through mrc_last_error() and through their older names,
// mrc_backend_last_error() and mrc_seg_last_error(), which return the same text.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "mrcache/mrcache.h"

namespace {

TEST(LastError, BackendFailureReadsThroughEveryName) {
  void *handle = nullptr;
  uint64_t key = 0;
  // The null backend checks its arguments like every engine: an empty range is refused.
  ASSERT_EQ(mrc_backend_null()->reg(nullptr, nullptr, 0, MRC_PROT_READ, &handle, &key),
            MRC_ERR_INVALID);
  const std::string text = mrc_last_error();
  EXPECT_EQ(text.rfind("null: empty range", 0), 0u) << text;
  EXPECT_EQ(mrc_backend_last_error(), text);
  EXPECT_EQ(mrc_seg_last_error(), text);
  // The same buffer, not three copies.
  EXPECT_EQ(mrc_backend_last_error(), mrc_last_error());
  EXPECT_EQ(mrc_seg_last_error(), mrc_last_error());
}

TEST(LastError, SegmentFailureReadsThroughEveryName) {
  mrc_seg_t *seg = nullptr;
  ASSERT_EQ(mrc_seg_memfd_create(nullptr, &seg), MRC_ERR_INVALID);
  const std::string text = mrc_last_error();
  EXPECT_EQ(text, "params or out is NULL");
  EXPECT_EQ(mrc_seg_last_error(), text);
  EXPECT_EQ(mrc_backend_last_error(), text);
}

TEST(LastError, PluginSetErrorReadsThroughEveryName) {
  mrc_backend_set_error("plugin-x", "code %d", 42);
  EXPECT_STREQ(mrc_last_error(), "plugin-x: code 42");
  EXPECT_STREQ(mrc_seg_last_error(), "plugin-x: code 42");
}

TEST(LastError, ASegmentCallClearsWhatABackendLeft) {
  mrc_backend_set_error("plugin-x", "stale");
  mrc_seg_t *seg = nullptr;
  EXPECT_EQ(mrc_seg_close(seg), MRC_ERR_INVALID);
  EXPECT_STREQ(mrc_last_error(), "seg is NULL");
  EXPECT_STREQ(mrc_backend_last_error(), "seg is NULL");
}

TEST(LastError, IsPerThreadAndNeverNull) {
  mrc_backend_set_error("main", "here");
  std::string other = "unset";
  std::thread([&] {
    ASSERT_NE(mrc_last_error(), nullptr);
    other = mrc_last_error();
  }).join();
  EXPECT_EQ(other, "");
  EXPECT_STREQ(mrc_last_error(), "main: here");
}

TEST(LastError, LongCausesAreTruncatedNotOverrun) {
  const std::string cause(2000, 'x');
  mrc_backend_set_error("long", "%s", cause.c_str());
  const std::string text = mrc_last_error();
  EXPECT_EQ(text.rfind("long: xxx", 0), 0u);
  EXPECT_LT(text.size(), 1000u);
}

}  // namespace
