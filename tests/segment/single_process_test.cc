// SPDX-License-Identifier: BSD-3-Clause
// Shared segments inside one process: parameters and names, create/open/close, the page bitmap,
// the heap, descriptions, refusals (hostile headers, foreign owners, occupied windows), join
// timeouts, NUMA, huge pages and memfd segments.
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/segment/domain.h"
#include "core/segment/internal/sys.h"
#include "core/segment/layout.h"
#include "mrcache/mrcache.h"
#include "seg_test_util.h"
#include "tests/common/fork_child.h"

namespace {

using segtest::shm_files;

class SegTest : public ::testing::Test {
 protected:
  void SetUp() override { prefix_ = segtest::unique_prefix("u"); }
  void TearDown() override {
    segtest::remove_shm(prefix_);
    EXPECT_TRUE(shm_files(prefix_).empty());
  }
  mrc_seg_domain_params_t params() const {
    mrc_seg_domain_params_t p;
    mrc_seg_domain_params_init(&p);
    p.prefix = prefix_.c_str();
    p.size = 4ULL << 30;
    p.join_timeout_ms = 2000;
    return p;
  }
  mrc_seg_domain_t *open() {
    const mrc_seg_domain_params_t p = params();
    mrc_seg_domain_t *d = nullptr;
    EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK) << mrc_seg_last_error();
    return d;
  }
  static mode_t file_mode(const std::string &name) {
    struct stat st {};
    EXPECT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0) << name;
    return st.st_mode & 07777;
  }
  std::string prefix_;
};

TEST_F(SegTest, BadNamesAreInvalidAndChangeNothing) {
  mrc_seg_domain_t *d = open();
  ASSERT_NE(d, nullptr);
  const std::vector<std::string> bad = {
      "", "a/b", "..", ".", "a b", "a:b", "\xc3\xa4", "a\nb", std::string(64, 'x'), "../etc"};
  for (const auto &name : bad) {
    mrc_seg_t *s = nullptr;
    EXPECT_EQ(mrc_seg_open(d, name.c_str(), 4096, 0, &s), MRC_ERR_INVALID) << name;
    EXPECT_EQ(s, nullptr);
  }
  mrc_seg_t *s = nullptr;
  EXPECT_EQ(mrc_seg_open(d, nullptr, 4096, 0, &s), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_open(d, std::string(63, 'y').c_str(), 4096, 0, &s), MRC_OK);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(shm_files(prefix_).size(), 1u);  // only the root
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);

  for (const auto &prefix : bad) {
    mrc_seg_domain_params_t p = params();
    p.prefix = prefix.c_str();
    mrc_seg_domain_t *x = nullptr;
    EXPECT_EQ(mrc_seg_domain_open(&p, &x), MRC_ERR_INVALID) << prefix;
    EXPECT_EQ(x, nullptr);
  }
}

TEST_F(SegTest, BadParamsAreInvalid) {
  mrc_seg_domain_t *d = nullptr;
  EXPECT_EQ(mrc_seg_domain_open(nullptr, &d), MRC_ERR_INVALID);
  auto expect_invalid = [&](mrc_seg_domain_params_t p) {
    EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_INVALID) << mrc_seg_last_error();
  };
  mrc_seg_domain_params_t p = params();
  p.mode = 0666;  // world-writable
  expect_invalid(p);
  p.mode = 0400;  // the owner cannot write
  expect_invalid(p);
  p.mode = 01600;
  expect_invalid(p);
  p = params();
  p.base = 0x580000001000ULL;  // not 2 MiB aligned
  expect_invalid(p);
  p = params();
  p.size = (1 << 21) + 4096;
  expect_invalid(p);
  p.size = 1ULL << 40;  // more than the bitmap covers
  expect_invalid(p);
  p = params();
  p.base = 0x7fffffe00000ULL;  // the window would leave user space
  expect_invalid(p);
  EXPECT_TRUE(shm_files(prefix_).empty());

  d = open();
  mrc_seg_t *s = nullptr;
  EXPECT_EQ(mrc_seg_open(d, "x", 4096, 0x4000, &s), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_open(d, "x", 4096, MRC_SEG_NODATA | MRC_SEG_HEAP, &s), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_open(d, "x", 4096, MRC_SEG_EXCL | MRC_SEG_NOCREATE, &s), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_open(d, "x", 4096, MRC_SEG_FILE, &s), MRC_ERR_INVALID);  // no backing file
  EXPECT_EQ(mrc_seg_open(d, "x", 0, 0, &s), MRC_ERR_INVALID);  // creating needs a size
  EXPECT_EQ(mrc_seg_open(d, "x", 4096, MRC_SEG_HUGETLB, &s), MRC_ERR_UNSUPPORTED);
  EXPECT_EQ(shm_files(prefix_).size(), 1u);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

TEST_F(SegTest, CreateOpenCloseLeavesNothing) {
  mrc_seg_domain_t *d = open();
  mrc_seg_domain_info_t di{};
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  EXPECT_EQ(di.created, 1);
  EXPECT_EQ(di.slot, 0);
  EXPECT_EQ(di.size, 4ULL << 30);
  EXPECT_GE(di.base, 0x580000000000ULL);
  EXPECT_LE(di.base + di.size, 0x5a0000000000ULL);
  EXPECT_EQ(di.base % (1ULL << 30), 0u);
  EXPECT_EQ(file_mode(prefix_ + ":root"), 0600u);

  mrc_seg_t *a = nullptr, *b = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "data", 1 << 20, MRC_SEG_HEAP, &a), MRC_OK) << mrc_seg_last_error();
  const auto base = reinterpret_cast<uintptr_t>(mrc_seg_base(a));
  EXPECT_GE(base, di.base);
  EXPECT_LT(base, di.base + di.size);
  EXPECT_EQ(mrc_seg_size(a), 1u << 20);
  std::memset(mrc_seg_base(a), 0x5a, mrc_seg_size(a));
  const auto files = shm_files(prefix_);
  ASSERT_EQ(files.size(), 2u);
  for (const auto &f : files) EXPECT_EQ(file_mode(f), 0600u) << f;

  ASSERT_EQ(mrc_seg_open(d, "data", 0, MRC_SEG_HEAP, &b), MRC_OK);  // same process: shared
  EXPECT_EQ(mrc_seg_base(b), mrc_seg_base(a));
  mrc_seg_info_t ia{}, ib{};
  ASSERT_EQ(mrc_seg_info(a, &ia), MRC_OK);
  ASSERT_EQ(mrc_seg_info(b, &ib), MRC_OK);
  EXPECT_EQ(ia.created, 1);
  EXPECT_EQ(ib.created, 0);
  EXPECT_EQ(ia.clients, 1u);
  EXPECT_STREQ(ia.name, "data");
  EXPECT_EQ(ia.generation, ib.generation);
  EXPECT_EQ(static_cast<unsigned char *>(mrc_seg_base(b))[100], 0x5a);

  EXPECT_EQ(mrc_seg_domain_close(d), MRC_ERR_BUSY);  // segments still open
  EXPECT_EQ(mrc_seg_close(a), MRC_OK);
  EXPECT_EQ(shm_files(prefix_).size(), 2u);  // b keeps it
  EXPECT_EQ(mrc_seg_close(b), MRC_OK);
  EXPECT_EQ(shm_files(prefix_).size(), 1u);
  // The range went back to a PROT_NONE reservation: still ours, not reusable by mmap.
  EXPECT_EQ(mmap(reinterpret_cast<void *>(base), 4096, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
            MAP_FAILED);
  EXPECT_EQ(errno, EEXIST);
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty()) << segtest::join(shm_files(prefix_));
}

TEST_F(SegTest, SecondOpenInOneProcessSharesTheDomain) {
  mrc_seg_domain_t *d1 = open();
  mrc_seg_domain_t *d2 = open();
  EXPECT_EQ(d1, d2);
  EXPECT_EQ(mrc_seg_domain_close(d1), MRC_OK);
  EXPECT_EQ(shm_files(prefix_).size(), 1u);
  EXPECT_EQ(mrc_seg_domain_close(d2), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

TEST_F(SegTest, ExistingSegmentRules) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *a = nullptr, *x = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "s", 8192, MRC_SEG_HEAP, &a), MRC_OK);
  EXPECT_EQ(mrc_seg_open(d, "s", 8192, 0, &x), MRC_ERR_INVALID);                // flags differ
  EXPECT_EQ(mrc_seg_open(d, "s", 1 << 20, MRC_SEG_HEAP, &x), MRC_ERR_INVALID);  // larger
  EXPECT_EQ(mrc_seg_open(d, "s", 0, MRC_SEG_HEAP | MRC_SEG_EXCL, &x), MRC_ERR_EXISTS);
  EXPECT_EQ(mrc_seg_open(d, "t", 4096, MRC_SEG_NOCREATE, &x), MRC_ERR_NOT_FOUND);
  EXPECT_EQ(x, nullptr);
  EXPECT_EQ(mrc_seg_close(a), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

TEST_F(SegTest, PagesAreFirstFitAndReused) {
  mrc_seg_domain_t *d = open();
  constexpr size_t kMiB = 1 << 20;
  mrc_seg_t *a, *b, *c, *e, *f;
  ASSERT_EQ(mrc_seg_open(d, "a", kMiB, 0, &a), MRC_OK);      // 1 page of 2 MiB
  ASSERT_EQ(mrc_seg_open(d, "b", 3 * kMiB, 0, &b), MRC_OK);  // 4 KiB header + 3 MiB: 2 pages
  ASSERT_EQ(mrc_seg_open(d, "c", kMiB, 0, &c), MRC_OK);
  mrc_seg_info_t ia, ib, ic;
  mrc_seg_info(a, &ia);
  mrc_seg_info(b, &ib);
  mrc_seg_info(c, &ic);
  const auto pa = reinterpret_cast<uintptr_t>(ia.map_base);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ib.map_base), pa + (2u << 20));
  EXPECT_EQ(ib.map_size, 4u << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ic.map_base), pa + (6u << 20));
  mrc_seg_domain_info_t di;
  mrc_seg_domain_info(d, &di);
  EXPECT_EQ(di.pages_used, 4u);
  ASSERT_EQ(mrc_seg_close(b), MRC_OK);
  ASSERT_EQ(mrc_seg_open(d, "e", 5 * kMiB, 0, &e), MRC_OK);  // 3 pages: not in b's hole
  ASSERT_EQ(mrc_seg_open(d, "f", 2 * kMiB, 0, &f), MRC_OK);  // 2 pages: b's hole
  mrc_seg_info_t ie, iff;
  mrc_seg_info(e, &ie);
  mrc_seg_info(f, &iff);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ie.map_base), pa + (8u << 20));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(iff.map_base), pa + (2u << 20));
  EXPECT_GT(iff.generation, ib.generation);  // never reused
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_OK) << mrc_seg_last_error();
  for (mrc_seg_t *s : {a, c, e, f}) EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  mrc_seg_domain_info(d, &di);
  EXPECT_EQ(di.pages_used, 0u);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

TEST_F(SegTest, WindowFullAndDirectoryFull) {
  mrc_seg_domain_params_t p = params();
  p.size = 8ULL << 20;  // 4 pages
  mrc_seg_domain_t *d = nullptr;
  ASSERT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK);
  mrc_seg_t *a = nullptr, *b = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "a", 5 << 20, 0, &a), MRC_OK);
  EXPECT_EQ(mrc_seg_open(d, "b", 3 << 20, 0, &b), MRC_ERR_NO_MEMORY);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("no room"), std::string::npos);
  EXPECT_EQ(mrc_seg_open(d, "b", 1 << 20, MRC_SEG_NODATA, &b), MRC_OK);
  EXPECT_EQ(mrc_seg_close(a), MRC_OK);
  EXPECT_EQ(mrc_seg_close(b), MRC_OK);
  std::vector<mrc_seg_t *> segs;
  for (unsigned i = 0; i < 4; ++i) {
    mrc_seg_t *s = nullptr;
    ASSERT_EQ(mrc_seg_open(d, ("n" + std::to_string(i)).c_str(), 4096, MRC_SEG_NODATA, &s), MRC_OK);
    segs.push_back(s);
  }
  mrc_seg_t *s = nullptr;
  EXPECT_EQ(mrc_seg_open(d, "n4", 4096, MRC_SEG_NODATA, &s), MRC_ERR_NO_MEMORY);
  for (mrc_seg_t *x : segs) EXPECT_EQ(mrc_seg_close(x), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

TEST_F(SegTest, NodataSegmentIsAReservedRange) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "hole", 3 << 20, MRC_SEG_NODATA, &s), MRC_OK);
  EXPECT_EQ(mrc_seg_size(s), 3u << 20);
  EXPECT_EQ(mrc_seg_alloc(s, 16, 0), nullptr);
  // Nothing in /dev/shm for it, and the range is reserved: MAP_FIXED_NOREPLACE refuses.
  EXPECT_EQ(shm_files(prefix_).size(), 1u);
  EXPECT_EQ(mmap(mrc_seg_base(s), 4096, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
            MAP_FAILED);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

TEST_F(SegTest, FileBackedData) {
  char dir[] = "/tmp/mrc-seg-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/data";
  mrc_seg_domain_t *d = open();
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "filed";
  sp.size = 10000;
  sp.flags = MRC_SEG_FILE | MRC_SEG_HEAP;
  sp.backing_file = path.c_str();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open_ex(d, &sp, &s), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(mrc_seg_size(s), 12288u);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 12288);
  auto *p = static_cast<char *>(mrc_seg_alloc(s, 100, 0));
  ASSERT_NE(p, nullptr);
  std::strcpy(p, "in the file");
  ASSERT_EQ(msync(mrc_seg_base(s), mrc_seg_size(s), MS_SYNC), 0);
  std::string content(12288, '\0');
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_EQ(pread(fd, content.data(), content.size(), 0), 12288);
  close(fd);
  EXPECT_NE(content.find("in the file"), std::string::npos);
  EXPECT_EQ(mrc_seg_heap_check(s, nullptr), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(stat(path.c_str(), &st), 0);  // never unlinked by mrcache
  // A world-writable backing file is refused.
  chmod(path.c_str(), 0666);
  EXPECT_EQ(mrc_seg_open_ex(d, &sp, &s), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  unlink(path.c_str());
  rmdir(dir);
}

TEST_F(SegTest, ThreadsShareOneDomain) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *heap = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "heap", 4 << 20, MRC_SEG_HEAP, &heap), MRC_OK);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      mrc_seg_domain_t *mine = open();  // the same domain, reference-counted
      if (mine != d) failures++;
      for (int i = 0; i < 200; ++i) {
        const std::string name = "t" + std::to_string(t) + "-" + std::to_string(i % 5);
        mrc_seg_t *own = nullptr, *common = nullptr;
        if (mrc_seg_open(mine, name.c_str(), 65536, MRC_SEG_HEAP, &own) != MRC_OK ||
            mrc_seg_open(mine, "common", 65536, 0, &common) != MRC_OK) {
          failures++;
          continue;
        }
        static_cast<volatile char *>(mrc_seg_base(common))[t] = 1;
        void *p = mrc_seg_alloc(heap, 100 + static_cast<size_t>(i), 0);
        void *q = mrc_seg_alloc(own, 1000, 0);
        if (p == nullptr || q == nullptr) failures++;
        std::memset(p, t, 100);
        mrc_seg_free(heap, p);
        if (mrc_seg_close(own) != MRC_OK || mrc_seg_close(common) != MRC_OK) failures++;
      }
      if (mrc_seg_domain_close(mine) != MRC_OK) failures++;
    });
  }
  for (auto &th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  mrc_seg_heap_stats_t hs;
  ASSERT_EQ(mrc_seg_heap_check(heap, &hs), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(hs.used_blocks, 0u);
  EXPECT_EQ(hs.allocs, 800u);
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_OK) << mrc_seg_last_error();
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  EXPECT_EQ(di.segments, 1u);
  EXPECT_EQ(mrc_seg_close(heap), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

// ---- the heap ------------------------------------------------------------------------------
class HeapTest : public SegTest {
 protected:
  void SetUp() override {
    SegTest::SetUp();
    d_ = open();
    ASSERT_EQ(mrc_seg_open(d_, "heap", 1 << 20, MRC_SEG_HEAP, &s_), MRC_OK);
  }
  void TearDown() override {
    EXPECT_EQ(mrc_seg_close(s_), MRC_OK);
    EXPECT_EQ(mrc_seg_domain_close(d_), MRC_OK);
    SegTest::TearDown();
  }
  mrc_seg_heap_stats_t stats() {
    mrc_seg_heap_stats_t st{};
    EXPECT_EQ(mrc_seg_heap_check(s_, &st), MRC_OK) << mrc_seg_last_error();
    return st;
  }
  mrc_seg_domain_t *d_ = nullptr;
  mrc_seg_t *s_ = nullptr;
};

TEST_F(HeapTest, AllocationsAreInsideAlignedAndDisjoint) {
  const auto lo = reinterpret_cast<uintptr_t>(mrc_seg_base(s_));
  const auto hi = lo + mrc_seg_size(s_);
  std::vector<std::pair<uintptr_t, size_t>> blocks;
  for (size_t align : {0, 16, 32, 64, 4096, 65536}) {
    for (size_t size : {1, 15, 16, 17, 1000, 5000}) {
      void *p = mrc_seg_alloc(s_, size, align);
      ASSERT_NE(p, nullptr) << size << " " << align;
      const auto a = reinterpret_cast<uintptr_t>(p);
      EXPECT_EQ(a % (align == 0 ? 16 : align), 0u);
      EXPECT_GE(a, lo);
      EXPECT_LE(a + size, hi);
      std::memset(p, 0xab, size);
      blocks.emplace_back(a, size);
    }
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_GE(blocks[i].first, blocks[i - 1].first + blocks[i - 1].second);
  }
  EXPECT_EQ(stats().used_blocks, blocks.size());
  for (auto [a, n] : blocks) mrc_seg_free(s_, reinterpret_cast<void *>(a));
  const mrc_seg_heap_stats_t st = stats();
  EXPECT_EQ(st.used_blocks, 0u);
  EXPECT_EQ(st.free_blocks, 1u);  // everything merged back
  EXPECT_EQ(st.largest_free, st.heap_size);
}

TEST_F(HeapTest, BadArgumentsAndFullHeap) {
  EXPECT_EQ(mrc_seg_alloc(s_, 16, 24), nullptr);  // not a power of two
  EXPECT_EQ(mrc_seg_alloc(s_, 2 << 20, 0), nullptr);
  EXPECT_EQ(mrc_seg_alloc(nullptr, 16, 0), nullptr);
  std::vector<void *> all;
  while (void *p = mrc_seg_alloc(s_, 10000, 0)) all.push_back(p);
  EXPECT_GT(all.size(), 90u);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("heap full"), std::string::npos);
  mrc_seg_free(s_, all[5]);
  void *again = mrc_seg_alloc(s_, 10000, 0);
  EXPECT_EQ(again, all[5]);
  // Double free, interior and foreign pointers: ignored, the heap stays consistent.
  mrc_seg_free(s_, all[7]);
  mrc_seg_free(s_, all[7]);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("not a live block"), std::string::npos);
  mrc_seg_free(s_, static_cast<char *>(all[8]) + 32);
  int local = 0;
  mrc_seg_free(s_, &local);
  mrc_seg_free(s_, nullptr);
  const mrc_seg_heap_stats_t st = stats();
  EXPECT_EQ(st.used_blocks, all.size() - 1);
  for (size_t i = 0; i < all.size(); ++i) {
    if (i != 7) mrc_seg_free(s_, all[i]);
  }
  EXPECT_EQ(stats().used_blocks, 0u);
}

TEST_F(HeapTest, RandomOperationsKeepTheInvariants) {
  std::mt19937_64 rng(42);
  std::map<uintptr_t, std::pair<size_t, uint8_t>> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const size_t n = 1 + rng() % 3000;
      const size_t align = size_t{1} << (rng() % 13);
      auto *p = static_cast<uint8_t *>(mrc_seg_alloc(s_, n, align));
      if (p == nullptr) continue;
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % std::max<size_t>(align, 16), 0u);
      const auto fill = static_cast<uint8_t>(rng());
      std::memset(p, fill, n);
      live[reinterpret_cast<uintptr_t>(p)] = {n, fill};
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      auto *p = reinterpret_cast<uint8_t *>(it->first);
      for (size_t k = 0; k < it->second.first; ++k) ASSERT_EQ(p[k], it->second.second);
      mrc_seg_free(s_, p);
      live.erase(it);
    }
    if (i % 1000 == 0) {
      const mrc_seg_heap_stats_t st = stats();
      ASSERT_EQ(st.used_blocks, live.size());
    }
  }
  for (auto &[a, v] : live) mrc_seg_free(s_, reinterpret_cast<void *>(a));
  EXPECT_EQ(stats().free_blocks, 1u);
}

// ---- descriptions ----------------------------------------------------------------------------
TEST_F(SegTest, DescribeTextAndJson) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *a = nullptr, *b = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "alpha", 1 << 20, MRC_SEG_HEAP, &a), MRC_OK);
  ASSERT_EQ(mrc_seg_open(d, "beta", 4096, MRC_SEG_NODATA, &b), MRC_OK);
  ASSERT_NE(mrc_seg_alloc(a, 100, 0), nullptr);
  const int n = mrc_seg_domain_describe(d, 0, nullptr, 0);
  ASSERT_GT(n, 0);
  std::string text(static_cast<size_t>(n) + 1, '\0');
  ASSERT_EQ(mrc_seg_domain_describe(d, 0, text.data(), text.size()), n);
  text.resize(static_cast<size_t>(n));
  EXPECT_NE(text.find("alpha"), std::string::npos) << text;
  EXPECT_NE(text.find("heap"), std::string::npos) << text;
  EXPECT_NE(text.find("nodata"), std::string::npos) << text;
  EXPECT_NE(text.find("(this process)"), std::string::npos) << text;
  EXPECT_NE(text.find("lock: free"), std::string::npos) << text;

  char small[16];
  EXPECT_EQ(mrc_seg_domain_describe(d, MRC_SEG_DESCRIBE_VERBOSE, small, sizeof small),
            mrc_seg_domain_describe(d, MRC_SEG_DESCRIBE_VERBOSE, nullptr, 0));
  EXPECT_EQ(std::strlen(small), sizeof small - 1);
  std::string verbose(8192, '\0');
  verbose.resize(static_cast<size_t>(
      mrc_seg_domain_describe(d, MRC_SEG_DESCRIBE_VERBOSE, verbose.data(), verbose.size())));
  EXPECT_NE(verbose.find("heap: "), std::string::npos) << verbose;
  EXPECT_NE(verbose.find("1 blocks"), std::string::npos) << verbose;

  std::string js(16384, '\0');
  const int m = mrc_seg_domain_describe(d, MRC_SEG_DESCRIBE_JSON | MRC_SEG_DESCRIBE_VERBOSE,
                                        js.data(), js.size());
  ASSERT_GT(m, 0);
  js.resize(static_cast<size_t>(m));
  const auto j = nlohmann::json::parse(js);
  mrc_seg_domain_info_t di;
  mrc_seg_domain_info(d, &di);
  EXPECT_EQ(j["prefix"], prefix_);
  EXPECT_EQ(j["base"].get<uint64_t>(), di.base);
  EXPECT_EQ(j["pages_used"], 2);
  EXPECT_EQ(j["lock"]["locked"], false);
  ASSERT_EQ(j["clients"].size(), 1u);
  EXPECT_EQ(j["clients"][0]["pid"], getpid());
  EXPECT_EQ(j["clients"][0]["alive"], true);
  EXPECT_EQ(j["clients"][0]["segments"], 2);
  ASSERT_EQ(j["segments"].size(), 2u);
  EXPECT_EQ(j["segments"][0]["name"], "alpha");
  EXPECT_EQ(j["segments"][0]["base"].get<uint64_t>(), reinterpret_cast<uint64_t>(mrc_seg_base(a)));
  EXPECT_EQ(j["segments"][0]["flags"][0], "heap");
  EXPECT_EQ(j["segments"][0]["heap"]["used_blocks"], 1);
  EXPECT_EQ(j["segments"][1]["flags"][0], "nodata");
  EXPECT_EQ(j["segments"][1]["file"], "");
  EXPECT_EQ(mrc_seg_domain_describe(d, 0x80, nullptr, 0), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_close(a), MRC_OK);
  EXPECT_EQ(mrc_seg_close(b), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

// ---- repairs, checks, removal --------------------------------------------------------------
TEST_F(SegTest, CheckFindsOrphanFilesAndRemoveAllClearsThem) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "kept", 4096, 0, &s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_OK);
  const std::string stray = "/" + prefix_ + ":999:stray";
  const int fd = shm_open(stray.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_ERR_IO);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("stray"), std::string::npos);
  unsigned repaired = 99;
  EXPECT_EQ(mrc_seg_domain_repair(d, &repaired), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(repaired, 0u);
  EXPECT_EQ(shm_files(prefix_).size(), 2u);            // root + kept: the stray one is gone
  EXPECT_EQ(mrc_seg_remove(d, "kept"), MRC_ERR_BUSY);  // we use it
  EXPECT_EQ(mrc_seg_remove(d, "nothing"), MRC_ERR_NOT_FOUND);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty());

  // remove --all with nothing there: creates and removes, leaves nothing.
  const mrc_seg_domain_params_t p = params();
  unsigned removed = 0;
  EXPECT_EQ(mrc_seg_domain_remove(&p, &removed), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(removed, 0u);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

TEST_F(SegTest, HostileHeaderBadMagicIsRefusedAndKept) {
  const std::string root = "/" + prefix_ + ":root";
  const int fd = shm_open(root.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(mrc::seg::kRootSize)), 0);
  auto *h = static_cast<mrc::seg::RootHeader *>(
      mmap(nullptr, mrc::seg::kRootSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(h, MAP_FAILED);
  h->magic = 0x4141414141414141ULL;
  h->ready.store(mrc::seg::kReadyWord);
  mrc_seg_domain_t *d = nullptr;
  mrc_seg_domain_params_t p = params();
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("bad magic"), std::string::npos)
      << mrc_seg_last_error();
  h->ready.store(0);  // unready with a foreign magic: still not ours to remove
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_domain_inspect(&p, &d), MRC_ERR_INVALID);
  EXPECT_EQ(shm_files(prefix_).size(), 1u);
  munmap(h, mrc::seg::kRootSize);
  // A root of another size (another layout) is refused too.
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_INVALID);
  close(fd);
}

TEST_F(SegTest, HeaderWindowOutsideTheConfiguredWindowIsRefused) {
  mrc_seg_domain_t *d = open();
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  mrc_seg_domain_t *x = nullptr;
  mrc_seg_domain_params_t p = params();
  // A joiner configured for another window.
  p.base = di.base == 0x580000000000ULL ? 0x590000000000ULL : 0x580000000000ULL;
  EXPECT_EQ(mrc_seg_domain_inspect(&p, &x), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("outside the configured window"),
            std::string::npos);
  // A header rewritten to point outside the default range.
  const uint64_t saved = d->root->base;
  d->root->base = 0x10000000ULL;
  p = params();
  EXPECT_EQ(mrc_seg_domain_inspect(&p, &x), MRC_ERR_INVALID);
  d->root->base = saved;
  ASSERT_EQ(mrc_seg_domain_inspect(&p, &x), MRC_OK);  // observer: no slot, no window
  mrc_seg_domain_info_t xi;
  ASSERT_EQ(mrc_seg_domain_info(x, &xi), MRC_OK);
  EXPECT_EQ(xi.slot, -1);
  EXPECT_EQ(xi.clients, 1u);
  mrc_seg_t *s = nullptr;
  EXPECT_EQ(mrc_seg_open(x, "n", 4096, 0, &s), MRC_ERR_INVALID);
  EXPECT_EQ(mrc_seg_domain_close(x), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_inspect(&p, &x), MRC_ERR_NOT_FOUND);
}

TEST_F(SegTest, RootOwnedByAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user (chown)";
  const std::string root = "/" + prefix_ + ":root";
  const int fd = shm_open(root.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchown(fd, 65534, 65534), 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(mrc::seg::kRootSize)), 0);
  close(fd);
  mrc_seg_domain_t *d = nullptr;
  const mrc_seg_domain_params_t p = params();
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("owned by uid 65534"), std::string::npos)
      << mrc_seg_last_error();
  EXPECT_EQ(shm_files(prefix_).size(), 1u);  // not ours: left alone
}

TEST_F(SegTest, LooserModeThanTheDomainsIsRefused) {
  const std::string root = "/" + prefix_ + ":root";
  const int fd = shm_open(root.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0640), 0);
  close(fd);
  mrc_seg_domain_t *d = nullptr;
  const mrc_seg_domain_params_t p = params();  // mode 0600
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("mode 0640"), std::string::npos);
}

TEST_F(SegTest, SomethingMappedAtTheBaseIsAClearErrorAndUntouched) {
  const uint64_t base = 0x590000000000ULL;
  void *mine = mmap(reinterpret_cast<void *>(base + (64 << 20)), 4096, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(mine, reinterpret_cast<void *>(base + (64 << 20)));
  std::memcpy(mine, "precious", 9);
  mrc_seg_domain_params_t p = params();
  p.base = base;
  p.size = 1ULL << 30;
  mrc_seg_domain_t *d = nullptr;
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_EXISTS);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("already mapped"), std::string::npos);
  EXPECT_STREQ(static_cast<char *>(mine), "precious");
  EXPECT_TRUE(shm_files(prefix_).empty());  // the half-made root was removed
  munmap(mine, 4096);
  ASSERT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

TEST_F(SegTest, JoinerWaitsForAnUnfinishedCreatorThenTimesOut) {
  const std::string root = "/" + prefix_ + ":root";
  const int fd = shm_open(root.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(mrc::seg::ofd_trylock(fd, mrc::seg::kCreatorLockOffset), 0);  // a live creator
  mrc_seg_domain_params_t p = params();
  p.join_timeout_ms = 300;
  mrc_seg_domain_t *d = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_BUSY);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_GE(ms, 300);
  EXPECT_LT(ms, 5000);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("did not finish within 300 ms"),
            std::string::npos);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(mrc::seg::kRootSize)), 0);  // sized, not ready
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_BUSY);
  // The creator dies (its descriptor closes): the leftover is removed and replaced.
  close(fd);
  ASSERT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK) << mrc_seg_last_error();
  mrc_seg_domain_info_t di;
  mrc_seg_domain_info(d, &di);
  EXPECT_EQ(di.created, 1);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

// A creator that died right after shm_open (size 0, no creator lock): the next process removes
// the leftover and creates the domain; a live creator in that same state is waited for.
TEST_F(SegTest, EmptyRootOfADeadCreatorIsReplaced) {
  const std::string root = "/" + prefix_ + ":root";
  int fd = shm_open(root.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  mrc_seg_domain_params_t p = params();
  mrc_seg_domain_t *d = nullptr;
  ASSERT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK) << mrc_seg_last_error();
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  EXPECT_EQ(di.created, 1);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

TEST_F(SegTest, ForkChildCannotUseTheParentsHandles) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "shared", 1 << 20, MRC_SEG_HEAP, &s), MRC_OK);
  const int parent_fd = d->fd;
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    mrc_seg_domain_info_t di;
    if (mrc_seg_domain_info(d, &di) != MRC_ERR_INVALID) code |= 1;
    if (fcntl(parent_fd, F_GETFD) != -1) code |= 2;  // the presence descriptor was closed
    void *p = mrc_seg_alloc(s, 64, 0);               // the inherited heap works
    if (p == nullptr) code |= 4;
    std::memcpy(p, "from the child", 15);
    std::printf("%p\n", p);
    std::fflush(stdout);
    if (mrc_seg_close(s) != MRC_OK) code |= 64;  // unmapped here only (the heap block stays)
    mrc_seg_domain_t *again = nullptr;
    const mrc_seg_domain_params_t p2 = params();
    if (mrc_seg_domain_open(&p2, &again) != MRC_OK) code |= 8;
    if (mrc_seg_domain_info(again, &di) != MRC_OK || di.slot != 1 || di.created != 0) code |= 16;
    if (mrc_seg_domain_close(again) != MRC_OK) code |= 32;
    _exit(code);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  mrc_seg_heap_stats_t hs;
  ASSERT_EQ(mrc_seg_heap_check(s, &hs), MRC_OK);
  EXPECT_EQ(hs.used_blocks, 1u);
  ASSERT_EQ(mrc_seg_domain_scan(d), MRC_OK);
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  EXPECT_EQ(di.clients, 1u);  // we are still alive after the child left
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

// The rule of segment.h (fork()): a child that opens the domain again while it still has
// segments it inherited gets MRC_ERR_BUSY, and those segments stay usable; once it closed them
// (which only unmaps them in the child), the open joins as a new client. Before, the open
// unmapped the whole inherited window under the segments.
TEST_F(SegTest, ForkChildReopenKeepsInheritedSegmentsUsable) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "shared", 1 << 20, MRC_SEG_HEAP, &s), MRC_OK);
  auto *flag = static_cast<char *>(mrc_seg_alloc(s, 64, 0));  // at one address everywhere
  ASSERT_NE(flag, nullptr);
  flag[0] = 'p';
  void *const base = mrc_seg_base(s);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    const mrc_seg_domain_params_t p2 = params();
    mrc_seg_domain_t *again = nullptr;
    CHILD_CHECK(mrc_seg_domain_open(&p2, &again) == MRC_ERR_BUSY);
    CHILD_CHECK(std::strstr(mrc_last_error(), "inherited") != nullptr);
    void *p = mrc_seg_alloc(s, 64, 0);  // the window is still there
    CHILD_CHECK(p != nullptr);
    std::memcpy(p, "child", 6);
    mrc_seg_free(s, p);
    flag[0] = 'c';
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_OK);
    CHILD_CHECK(mrc_seg_close(s) == MRC_OK);
    CHILD_CHECK(mrc_seg_domain_open(&p2, &again) == MRC_OK);
    mrc_seg_domain_info_t di;
    CHILD_CHECK(mrc_seg_domain_info(again, &di) == MRC_OK && di.slot != 0);
    mrc_seg_t *mine = nullptr;
    CHILD_CHECK(mrc_seg_open(again, "shared", 0, MRC_SEG_HEAP, &mine) == MRC_OK);
    CHILD_CHECK(mrc_seg_base(mine) == base && flag[0] == 'c');
    CHILD_CHECK(mrc_seg_close(mine) == MRC_OK);
    CHILD_CHECK(mrc_seg_domain_close(again) == MRC_OK);
    _exit(0);
  }
  EXPECT_EQ(wait_child(pid), 0);
  EXPECT_EQ(flag[0], 'c');
  mrc_seg_heap_stats_t hs;
  ASSERT_EQ(mrc_seg_heap_check(s, &hs), MRC_OK) << mrc_last_error();
  EXPECT_EQ(hs.used_blocks, 1u);  // flag; the child's block went back
  mrc_seg_free(s, flag);
  ASSERT_EQ(mrc_seg_domain_scan(d), MRC_OK);
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  EXPECT_EQ(di.clients, 1u);
  EXPECT_EQ(di.segments, 1u);  // the child's close did not take ours
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

// ---- NUMA and huge pages -------------------------------------------------------------------
TEST_F(SegTest, NumaPolicyIsSetBeforeFirstTouchAndVerified) {
  if (numa_available() < 0) GTEST_SKIP() << "NUMA is not available on this machine";
  mrc_seg_domain_t *d = open();
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "numa";
  sp.size = 4 << 20;
  sp.flags = MRC_SEG_HEAP;
  sp.numa_node = 0;
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open_ex(d, &sp, &s), MRC_OK) << mrc_seg_last_error();
  char *base = static_cast<char *>(mrc_seg_base(s));
  int mode = -1;
  unsigned long mask[16] = {};
  ASSERT_EQ(get_mempolicy(&mode, mask, 1024, base + (1 << 20), MPOL_F_ADDR), 0);
  EXPECT_EQ(mode, MPOL_BIND);
  EXPECT_EQ(mask[0], 1UL);
  std::memset(base, 1, mrc_seg_size(s));
  for (size_t off = 0; off < mrc_seg_size(s); off += 1 << 20) {
    int node = -1;
    ASSERT_EQ(get_mempolicy(&node, nullptr, 0, base + off, MPOL_F_NODE | MPOL_F_ADDR), 0);
    EXPECT_EQ(node, 0) << off;
  }
  mrc_seg_info_t si;
  mrc_seg_info(s, &si);
  EXPECT_EQ(si.numa_node, 0);
  sp.name = "nowhere";
  sp.numa_node = numa_max_node() + 1;
  mrc_seg_t *x = nullptr;
  EXPECT_EQ(mrc_seg_open_ex(d, &sp, &x), MRC_ERR_NOT_FOUND);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("is not there"), std::string::npos);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

// Reserves `pages` more huge pages when root can; restores the setting on destruction.
class HugePages {
 public:
  explicit HugePages(long pages) {
    if (free_pages() >= pages) {
      ok_ = true;
      return;
    }
    std::ifstream in("/proc/sys/vm/nr_hugepages");
    in >> saved_;
    std::ofstream out("/proc/sys/vm/nr_hugepages");
    if (!out) {
      why_ = "no free huge pages, and /proc/sys/vm/nr_hugepages is not writable (not root)";
      return;
    }
    out << saved_ + pages << std::flush;
    changed_ = true;
    ok_ = free_pages() >= pages;
    if (!ok_) why_ = "the kernel could not reserve huge pages (memory fragmented?)";
  }
  ~HugePages() {
    if (changed_) std::ofstream("/proc/sys/vm/nr_hugepages") << saved_;
  }
  static long free_pages() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    long value = 0;
    while (in >> key >> value) {
      if (key == "HugePages_Free:") return value;
      in.ignore(1 << 10, '\n');
    }
    return 0;
  }
  bool ok() const { return ok_; }
  const std::string &why() const { return why_; }

 private:
  bool ok_ = false, changed_ = false;
  long saved_ = 0;
  std::string why_;
};

TEST_F(SegTest, HugePageMemfdSegment) {
  HugePages reserve(2);
  if (!reserve.ok()) GTEST_SKIP() << reserve.why();
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "huge";
  sp.size = 1 << 20;
  sp.flags = MRC_SEG_HEAP | MRC_SEG_HUGETLB;
  const long before = HugePages::free_pages();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_memfd_create(&sp, &s), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(mrc_seg_size(s), 2u << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mrc_seg_base(s)) % (2 << 20), 0u);
  void *p = mrc_seg_alloc(s, 1000, 0);
  ASSERT_NE(p, nullptr);
  std::memset(mrc_seg_base(s), 7, 4096);
  EXPECT_EQ(HugePages::free_pages(), before - 2);  // header page + data page
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  // More than there are: a clear error, not a crash at first touch.
  sp.size = static_cast<size_t>(HugePages::free_pages() + 1) << 21;
  EXPECT_EQ(mrc_seg_memfd_create(&sp, &s), MRC_ERR_NO_MEMORY);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("huge pages"), std::string::npos)
      << mrc_seg_last_error();
}

// ---- memfd segments ------------------------------------------------------------------------
TEST_F(SegTest, MemfdSegmentRefusals) {
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "mfd";
  sp.size = 1 << 16;
  sp.flags = MRC_SEG_HEAP;
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_memfd_create(&sp, &s), MRC_OK) << mrc_seg_last_error();
  EXPECT_NE(mrc_seg_alloc(s, 100, 0), nullptr);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  // To ourselves: the address is taken here, which is refused without replacing anything.
  ASSERT_EQ(mrc_seg_send(s, sv[0]), MRC_OK);
  mrc_seg_t *r = nullptr;
  EXPECT_EQ(mrc_seg_recv(sv[1], &r), MRC_ERR_EXISTS);
  EXPECT_EQ(mrc_seg_heap_check(s, nullptr), MRC_OK);
  // An unsealed memfd is refused.
  const int raw = memfd_create("raw", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(raw, 1 << 16), 0);
  const uint64_t msg[3] = {0x3144464d43524dULL, 0x200000000000ULL, 1 << 16};
  iovec iov{const_cast<uint64_t *>(msg), sizeof msg};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  cmsghdr *c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &raw, sizeof raw);
  ASSERT_EQ(sendmsg(sv[0], &mh, 0), static_cast<ssize_t>(sizeof msg));
  EXPECT_EQ(mrc_seg_recv(sv[1], &r), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("sealed"), std::string::npos);
  close(raw);
  // Named-segment calls do not apply.
  EXPECT_EQ(mrc_seg_send(nullptr, sv[0]), MRC_ERR_INVALID);
  sp.flags = MRC_SEG_NODATA;
  EXPECT_EQ(mrc_seg_memfd_create(&sp, &r), MRC_ERR_INVALID);
  close(sv[0]);
  close(sv[1]);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
}

// A memfd that cannot be mapped writable (sealed against writing, or passed opened read-only) is
// the peer's error: MRC_ERR_INVALID with the reason, never MRC_ERR_NO_MEMORY, and the refusal
// leaves no descriptor and no mapping behind.
TEST_F(SegTest, UnwritableMemfdIsRefusedAsInvalid) {
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "ro";
  sp.size = 1 << 16;
  sp.flags = MRC_SEG_HEAP;
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_memfd_create(&sp, &s), MRC_OK) << mrc_seg_last_error();
  segtest::MemfdMessage msg;
  msg.base = reinterpret_cast<uint64_t>(s->map->start);
  msg.map_size = s->map->map_size;
  // The sender's bytes, header and heap, to be copied into memfds sealed otherwise.
  const std::vector<char> bytes(s->map->start, s->map->start + msg.map_size);
  // Read-only: a reopening of the segment's own memfd, which stays alive after the close.
  const int read_only =
      ::open(("/proc/self/fd/" + std::to_string(s->map->memfd)).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(read_only, 0) << std::strerror(errno);
  // The address is free again: a receiver would map there, so only the checks can refuse.
  ASSERT_EQ(mrc_seg_close(s), MRC_OK);
  auto sealed = [&](unsigned extra_seal) {
    const int fd = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | extra_seal | F_SEAL_SEAL), 0)
        << std::strerror(errno);
    return fd;
  };
  const struct {
    const char *shape;
    int fd;
    const char *reason;
  } cases[] = {
      {"F_SEAL_WRITE", sealed(F_SEAL_WRITE), "sealed against writing"},
      {"F_SEAL_FUTURE_WRITE", sealed(F_SEAL_FUTURE_WRITE), "sealed against writing"},
      {"opened read-only", read_only, "read-only"},
  };
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  for (const auto &c : cases) {
    const int before = segtest::open_fds();
    ASSERT_EQ(segtest::send_with_fds(sv[0], &msg, sizeof msg, {{c.fd}}),
              static_cast<ssize_t>(sizeof msg));
    mrc_seg_t *r = nullptr;
    EXPECT_EQ(mrc_seg_recv(sv[1], &r), MRC_ERR_INVALID) << c.shape << ": " << mrc_seg_last_error();
    EXPECT_NE(std::string(mrc_seg_last_error()).find(c.reason), std::string::npos)
        << c.shape << ": " << mrc_seg_last_error();
    EXPECT_EQ(segtest::open_fds(), before) << c.shape << ": the received descriptor left open";
    unsigned char resident = 0;
    EXPECT_NE(mincore(reinterpret_cast<void *>(msg.base), 4096, &resident), 0)
        << c.shape << ": something is mapped at the sender's address";
    close(c.fd);
  }
  close(sv[0]);
  close(sv[1]);
}

}  // namespace
