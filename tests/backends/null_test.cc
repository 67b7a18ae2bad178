// SPDX-License-Identifier: BSD-3-Clause
// The null backend: serials, counters, fault injection, parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "helpers.h"
#include "mrcache/mrcache.h"

namespace {

char g_memory[4096];

using namespace mrc_test;  // NOLINT(google-build-using-namespace): test helpers

mrc_status_t Reg(void *ctx, void **handle, uint64_t *key) {
  return mrc_backend_null()->reg(ctx, g_memory, sizeof g_memory, MRC_PROT_READ, handle, key);
}

// The fate (true = failed) of `n` consecutive registrations on a fresh context.
std::vector<bool> FailurePattern(const mrc_null_params_t &p, int n) {
  NullCtx c(&p);
  std::vector<bool> failed;
  for (int i = 0; i < n; ++i) {
    void *h = nullptr;
    uint64_t key = 0;
    const mrc_status_t s = Reg(c.ctx, &h, &key);
    failed.push_back(s != MRC_OK);
    if (s == MRC_OK) mrc_backend_null()->dereg(c.ctx, h);
  }
  return failed;
}

TEST(NullBackend, OpsTableIsComplete) {
  const mrc_backend_t *ops = mrc_backend_null();
  ASSERT_NE(ops, nullptr);
  EXPECT_STREQ(ops->name, "null");
  EXPECT_NE(ops->reg, nullptr);
  EXPECT_NE(ops->dereg, nullptr);
  EXPECT_NE(ops->describe, nullptr);
}

TEST(NullBackend, SerialIsNotReusedAfterDeregistration) {
  void *h = nullptr;
  uint64_t first = 0, second = 0;
  ASSERT_EQ(Reg(nullptr, &h, &first), MRC_OK);
  mrc_backend_null()->dereg(nullptr, h);
  ASSERT_EQ(Reg(nullptr, &h, &second), MRC_OK);
  mrc_backend_null()->dereg(nullptr, h);
  EXPECT_GT(second, first);
}

TEST(NullBackend, CountersTrackRegistrationsAndDeregistrations) {
  NullCtx c;
  std::vector<void *> handles(10);
  for (auto &h : handles) {
    uint64_t key = 0;
    ASSERT_EQ(Reg(c.ctx, &h, &key), MRC_OK);
  }
  for (int i = 0; i < 4; ++i) mrc_backend_null()->dereg(c.ctx, handles[i]);
  uint64_t regs = 0, deregs = 0, failures = 0;
  mrc_null_ctx_counters(c.ctx, &regs, &deregs, &failures);
  EXPECT_EQ(regs, 10u);
  EXPECT_EQ(deregs, 4u);
  EXPECT_EQ(failures, 0u);
  EXPECT_EQ(regs - deregs, 6u);                             // live
  mrc_null_ctx_counters(c.ctx, nullptr, nullptr, nullptr);  // NULL outputs are allowed
}

TEST(NullBackend, FailsEveryNthRegistration) {
  mrc_null_params_t p{.fail_rate = 0, .fail_every = 3, .seed = 0};
  NullCtx c(&p);
  for (int i = 1; i <= 12; ++i) {
    void *h = nullptr;
    uint64_t key = 0;
    const mrc_status_t s = Reg(c.ctx, &h, &key);
    if (i % 3 == 0) {
      EXPECT_EQ(s, MRC_ERR_BACKEND) << "attempt " << i;
      EXPECT_NE(std::string(mrc_backend_last_error()).find("null: injected failure (every 3"),
                std::string::npos)
          << mrc_backend_last_error();
    } else {
      EXPECT_EQ(s, MRC_OK) << "attempt " << i;
    }
  }
  uint64_t regs = 0, failures = 0;
  mrc_null_ctx_counters(c.ctx, &regs, nullptr, &failures);
  EXPECT_EQ(regs, 8u);
  EXPECT_EQ(failures, 4u);
}

TEST(NullBackend, FailureRateIsRepeatableForASeed) {
  const mrc_null_params_t p{.fail_rate = 0.3, .fail_every = 0, .seed = 42};
  const std::vector<bool> a = FailurePattern(p, 4000);
  const std::vector<bool> b = FailurePattern(p, 4000);
  EXPECT_EQ(a, b);
  const auto failures = std::count(a.begin(), a.end(), true);
  EXPECT_GT(failures, 4000 * 0.25);
  EXPECT_LT(failures, 4000 * 0.35);
  mrc_null_params_t other = p;
  other.seed = 43;
  EXPECT_NE(FailurePattern(other, 4000), a);
}

TEST(NullBackend, RateZeroNeverFailsRateOneAlwaysFails) {
  const std::vector<bool> never =
      FailurePattern(mrc_null_params_t{.fail_rate = 0.0, .fail_every = 0, .seed = 1}, 500);
  EXPECT_EQ(std::count(never.begin(), never.end(), true), 0);
  const std::vector<bool> always =
      FailurePattern(mrc_null_params_t{.fail_rate = 1.0, .fail_every = 0, .seed = 1}, 500);
  EXPECT_EQ(std::count(always.begin(), always.end(), false), 0);
  EXPECT_NE(std::string(mrc_backend_last_error()).find("rate 1, seed 1"), std::string::npos)
      << mrc_backend_last_error();
}

TEST(NullBackend, BadParametersAreInvalid) {
  mrc_null_ctx_t *ctx = nullptr;
  for (double rate : {-0.1, 1.5, std::nan("")}) {
    const mrc_null_params_t p{.fail_rate = rate, .fail_every = 0, .seed = 0};
    EXPECT_EQ(mrc_null_ctx_create(&p, &ctx), MRC_ERR_INVALID) << rate;
    EXPECT_EQ(ctx, nullptr);
  }
  EXPECT_NE(std::string(mrc_backend_last_error()).find("null: fail_rate"), std::string::npos);
  EXPECT_EQ(mrc_null_ctx_create(nullptr, nullptr), MRC_ERR_INVALID);
}

TEST(NullBackend, BadRegistrationArgumentsAreInvalid) {
  const mrc_backend_t *ops = mrc_backend_null();
  void *h = nullptr;
  uint64_t key = 0;
  EXPECT_EQ(ops->reg(nullptr, nullptr, 4096, MRC_PROT_READ, &h, &key), MRC_ERR_INVALID);
  EXPECT_EQ(ops->reg(nullptr, g_memory, 0, MRC_PROT_READ, &h, &key), MRC_ERR_INVALID);
  EXPECT_EQ(ops->reg(nullptr, reinterpret_cast<void *>(~uintptr_t{0} - 100), 4096, MRC_PROT_READ,
                     &h, &key),
            MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_backend_last_error()).find("wraps around"), std::string::npos);
  EXPECT_EQ(ops->reg(nullptr, g_memory, 64, 0x10, &h, &key), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_backend_last_error()).find("protection bits 0x10"), std::string::npos);
  EXPECT_EQ(ops->reg(nullptr, g_memory, 64, MRC_PROT_READ, nullptr, &key), MRC_ERR_INVALID);
  EXPECT_EQ(ops->reg(nullptr, g_memory, 64, MRC_PROT_READ, &h, nullptr), MRC_ERR_INVALID);
  // Nothing was counted for the rejected calls.
  NullCtx c;
  EXPECT_EQ(ops->reg(c.ctx, g_memory, 0, MRC_PROT_READ, &h, &key), MRC_ERR_INVALID);
  uint64_t regs = 1, failures = 1;
  mrc_null_ctx_counters(c.ctx, &regs, nullptr, &failures);
  EXPECT_EQ(regs, 0u);
  EXPECT_EQ(failures, 0u);
}

TEST(NullBackend, DescribeNamesTheSerial) {
  void *h = nullptr;
  uint64_t key = 0;
  ASSERT_EQ(Reg(nullptr, &h, &key), MRC_OK);
  char buf[64];
  const int n = mrc_backend_null()->describe(nullptr, h, buf, sizeof buf);
  EXPECT_EQ(std::string(buf), "null: serial " + std::to_string(key));
  EXPECT_EQ(n, static_cast<int>(std::string(buf).size()));
  mrc_backend_null()->dereg(nullptr, h);
}

TEST(NullBackend, ParamsInitReadsTheEnvironment) {
  setenv("MRC_NULL_FAIL_RATE", "0.25", 1);
  setenv("MRC_NULL_FAIL_EVERY", "7", 1);
  setenv("MRC_NULL_FAIL_SEED", "99", 1);
  mrc_null_params_t p;
  mrc_null_params_init(&p);
  EXPECT_EQ(p.fail_rate, 0.25);
  EXPECT_EQ(p.fail_every, 7u);
  EXPECT_EQ(p.seed, 99u);
  // Malformed values are ignored: the defaults stay.
  setenv("MRC_NULL_FAIL_RATE", "2", 1);
  setenv("MRC_NULL_FAIL_EVERY", "7x", 1);
  setenv("MRC_NULL_FAIL_SEED", "-3", 1);
  mrc_null_params_init(&p);
  EXPECT_EQ(p.fail_rate, 0.0);
  EXPECT_EQ(p.fail_every, 0u);
  EXPECT_EQ(p.seed, 0u);
  // A context created without parameters takes them from the environment.
  setenv("MRC_NULL_FAIL_EVERY", "1", 1);
  NullCtx c;
  void *h = nullptr;
  uint64_t key = 0;
  EXPECT_EQ(Reg(c.ctx, &h, &key), MRC_ERR_BACKEND);
  unsetenv("MRC_NULL_FAIL_RATE");
  unsetenv("MRC_NULL_FAIL_EVERY");
  unsetenv("MRC_NULL_FAIL_SEED");
}

}  // namespace
