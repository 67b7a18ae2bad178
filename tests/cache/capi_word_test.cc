// SPDX-License-Identifier: BSD-3-Clause
// The C API keeps its word: misuse the header names is refused with a status and a
// reason, or, where a call returns nothing (mrc_put), with a message at MRC_LOG_ERROR through the
// log handler; never a silent corruption, never a print of its own.
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cache_fixture.h"
#include "mrcache/mrcache.h"

namespace {

using mrc::test::CacheFixture;
using mrc::test::kPage;
using mrc::test::map_pages;
using mrc::test::monitor_caches;

// Collects what the library logs while it lives; stderr is not touched meanwhile.
class LogCapture {
 public:
  LogCapture() { mrc_set_log_handler(&LogCapture::handle, this); }
  ~LogCapture() { mrc_set_log_handler(nullptr, nullptr); }
  LogCapture(const LogCapture &) = delete;
  LogCapture &operator=(const LogCapture &) = delete;

  std::vector<std::pair<mrc_log_level_t, std::string>> messages() {
    std::lock_guard lock(mutex_);
    return messages_;
  }
  size_t count(mrc_log_level_t level, const std::string &part) {
    size_t n = 0;
    for (const auto &[l, text] : messages())
      n += l == level && text.find(part) != std::string::npos;
    return n;
  }

 private:
  static void handle(void *arg, mrc_log_level_t level, const char *message) {
    auto *self = static_cast<LogCapture *>(arg);
    std::lock_guard lock(self->mutex_);
    self->messages_.emplace_back(level, message);
  }
  std::mutex mutex_;
  std::vector<std::pair<mrc_log_level_t, std::string>> messages_;
};

using CapiWord = CacheFixture;

// A second mrc_put of one reference used to drop the table's own reference: the region was
// deregistered and recycled while the page table still handed it out. It is refused now, logged
// at error level, and the region stays cached and registered.
TEST_F(CapiWord, SecondPutOfACachedRegionIsRefused) {
  if (!monitor_caches()) GTEST_SKIP() << "no userfaultfd here: nothing is cached";
  ASSERT_EQ(create(backend.params("twice")), MRC_OK);
  char *p = map_pages(4);
  ASSERT_NE(p, nullptr);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &region), MRC_OK);
  const uint64_t key = mrc_region_key(region);
  mrc_put(cache, region);
  {
    LogCapture log;
    testing::internal::CaptureStderr();
    mrc_put(cache, region);  // the misuse: no reference held any more
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
    EXPECT_EQ(log.count(MRC_LOG_ERROR, "refused"), 1u);
    EXPECT_EQ(log.messages().size(), 1u);
  }
  EXPECT_EQ(backend.deregs.load(), 0u) << "the second put ended the cached registration";
  EXPECT_EQ(stats().regions, 1u);
  // The table still hands out the same, live registration.
  for (int i = 0; i < 3; ++i) {
    mrc_region_t *again = nullptr;
    ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &again), MRC_OK);
    EXPECT_EQ(again, region);
    EXPECT_EQ(mrc_region_key(again), key);
    mrc_put(cache, again);
  }
  EXPECT_EQ(backend.regs.load(), 1u);
  EXPECT_EQ(backend.deregs.load(), 0u);
  // The memory still goes away as usual: the unmap invalidates the region once.
  munmap(p, 4 * kPage);
  EXPECT_EQ(stats().regions, 0u);
  EXPECT_EQ(backend.deregs.load(), 1u);
}

// The same misuse on a hot region: its put parks the reference (no locked instruction, so drop()
// never sees it). A second put used to park a reference no one held; the next two gets then
// both took one back, two holders of one reference, and the first put after an unmap
// deregistered the region under the second. Refused and logged now, like the cached case.
TEST_F(CapiWord, SecondPutOfAParkedReferenceIsRefused) {
  if (!monitor_caches()) GTEST_SKIP() << "no userfaultfd here: nothing is cached";
  ASSERT_EQ(create(backend.params("twice-parked")), MRC_OK);
  char *p = map_pages(4);
  ASSERT_NE(p, nullptr);
  mrc_region_t *region = nullptr;
  for (int i = 0; i < 32; ++i) {  // hot: promoted, its puts park (parking_test.cc)
    ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &region), MRC_OK);
    mrc_put(cache, region);
  }
  ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &region), MRC_OK);
  mrc_put(cache, region);
  {
    LogCapture log;
    mrc_put(cache, region);  // the misuse
    EXPECT_EQ(log.count(MRC_LOG_ERROR, "refused"), 1u);
  }
  mrc_region_t *first = nullptr, *second = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &first), MRC_OK);
  ASSERT_EQ(mrc_get(cache, p, 4 * kPage, MRC_PROT_READ, &second), MRC_OK);
  ASSERT_EQ(first, region);
  ASSERT_EQ(second, region);
  munmap(p, 4 * kPage);
  stats();  // drains the unmap: invalid now, registered while references are held
  EXPECT_EQ(backend.deregs.load(), 0u);
  mrc_put(cache, first);
  EXPECT_EQ(backend.deregs.load(), 0u) << "deregistered while `second` still holds it";
  mrc_put(cache, second);
  EXPECT_EQ(backend.deregs.load(), 1u);
  EXPECT_EQ(stats().regions, 0u);
}

// A plugin is C: its reg may return any int. Whatever is not an mrc_status_t reaches the caller
// as MRC_ERR_BACKEND, with the value in mrc_last_error().
int g_reg_result = 0;
mrc_status_t odd_reg(void *, void *, size_t, unsigned, void **, uint64_t *) {
  // Any value, as a C plugin may return. A conversion, never a load of an enum object holding
  // it (UBSan's enum check would stop the test, not the library).
  return static_cast<mrc_status_t>(g_reg_result);
}

TEST(CapiWordPlugin, RegResultThatIsNoStatusIsABackendError) {
  static const mrc_backend_t kOdd = {.struct_size = sizeof(mrc_backend_t),
                                     .name = "odd",
                                     .reg = odd_reg,
                                     .dereg = nullptr,
                                     .describe = nullptr};
  char *p = map_pages(1);
  ASSERT_NE(p, nullptr);
  for (int raw : {42, 1, -9, -1000, 0x7fffffff}) {
    SCOPED_TRACE(raw);
    g_reg_result = raw;
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    params.backend = &kOdd;
    mrc_cache_t *cache = nullptr;
    ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK);
    mrc_region_t *region = nullptr;
    const mrc_status_t status = mrc_get(cache, p, kPage, MRC_PROT_READ, &region);
    EXPECT_EQ(static_cast<int>(status), static_cast<int>(MRC_ERR_BACKEND));
    EXPECT_EQ(region, nullptr);
    const std::string why = mrc_last_error();
    EXPECT_NE(why.find("odd: reg returned " + std::to_string(raw)), std::string::npos) << why;
    mrc_cache_destroy(cache);
  }
  // A status, failing or not, passes unchanged.
  g_reg_result = MRC_ERR_NO_MEMORY;
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = &kOdd;
  mrc_cache_t *cache = nullptr;
  ASSERT_EQ(mrc_cache_create(&params, &cache), MRC_OK);
  mrc_region_t *region = nullptr;
  EXPECT_EQ(mrc_get(cache, p, kPage, MRC_PROT_READ, &region), MRC_ERR_NO_MEMORY);
  mrc_cache_destroy(cache);
  munmap(p, kPage);
}

// mrc_cache_create returned params->env_status verbatim: 42 from a struct not filled by
// mrc_cache_params_init. Only statuses pass; anything else is MRC_ERR_INVALID with a reason.
TEST(CapiWordCreate, UnknownEnvStatusIsRefused) {
  for (int raw : {42, 1, -9, -12345}) {
    SCOPED_TRACE(raw);
    mrc_cache_params_t params;
    mrc_cache_params_init(&params);
    std::memcpy(&params.env_status, &raw, sizeof raw);
    mrc_cache_t *cache = nullptr;
    const mrc_status_t status = mrc_cache_create(&params, &cache);
    EXPECT_EQ(static_cast<int>(status), static_cast<int>(MRC_ERR_INVALID));
    EXPECT_EQ(cache, nullptr);
    const std::string why = mrc_last_error();
    EXPECT_NE(why.find("env_status " + std::to_string(raw)), std::string::npos) << why;
  }
  // A status that mrc_cache_params_init records is returned, with the reason.
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.env_status = MRC_ERR_INVALID;
  mrc_cache_t *cache = nullptr;
  EXPECT_EQ(mrc_cache_create(&params, &cache), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_last_error()).find("MRC_* variable"), std::string::npos)
      << mrc_last_error();
}

// mrc_put of another cache's region: refused, reported once at MRC_LOG_ERROR through the log
// handler (the level mrcache.h names for mrc_put's misuse), nothing on stderr, nothing changed.
TEST_F(CapiWord, PutOfAnotherCachesRegionGoesToTheLogHandler) {
  ASSERT_EQ(create(backend.params("owner")), MRC_OK);
  mrc_cache_params_t other_params = backend.params("other");
  mrc_cache_t *other = nullptr;
  ASSERT_EQ(mrc_cache_create(&other_params, &other), MRC_OK);
  char *p = map_pages(2);
  ASSERT_NE(p, nullptr);
  mrc_region_t *region = nullptr;
  ASSERT_EQ(mrc_get(cache, p, 2 * kPage, MRC_PROT_READ, &region), MRC_OK);
  {
    LogCapture log;
    testing::internal::CaptureStderr();
    mrc_put(other, region);
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
    ASSERT_EQ(log.messages().size(), 1u);
    EXPECT_EQ(log.messages()[0].first, MRC_LOG_ERROR);
    EXPECT_NE(log.messages()[0].second.find("other"), std::string::npos);
    EXPECT_NE(log.messages()[0].second.find("owner"), std::string::npos);
  }
  EXPECT_EQ(backend.deregs.load(), 0u);
  mrc_put(cache, region);  // the reference was still the caller's
  mrc_cache_destroy(other);
  munmap(p, 2 * kPage);
}

// The cache's own refusals say why in mrc_last_error(), as the segment calls do.
TEST_F(CapiWord, BadArgumentsSayWhyInLastError) {
  ASSERT_EQ(create(backend.params("args")), MRC_OK);
  char *p = map_pages(1);
  ASSERT_NE(p, nullptr);
  mrc_region_t *region = nullptr;
  mrc_cache_t *none = nullptr;
  mrc_stats_t s;
  char json[8];
  mrc_cache_params_t flags = backend.params("flags");
  flags.flags = 0x100;
  mrc_cache_params_t align = backend.params("align");
  align.alignment = 12345;
  const unsigned r = MRC_PROT_READ;
  const std::vector<std::pair<std::function<int()>, const char *>> cases = {
      {[&] { return mrc_get(nullptr, p, kPage, r, &region); }, "mrc_get: cache is NULL"},
      {[&] { return mrc_get(cache, nullptr, kPage, r, &region); }, "mrc_get: addr is NULL"},
      {[&] { return mrc_get(cache, p, kPage, r, nullptr); }, "mrc_get: out is NULL"},
      {[&] { return mrc_get(cache, p, 0, r, &region); }, "mrc_get: the length is 0"},
      {[&] { return mrc_get(cache, p, kPage, 0, &region); }, "mrc_get: prot is not"},
      {[&] { return mrc_get(cache, p, kPage, 8, &region); }, "mrc_get: prot is not"},
      {[&] { return mrc_get(cache, p, ~size_t{0}, r, &region); }, "wraps around"},
      {[&] { return mrc_get_aligned(cache, p, kPage, 3, r, &region); }, "the alignment is not"},
      {[&] { return mrc_invalidate(cache, nullptr, nullptr, nullptr); },
       "mrc_invalidate: region is NULL"},
      {[&] { return mrc_invalidate(nullptr, nullptr, nullptr, nullptr); },
       "mrc_invalidate: cache is NULL"},
      {[&] { return mrc_cache_stats(nullptr, &s); }, "mrc_cache_stats: cache is NULL"},
      {[&] { return mrc_cache_stats_sized(cache, &s, 8); }, "mrc_cache_stats: size 8"},
      {[&] { return mrc_cache_stats_json(nullptr, json, sizeof json); },
       "mrc_cache_stats_json: cache is NULL"},
      {[&] { return mrc_cache_purge(nullptr); }, "mrc_cache_purge: cache is NULL"},
      {[&] { return mrc_cache_create(nullptr, &none); }, "mrc_cache_create: params is NULL"},
      {[&] { return mrc_cache_params_init_checked(nullptr, nullptr, 0); },
       "mrc_cache_params_init_checked: params is NULL"},
      {[&] { return mrc_cache_create(&flags, &none); }, "mrc_cache_create: unknown flags 0x100"},
      {[&] { return mrc_cache_create(&align, &none); }, "mrc_cache_create: alignment 12345"},
  };
  for (const auto &[call, expected] : cases) {
    SCOPED_TRACE(expected);
    mrc_backend_set_error("before", "something else");  // each refusal must write its own text
    EXPECT_EQ(call(), MRC_ERR_INVALID);
    EXPECT_NE(std::string(mrc_last_error()).find(expected), std::string::npos) << mrc_last_error();
  }
  EXPECT_EQ(none, nullptr);
  munmap(p, kPage);
}

}  // namespace
