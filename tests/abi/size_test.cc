// SPDX-License-Identifier: BSD-3-Clause
// The size rule of the growing structs (include/mrcache/mrcache.h, top), for each kind: output
// structs filled through a size argument (mrc_stats_t, mrc_monitor_info_t) and input structs
// that carry struct_size (mrc_cache_params_t, mrc_seg_domain_params_t, mrc_seg_params_t, the
// plugin ops table mrc_backend_t).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "mrcache/mrcache.h"

namespace {

constexpr unsigned char kFill = 0xa5;

struct CacheGuard {
  mrc_cache_t *cache = nullptr;
  ~CacheGuard() {
    if (cache != nullptr) mrc_cache_destroy(cache);
  }
};

// A cache that has served one get, so that its statistics are not all zero.
void make_cache(CacheGuard *guard) {
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  ASSERT_EQ(mrc_cache_create(&params, &guard->cache), MRC_OK);
  static char buffer[4096];
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(guard->cache, buffer, sizeof buffer, MRC_PROT_READ, &region), MRC_OK);
  mrc_put(guard->cache, region);
}

bool all_equal(const unsigned char *p, size_t n, unsigned char value) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != value) return false;
  }
  return true;
}

TEST(AbiSize, InitSetsStructSize) {
  mrc_cache_params_t params;
  std::memset(&params, 0, sizeof params);
  mrc_cache_params_init(&params);
  EXPECT_EQ(params.struct_size, sizeof params);
  char err[64];
  std::memset(&params, 0, sizeof params);
  ASSERT_EQ(mrc_cache_params_init_checked(&params, err, sizeof err), MRC_OK);
  EXPECT_EQ(params.struct_size, sizeof params);
  EXPECT_GE(sizeof params, MRC_CACHE_PARAMS_SIZE_0_2);
}

TEST(AbiSize, StatsSmallerSizeWritesOnlyWhatFits) {
  CacheGuard guard;
  ASSERT_NO_FATAL_FAILURE(make_cache(&guard));
  std::vector<unsigned char> buf(sizeof(mrc_stats_t) + 64, kFill);
  ASSERT_EQ(mrc_cache_stats_sized(guard.cache, reinterpret_cast<mrc_stats_t *>(buf.data()),
                                  MRC_STATS_SIZE_0_1),
            MRC_OK);
  mrc_stats_t stats;
  std::memcpy(&stats, buf.data(), sizeof stats);
  EXPECT_EQ(stats.gets, 1u);
  EXPECT_EQ(stats.puts, 1u);
  EXPECT_TRUE(all_equal(buf.data() + MRC_STATS_SIZE_0_1, buf.size() - MRC_STATS_SIZE_0_1, kFill))
      << "wrote past the size the caller gave";
}

TEST(AbiSize, StatsLargerSizeZeroesTheUnknownTail) {
  CacheGuard guard;
  ASSERT_NO_FATAL_FAILURE(make_cache(&guard));
  std::vector<unsigned char> buf(sizeof(mrc_stats_t) + 64, kFill);
  ASSERT_EQ(
      mrc_cache_stats_sized(guard.cache, reinterpret_cast<mrc_stats_t *>(buf.data()), buf.size()),
      MRC_OK);
  mrc_stats_t stats;
  std::memcpy(&stats, buf.data(), sizeof stats);
  EXPECT_EQ(stats.gets, 1u);
  EXPECT_TRUE(all_equal(buf.data() + sizeof stats, 64, 0));
}

TEST(AbiSize, StatsBadSizeChangesNothing) {
  CacheGuard guard;
  ASSERT_NO_FATAL_FAILURE(make_cache(&guard));
  std::vector<unsigned char> buf(sizeof(mrc_stats_t), kFill);
  auto *stats = reinterpret_cast<mrc_stats_t *>(buf.data());
  EXPECT_EQ(mrc_cache_stats_sized(guard.cache, stats, 0), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_cache_stats_sized(guard.cache, stats, MRC_STATS_SIZE_0_1 - 1), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_cache_stats_sized(guard.cache, stats, sizeof(uint64_t)), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_last_error()).find("size 8"), std::string::npos) << mrc_last_error();
  // A garbage size (an uninitialised variable): refused, not a tail to zero past the struct.
  for (size_t garbage : {size_t{4097}, size_t{1} << 40, static_cast<size_t>(-1)}) {
    SCOPED_TRACE(garbage);
    EXPECT_EQ(mrc_cache_stats_sized(guard.cache, stats, garbage), MRC_ERR_INVALID);
    EXPECT_NE(std::string(mrc_last_error()).find("at most 4096"), std::string::npos)
        << mrc_last_error();
  }
  EXPECT_TRUE(all_equal(buf.data(), buf.size(), kFill));
  // The inline wrapper passes the caller's sizeof.
  mrc_stats_t whole;
  ASSERT_EQ(mrc_cache_stats(guard.cache, &whole), MRC_OK);
  EXPECT_EQ(whole.gets, 1u);
}

TEST(AbiSize, MonitorInfoSizes) {
  mrc_monitor_info_t reference;
  ASSERT_EQ(mrc_monitor_info(&reference), MRC_OK);
  ASSERT_NE(reference.mode_name, nullptr);

  std::vector<unsigned char> buf(sizeof(mrc_monitor_info_t) + 64, kFill);
  auto *info = reinterpret_cast<mrc_monitor_info_t *>(buf.data());
  EXPECT_EQ(mrc_monitor_info_sized(info, 0), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_monitor_info_sized(info, MRC_MONITOR_INFO_SIZE_0_1 - 1), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_last_error()).find("mrc_monitor_info: size"), std::string::npos)
      << mrc_last_error();
  for (size_t garbage : {size_t{4097}, size_t{1} << 40, static_cast<size_t>(-1)}) {
    SCOPED_TRACE(garbage);
    EXPECT_EQ(mrc_monitor_info_sized(info, garbage), MRC_ERR_INVALID);
    EXPECT_NE(std::string(mrc_last_error()).find("at most 4096"), std::string::npos)
        << mrc_last_error();
  }
  EXPECT_TRUE(all_equal(buf.data(), buf.size(), kFill)) << "a refused size changed the struct";
  EXPECT_EQ(mrc_monitor_info_sized(nullptr, sizeof *info), MRC_ERR_INVALID);
  EXPECT_STREQ(mrc_last_error(), "mrc_monitor_info: info is NULL");

  ASSERT_EQ(mrc_monitor_info_sized(info, MRC_MONITOR_INFO_SIZE_0_1), MRC_OK);
  EXPECT_EQ(info->mode, reference.mode);
  EXPECT_TRUE(all_equal(buf.data() + MRC_MONITOR_INFO_SIZE_0_1,
                        buf.size() - MRC_MONITOR_INFO_SIZE_0_1, kFill));

  std::fill(buf.begin(), buf.end(), kFill);
  ASSERT_EQ(mrc_monitor_info_sized(info, buf.size()), MRC_OK);
  EXPECT_STREQ(info->mode_name, reference.mode_name);
  EXPECT_TRUE(all_equal(buf.data() + sizeof(mrc_monitor_info_t), 64, 0));
}

// A caller built against a later mrcache.h, whose params have a field this library lacks.
struct FutureParams {
  mrc_cache_params_t known;
  uint64_t future_field;
};

TEST(AbiSize, ParamsStructSizeRule) {
  FutureParams p;
  std::memset(&p, 0, sizeof p);
  mrc_cache_params_init(&p.known);
  mrc_cache_t *cache = nullptr;

  p.known.struct_size = 0;
  EXPECT_EQ(mrc_cache_create(&p.known, &cache), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_last_error()).find("struct_size 0"), std::string::npos)
      << mrc_last_error();
  p.known.struct_size = MRC_CACHE_PARAMS_SIZE_0_2 - 1;
  EXPECT_EQ(mrc_cache_create(&p.known, &cache), MRC_ERR_INVALID);
  p.known.struct_size = static_cast<size_t>(-1);  // never initialised: not scanned for zeros
  EXPECT_EQ(mrc_cache_create(&p.known, &cache), MRC_ERR_INVALID);
  EXPECT_EQ(cache, nullptr);

  // The first sized layout without its trailing padding: every field is there.
  p.known.struct_size = MRC_CACHE_PARAMS_SIZE_0_2;
  ASSERT_EQ(mrc_cache_create(&p.known, &cache), MRC_OK);
  mrc_cache_destroy(cache);
  cache = nullptr;

  p.known.struct_size = sizeof p;
  p.future_field = 0;  // a later field left at its default: fine
  ASSERT_EQ(mrc_cache_create(&p.known, &cache), MRC_OK);
  mrc_cache_destroy(cache);
  cache = nullptr;

  p.future_field = 1;  // asks for something this library cannot do
  EXPECT_EQ(mrc_cache_create(&p.known, &cache), MRC_ERR_INVALID);
  EXPECT_EQ(cache, nullptr);
}

struct FutureDomainParams {
  mrc_seg_domain_params_t known;
  uint64_t future_field;
};

TEST(AbiSize, SegDomainParamsStructSizeRule) {
  FutureDomainParams p;
  std::memset(&p, 0, sizeof p);
  mrc_seg_domain_params_init(&p.known);
  EXPECT_EQ(p.known.struct_size, sizeof p.known);
  const std::string prefix = "mrc-abi-size-" + std::to_string(getpid());
  p.known.prefix = prefix.c_str();
  p.known.size = 1ull << 30;
  mrc_seg_domain_t *domain = nullptr;

  p.known.struct_size = 0;
  EXPECT_EQ(mrc_seg_domain_open(&p.known, &domain), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("struct_size"), std::string::npos);
  p.known.struct_size = MRC_SEG_DOMAIN_PARAMS_SIZE_0_2 - 1;
  EXPECT_EQ(mrc_seg_domain_inspect(&p.known, &domain), MRC_ERR_INVALID);
  p.known.struct_size = sizeof p;
  p.future_field = 1;
  EXPECT_EQ(mrc_seg_domain_open(&p.known, &domain), MRC_ERR_INVALID);
  EXPECT_EQ(domain, nullptr);

  p.future_field = 0;
  ASSERT_EQ(mrc_seg_domain_open(&p.known, &domain), MRC_OK);
  mrc_seg_domain_info_t info;
  ASSERT_EQ(mrc_seg_domain_info(domain, &info), MRC_OK);
  EXPECT_EQ(info.size, 1ull << 30);
  EXPECT_EQ(mrc_seg_domain_close(domain), MRC_OK);
  unsigned removed = 0;
  EXPECT_EQ(mrc_seg_domain_remove(&p.known, &removed), MRC_OK);
}

struct FutureSegParams {
  mrc_seg_params_t known;
  uint64_t future_field;
};

// mrc_seg_params_t: the same rule for mrc_seg_open_ex and mrc_seg_memfd_create.
TEST(AbiSize, SegParamsStructSizeRule) {
  FutureSegParams p;
  std::memset(&p, 0, sizeof p);
  mrc_seg_params_init(&p.known);
  EXPECT_EQ(p.known.struct_size, sizeof p.known);
  EXPECT_EQ(p.known.numa_node, -1);
  p.known.name = "sized";
  p.known.size = 1u << 20;
  p.known.flags = MRC_SEG_HEAP;

  mrc_seg_domain_params_t dp;
  mrc_seg_domain_params_init(&dp);
  const std::string prefix = "mrc-abi-seg-size-" + std::to_string(getpid());
  dp.prefix = prefix.c_str();
  dp.size = 1ull << 30;
  mrc_seg_domain_t *domain = nullptr;
  ASSERT_EQ(mrc_seg_domain_open(&dp, &domain), MRC_OK) << mrc_last_error();

  for (int memfd = 0; memfd <= 1; ++memfd) {
    SCOPED_TRACE(memfd != 0 ? "mrc_seg_memfd_create" : "mrc_seg_open_ex");
    auto open = [&](mrc_seg_t **seg) {
      return memfd != 0 ? mrc_seg_memfd_create(&p.known, seg)
                        : mrc_seg_open_ex(domain, &p.known, seg);
    };
    mrc_seg_t *seg = nullptr;
    p.known.struct_size = 0;
    EXPECT_EQ(open(&seg), MRC_ERR_INVALID);
    EXPECT_NE(std::string(mrc_last_error()).find("struct_size"), std::string::npos)
        << mrc_last_error();
    p.known.struct_size = MRC_SEG_PARAMS_SIZE_0_2 - 1;
    EXPECT_EQ(open(&seg), MRC_ERR_INVALID);
    p.known.struct_size = sizeof p;
    p.future_field = 1;  // asks for something this library cannot do
    EXPECT_EQ(open(&seg), MRC_ERR_INVALID);
    EXPECT_EQ(seg, nullptr);

    p.future_field = 0;  // a larger struct with a zero tail is accepted
    ASSERT_EQ(open(&seg), MRC_OK) << mrc_last_error();
    mrc_seg_info_t info;
    ASSERT_EQ(mrc_seg_info(seg, &info), MRC_OK);
    EXPECT_EQ(info.size, 1u << 20);
    EXPECT_EQ(info.flags, static_cast<unsigned>(MRC_SEG_HEAP));
    EXPECT_NE(mrc_seg_alloc(seg, 4096, 0), nullptr);
    EXPECT_EQ(mrc_seg_close(seg), MRC_OK);
    p.known.struct_size = sizeof p.known;
  }
  EXPECT_EQ(mrc_seg_domain_close(domain), MRC_OK);
  unsigned removed = 0;
  EXPECT_EQ(mrc_seg_domain_remove(&dp, &removed), MRC_OK);
}

// A plugin built against a later mrcache.h, whose ops table has a field this library lacks.
struct FutureBackend {
  mrc_backend_t known;
  uint64_t future_field;
};

mrc_status_t serial_reg(void *ctx, void *, size_t, unsigned, void **handle, uint64_t *key) {
  auto *serial = static_cast<uint64_t *>(ctx);
  *handle = nullptr;
  *key = 9000 + (*serial)++;
  return MRC_OK;
}

// A cache on `table`: MRC_OK only if it serves a get through the table's reg. A refusal that
// still wrote the cache's output reads as MRC_ERR_EXISTS.
mrc_status_t create_and_get(const mrc_backend_t *table) {
  static uint64_t serial = 0;
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = table;
  params.backend_ctx = &serial;
  mrc_cache_t *cache = nullptr;
  if (mrc_status_t status = mrc_cache_create(&params, &cache); status != MRC_OK)
    return cache == nullptr ? status : MRC_ERR_EXISTS;
  static char buffer[4096];
  mrc_region_t *region = nullptr;
  mrc_status_t status = mrc_get(cache, buffer, sizeof buffer, MRC_PROT_READ, &region);
  if (status == MRC_OK) {
    if (mrc_region_key(region) < 9000) status = MRC_ERR_BACKEND;  // not the plugin's key
    mrc_put(cache, region);
  }
  mrc_cache_destroy(cache);
  return status;
}

TEST(AbiSize, BuiltInBackendTablesCarryTheirSize) {
  for (const mrc_backend_t *table :
       {mrc_backend_null(), mrc_backend_iouring(), mrc_backend_verbs()}) {
    ASSERT_NE(table, nullptr);
    EXPECT_EQ(table->struct_size, sizeof(mrc_backend_t)) << table->name;
  }
  EXPECT_GE(sizeof(mrc_backend_t), MRC_BACKEND_SIZE_0_2);
}

// mrc_cache_create reads params.backend by its struct_size; so does mrc_backend_complete, which
// writes its output with the same size.
TEST(AbiSize, BackendStructSizeRule) {
  FutureBackend p;
  std::memset(&p, 0, sizeof p);
  p.known.struct_size = sizeof p.known;
  p.known.name = "future";
  p.known.reg = serial_reg;
  ASSERT_EQ(create_and_get(&p.known), MRC_OK) << mrc_last_error();

  // Refused, and nothing changed: no cache, the output table untouched.
  FutureBackend out;
  EXPECT_EQ(mrc_backend_complete(nullptr, &out.known), MRC_ERR_INVALID);
  EXPECT_STREQ(mrc_last_error(), "mrc_backend_complete: in is NULL");
  EXPECT_EQ(mrc_backend_complete(&p.known, nullptr), MRC_ERR_INVALID);
  EXPECT_STREQ(mrc_last_error(), "mrc_backend_complete: out is NULL");
  for (size_t bad : {size_t{0}, MRC_BACKEND_SIZE_0_2 - 1, sizeof(void *),
                     static_cast<size_t>(-1) /* never initialised: not scanned for zeros */}) {
    SCOPED_TRACE(bad);
    p.known.struct_size = bad;
    EXPECT_EQ(create_and_get(&p.known), MRC_ERR_INVALID);
    EXPECT_NE(std::string(mrc_last_error()).find("struct_size"), std::string::npos)
        << mrc_last_error();
    std::memset(&out, kFill, sizeof out);
    EXPECT_EQ(mrc_backend_complete(&p.known, &out.known), MRC_ERR_INVALID);
    EXPECT_NE(std::string(mrc_last_error()).find("struct_size"), std::string::npos);
    EXPECT_TRUE(all_equal(reinterpret_cast<unsigned char *>(&out), sizeof out, kFill));
  }

  // The first sized layout: every field is there; the output is written up to it, not past.
  p.known.struct_size = MRC_BACKEND_SIZE_0_2;
  EXPECT_EQ(create_and_get(&p.known), MRC_OK) << mrc_last_error();
  std::memset(&out, kFill, sizeof out);
  ASSERT_EQ(mrc_backend_complete(&p.known, &out.known), MRC_OK);
  EXPECT_EQ(out.known.struct_size, MRC_BACKEND_SIZE_0_2);
  EXPECT_STREQ(out.known.name, "future");
  EXPECT_EQ(out.known.reg, &serial_reg);
  EXPECT_NE(out.known.dereg, nullptr);
  EXPECT_NE(out.known.describe, nullptr);
  EXPECT_TRUE(all_equal(reinterpret_cast<unsigned char *>(&out) + MRC_BACKEND_SIZE_0_2,
                        sizeof out - MRC_BACKEND_SIZE_0_2, kFill))
      << "wrote past the caller's struct_size";

  // Larger, with the unknown tail zero: accepted; the output's unknown tail is zeroed.
  p.known.struct_size = sizeof p;
  p.future_field = 0;
  EXPECT_EQ(create_and_get(&p.known), MRC_OK) << mrc_last_error();
  std::memset(&out, kFill, sizeof out);
  ASSERT_EQ(mrc_backend_complete(&p.known, &out.known), MRC_OK);
  EXPECT_EQ(out.known.struct_size, sizeof p);
  EXPECT_EQ(out.known.reg, &serial_reg);
  EXPECT_EQ(out.future_field, 0u);
  // In place, the same table: completing it again changes nothing.
  const FutureBackend before = out;
  ASSERT_EQ(mrc_backend_complete(&out.known, &out.known), MRC_OK);
  EXPECT_EQ(std::memcmp(&before, &out, sizeof out), 0);

  // Larger, with a field this library cannot honour: refused, nothing changed.
  p.future_field = 1;
  EXPECT_EQ(create_and_get(&p.known), MRC_ERR_INVALID);
  std::memset(&out, kFill, sizeof out);
  EXPECT_EQ(mrc_backend_complete(&p.known, &out.known), MRC_ERR_INVALID);
  EXPECT_TRUE(all_equal(reinterpret_cast<unsigned char *>(&out), sizeof out, kFill));
}

}  // namespace
