// SPDX-License-Identifier: BSD-3-Clause
// MRC_* variables: units, booleans, and errors that name the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/cache/config.h"
#include "mrcache/mrcache.h"

namespace {

class EnvVar {
 public:
  EnvVar(const char *name, const char *value) : name_(name) { setenv(name, value, 1); }
  ~EnvVar() { unsetenv(name_); }
  EnvVar(const EnvVar &) = delete;
  EnvVar &operator=(const EnvVar &) = delete;

 private:
  const char *name_;
};

TEST(Config, SizesTakeUnits) {
  size_t v = 0;
  ASSERT_TRUE(mrc::config::parse_size("4096", &v));
  EXPECT_EQ(v, 4096u);
  ASSERT_TRUE(mrc::config::parse_size("64k", &v));
  EXPECT_EQ(v, 64u << 10);
  ASSERT_TRUE(mrc::config::parse_size("1g", &v));
  EXPECT_EQ(v, size_t{1} << 30);
  ASSERT_TRUE(mrc::config::parse_size("2MiB", &v));
  EXPECT_EQ(v, size_t{2} << 20);
  ASSERT_TRUE(mrc::config::parse_size("3T", &v));
  EXPECT_EQ(v, size_t{3} << 40);
  ASSERT_TRUE(mrc::config::parse_size("inf", &v));
  EXPECT_EQ(v, SIZE_MAX);
  EXPECT_FALSE(mrc::config::parse_size("", &v));
  EXPECT_FALSE(mrc::config::parse_size("k", &v));
  EXPECT_FALSE(mrc::config::parse_size("-1", &v));
  EXPECT_FALSE(mrc::config::parse_size("12q", &v));
  EXPECT_FALSE(mrc::config::parse_size("99999999999999999999", &v));
  EXPECT_FALSE(mrc::config::parse_size("20000000000t", &v));
}

TEST(Config, ParamsInitReadsTheEnvironment) {
  EnvVar regions("MRC_MAX_REGIONS", "64k");
  EnvVar bytes("MRC_MAX_BYTES", "1g");
  EnvVar unreleased("MRC_MAX_UNRELEASED", "inf");
  EnvVar fork("MRC_PURGE_ON_FORK", "yes");
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  EXPECT_EQ(params.max_regions, 65536u);
  EXPECT_EQ(params.max_bytes, size_t{1} << 30);
  EXPECT_EQ(params.max_unreleased, 0u);  // inf = unlimited
  EXPECT_TRUE(params.flags & MRC_FLAG_PURGE_ON_FORK);
  EXPECT_EQ(params.env_status, MRC_OK);
  EXPECT_EQ(params.backend, mrc_backend_null());
}

TEST(Config, GetsAreExactUnlessOrderedUnmapsIsSet) {
  {
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    EXPECT_FALSE(params.flags & MRC_FLAG_ORDERED_UNMAPS) << "exact mode is the default";
  }
  {
    EnvVar ordered("MRC_ORDERED_UNMAPS", "1");
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    EXPECT_TRUE(params.flags & MRC_FLAG_ORDERED_UNMAPS);
    mrc_cache_t *cache = nullptr;
    ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK) << "the flag is accepted";
    char json[2048];
    ASSERT_GT(mrc_cache_stats_json(cache, json, sizeof json), 0);
    EXPECT_NE(std::string(json).find("\"exact\":false"), std::string::npos) << json;
    mrc_cache_destroy(cache);
  }
  {
    EnvVar ordered("MRC_ORDERED_UNMAPS", "sometimes");
    mrc_cache_params_t params;
    char error[256];
    EXPECT_EQ(mrc_cache_params_init_checked(&params, error, sizeof error), MRC_ERR_INVALID);
    EXPECT_NE(std::string(error).find("MRC_ORDERED_UNMAPS=sometimes"), std::string::npos) << error;
  }
}

TEST(Config, ChurnIsLearnedUnlessCacheChurnIsSet) {
  {
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    EXPECT_FALSE(params.flags & MRC_FLAG_CACHE_CHURN) << "learning is the default";
  }
  {
    EnvVar churn("MRC_CACHE_CHURN", "yes");
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    EXPECT_TRUE(params.flags & MRC_FLAG_CACHE_CHURN);
    mrc_cache_t *cache = nullptr;
    ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK) << "the flag is accepted";
    mrc_cache_destroy(cache);
  }
  {
    EnvVar churn("MRC_CACHE_CHURN", "often");
    mrc_cache_params_t params;
    char error[256];
    EXPECT_EQ(mrc_cache_params_init_checked(&params, error, sizeof error), MRC_ERR_INVALID);
    EXPECT_NE(std::string(error).find("MRC_CACHE_CHURN=often"), std::string::npos) << error;
  }
}

TEST(Config, MalformedVariableIsAnErrorNamingIt) {
  EnvVar regions("MRC_MAX_BYTES", "lots");
  mrc_cache_params_t params;
  char error[256];
  EXPECT_EQ(mrc_cache_params_init_checked(&params, error, sizeof error), MRC_ERR_INVALID);
  EXPECT_NE(std::string(error).find("MRC_MAX_BYTES=lots"), std::string::npos) << error;
  mrc_set_log_level(MRC_LOG_ERROR);
  mrc_set_log_handler([](void *, mrc_log_level_t, const char *) {}, nullptr);
  mrc_cache_params_init(&params);
  mrc_set_log_handler(nullptr, nullptr);
  mrc_set_log_level(MRC_LOG_WARN);
  EXPECT_EQ(params.env_status, MRC_ERR_INVALID);
  mrc_cache_t *cache = nullptr;
  EXPECT_EQ(mrc_cache_create(&params, &cache), MRC_ERR_INVALID);
  EXPECT_EQ(cache, nullptr);
}

TEST(Config, BadBooleanAndPfnValues) {
  {
    EnvVar fork("MRC_PURGE_ON_FORK", "maybe");
    mrc_cache_params_t params;
    EXPECT_EQ(mrc_cache_params_init_checked(&params, nullptr, 0), MRC_ERR_INVALID);
  }
  {
    EnvVar pfn("MRC_VERIFY_PFN", "8");
    mrc_cache_params_t params;
    ASSERT_EQ(mrc_cache_params_init_checked(&params, nullptr, 0), MRC_OK);
    EXPECT_TRUE(params.flags & MRC_FLAG_VERIFY_PFN);
    EXPECT_EQ(params.verify_pfn_pages, 8u);
  }
  {
    EnvVar pfn("MRC_VERIFY_PFN", "no");
    mrc_cache_params_t params;
    ASSERT_EQ(mrc_cache_params_init_checked(&params, nullptr, 0), MRC_OK);
    EXPECT_FALSE(params.flags & MRC_FLAG_VERIFY_PFN);
  }
}

// MRC_MONITOR, MRC_LOG_LEVEL and MRC_STATS were once not checked, and only the last of
// several malformed variables was named. Every one is reported, in errbuf and mrc_last_error().
TEST(Config, EveryMalformedVariableIsReported) {
  EnvVar monitor("MRC_MONITOR", "garbage");
  EnvVar level("MRC_LOG_LEVEL", "loud");
  EnvVar stats("MRC_STATS", "perhaps");
  EnvVar bytes("MRC_MAX_BYTES", "lots");
  EnvVar pfn("MRC_VERIFY_PFN", "some");
  EnvVar fork("MRC_PURGE_ON_FORK", "maybe");
  mrc_cache_params_t params;
  char error[512];
  EXPECT_EQ(mrc_cache_params_init_checked(&params, error, sizeof error), MRC_ERR_INVALID);
  const std::string last = mrc_last_error();
  for (const char *named :
       {"MRC_MONITOR=garbage", "MRC_LOG_LEVEL=loud", "MRC_STATS=perhaps", "MRC_MAX_BYTES=lots",
        "MRC_VERIFY_PFN=some", "MRC_PURGE_ON_FORK=maybe"}) {
    EXPECT_NE(std::string(error).find(named), std::string::npos) << named << " in: " << error;
    EXPECT_NE(last.find(named), std::string::npos) << named << " in: " << last;
  }
}

TEST(Config, EachNewlyCheckedVariableAloneIsAnError) {
  for (const char *name : {"MRC_MONITOR", "MRC_LOG_LEVEL", "MRC_STATS"}) {
    SCOPED_TRACE(name);
    {
      EnvVar bad(name, "garbage");
      mrc_cache_params_t params;
      char error[256];
      EXPECT_EQ(mrc_cache_params_init_checked(&params, error, sizeof error), MRC_ERR_INVALID);
      EXPECT_NE(std::string(error).find(std::string(name) + "=garbage"), std::string::npos)
          << error;
    }
  }
  // Their good values pass.
  EnvVar monitor("MRC_MONITOR", "auto");
  EnvVar level("MRC_LOG_LEVEL", "warn");
  EnvVar stats("MRC_STATS", "0");
  mrc_cache_params_t params;
  char error[256];
  EXPECT_EQ(mrc_cache_params_init_checked(&params, error, sizeof error), MRC_OK) << error;
  EXPECT_STREQ(error, "");
}

}  // namespace
