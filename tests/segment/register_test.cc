// SPDX-License-Identifier: BSD-3-Clause
// Registered segments: the whole segment registered through a cache, heap allocations with their
// key, and invalidation of the registration when a segment is closed (its pages unmapped), seen
// by the monitor. The null backend's key is a serial number never reused, so a stale
// registration shows as an old key.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "mrcache/mrcache.h"
#include "seg_test_util.h"

namespace {

class SegRegister : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = segtest::unique_prefix("r");
    mrc_cache_params_t cp;
    mrc_cache_params_init(&cp);
    cp.name = "segment-test";
    ASSERT_EQ(mrc_cache_create(&cp, &cache_), MRC_OK);
    mrc_seg_domain_params_t p;
    mrc_seg_domain_params_init(&p);
    p.prefix = prefix_.c_str();
    p.size = 1ULL << 30;
    ASSERT_EQ(mrc_seg_domain_open(&p, &domain_), MRC_OK) << mrc_seg_last_error();
  }
  void TearDown() override {
    EXPECT_EQ(mrc_seg_domain_close(domain_), MRC_OK);
    mrc_cache_destroy(cache_);
    segtest::remove_shm(prefix_);
  }
  static mrc_monitor_info_t monitor() {
    mrc_monitor_info_t info{};
    EXPECT_EQ(mrc_monitor_info(&info), MRC_OK);
    return info;
  }
  std::string prefix_;
  mrc_cache_t *cache_ = nullptr;
  mrc_seg_domain_t *domain_ = nullptr;
};

TEST_F(SegRegister, WholeSegmentAndHeapAllocationsComeRegistered) {
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(domain_, "reg", 1 << 20, MRC_SEG_HEAP, &s), MRC_OK);
  uint64_t key = 0;
  EXPECT_EQ(mrc_seg_alloc_registered(s, 64, 0, &key), nullptr);  // not registered yet
  EXPECT_EQ(mrc_seg_key(s, mrc_seg_base(s), 1, &key), MRC_ERR_NOT_FOUND);
  mrc_region_t *r = nullptr;
  ASSERT_EQ(mrc_seg_register(s, cache_, &r), MRC_OK) << mrc_seg_last_error();
  EXPECT_LE(static_cast<char *>(mrc_region_start(r)), static_cast<char *>(mrc_seg_base(s)));
  EXPECT_GE(static_cast<char *>(mrc_region_start(r)) + mrc_region_length(r),
            static_cast<char *>(mrc_seg_base(s)) + mrc_seg_size(s));
  EXPECT_EQ(mrc_region_prot(r) & (MRC_PROT_READ | MRC_PROT_WRITE),
            static_cast<unsigned>(MRC_PROT_READ | MRC_PROT_WRITE));
  const uint64_t k = mrc_region_key(r);
  void *p = mrc_seg_alloc_registered(s, 4000, 64, &key);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(key, k);
  std::memset(p, 1, 4000);
  EXPECT_EQ(mrc_seg_key(s, static_cast<char *>(mrc_seg_base(s)) + 100, 10, &key), MRC_OK);
  EXPECT_EQ(key, k);
  EXPECT_EQ(mrc_seg_key(s, static_cast<char *>(mrc_seg_base(s)) + mrc_seg_size(s), 1, &key),
            MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_key(s, mrc_seg_base(s), mrc_seg_size(s) + 1, &key), MRC_ERR_INVALID);
  // A second registration through the same cache: the same region.
  mrc_region_t *again = nullptr;
  ASSERT_EQ(mrc_seg_register(s, cache_, &again), MRC_OK);
  EXPECT_EQ(mrc_region_key(again), k);
  mrc_put(cache_, again);
  // Another cache: refused (the segment keeps one registration for its keys).
  mrc_cache_params_t cp;
  mrc_cache_params_init(&cp);
  mrc_cache_t *other = nullptr;
  ASSERT_EQ(mrc_cache_create(&cp, &other), MRC_OK);
  EXPECT_EQ(mrc_seg_register(s, other, &again), MRC_ERR_BUSY);
  mrc_cache_destroy(other);
  mrc_put(cache_, r);
  mrc_seg_free(s, p);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  // Nothing to register in a NODATA segment.
  ASSERT_EQ(mrc_seg_open(domain_, "hole", 1 << 20, MRC_SEG_NODATA, &s), MRC_OK);
  EXPECT_EQ(mrc_seg_register(s, cache_, &r), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
}

// Close, then open again at the same address: without the monitor telling the cache about the
// unmap, mrc_get would hand back the closed segment's registration (its old key).
TEST_F(SegRegister, ClosingInvalidatesTheRegistration) {
  if (monitor().mode == MRC_MONITOR_UNCACHED) {
    GTEST_SKIP() << "the monitor runs uncached (" << monitor().reason
                 << "): every get registers anew, so this test could not tell";
  }
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(domain_, "cycle", 1 << 20, MRC_SEG_HEAP, &s), MRC_OK);
  void *const base = mrc_seg_base(s);
  mrc_region_t *r = nullptr;
  ASSERT_EQ(mrc_seg_register(s, cache_, &r), MRC_OK) << mrc_seg_last_error();
  const uint64_t old_key = mrc_region_key(r);
  mrc_put(cache_, r);
  mrc_stats_t before{};
  ASSERT_EQ(mrc_cache_stats(cache_, &before), MRC_OK);
  ASSERT_EQ(mrc_seg_close(s), MRC_OK);  // last client: unmapped, unlinked

  ASSERT_EQ(mrc_seg_open(domain_, "cycle", 1 << 20, MRC_SEG_HEAP, &s), MRC_OK);
  ASSERT_EQ(mrc_seg_base(s), base);  // first fit: the same pages of the window
  ASSERT_EQ(mrc_seg_register(s, cache_, &r), MRC_OK) << mrc_seg_last_error();
  const uint64_t new_key = mrc_region_key(r);
  EXPECT_NE(new_key, old_key)
      << "stale registration: the reopened segment got the closed segment's key";
  uint64_t key = 0;
  ASSERT_NE(mrc_seg_alloc_registered(s, 64, 0, &key), nullptr);
  EXPECT_EQ(key, new_key);
  mrc_stats_t after{};
  ASSERT_EQ(mrc_cache_stats(cache_, &after), MRC_OK);
  EXPECT_GT(after.invalidations, before.invalidations);
  mrc_put(cache_, r);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
}

TEST_F(SegRegister, MemfdSegmentsRegisterToo) {
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "mfd";
  sp.size = 1 << 20;
  sp.flags = MRC_SEG_HEAP;
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_memfd_create(&sp, &s), MRC_OK);
  mrc_region_t *r = nullptr;
  ASSERT_EQ(mrc_seg_register(s, cache_, &r), MRC_OK) << mrc_seg_last_error();
  uint64_t key = 0;
  ASSERT_NE(mrc_seg_alloc_registered(s, 100, 0, &key), nullptr);
  EXPECT_EQ(key, mrc_region_key(r));
  mrc_put(cache_, r);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
}

// A plugin that refuses every registration and says why.
mrc_status_t refuse_with_cause(void *, void *, size_t, unsigned, void **, uint64_t *) {
  mrc_backend_set_error("refusing", "the device has no room left (test)");
  return MRC_ERR_BACKEND;
}

TEST_F(SegRegister, AFailedRegistrationKeepsTheBackendsCause) {
  mrc_backend_t refusing{};
  refusing.struct_size = sizeof refusing;
  refusing.name = "refusing";
  refusing.reg = refuse_with_cause;
  mrc_cache_params_t cp;
  mrc_cache_params_init(&cp);
  cp.backend = &refusing;
  mrc_cache_t *cache = nullptr;
  ASSERT_EQ(mrc_cache_create(&cp, &cache), MRC_OK);
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(domain_, "refused", 1 << 20, MRC_SEG_HEAP, &s), MRC_OK);
  mrc_region_t *r = nullptr;
  EXPECT_EQ(mrc_seg_register(s, cache, &r), MRC_ERR_BACKEND);
  const std::string why = mrc_last_error();
  EXPECT_NE(why.find("registering the segment"), std::string::npos) << why;
  EXPECT_NE(why.find("the device has no room left (test)"), std::string::npos) << why;
  EXPECT_EQ(why, mrc_seg_last_error());
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  mrc_cache_destroy(cache);
}

}  // namespace
