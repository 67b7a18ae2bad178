// SPDX-License-Identifier: BSD-3-Clause
// Shared fixtures of the uffd tests: a subscribed test, and the scale of stress loops.
#pragma once

#include <gtest/gtest.h>

#include "tests/uffd/helpers.h"
#include "uffd/uffd.h"

namespace mrc::uffd::test {

// Sanitizers slow every round down about tenfold: stress loops run this many times fewer rounds.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__) || defined(MRC_TSAN)
inline constexpr int kScale = 10;
#else
inline constexpr int kScale = 1;
#endif

// A test that holds one subscription (subscription_) from SetUp to TearDown; skipped, with the
// monitor's reason, where no userfaultfd works (uncached mode).
class SubscribedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uffd::subscribe(&subscription_), MRC_OK);
    if (subscription_->mode() == MRC_MONITOR_UNCACHED) {
      GTEST_SKIP() << "no userfaultfd here: " << monitor_info().reason;
    }
  }
  void TearDown() override {
    if (subscription_ != nullptr) uffd::unsubscribe(subscription_);
    subscription_ = nullptr;
  }
  Subscription *subscription_ = nullptr;
};

}  // namespace mrc::uffd::test
