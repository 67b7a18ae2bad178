// SPDX-License-Identifier: BSD-3-Clause
// MRC_MONITOR=bpf through the C API, one test per kind of change (docs/DESIGN.md, "The eBPF
// monitor's mode"): memory is registered and cached, a raw system call changes it, and the next
// get must not return the old registration. The oracle is the backend's serial keys: a key
// below the one read after the change was registered before it (stale). Among the kinds is
// shmat(SHM_REMAP), which userfaultfd never reports (tests/conformance/differences_test.cc).
//
// The mode runs where the kernel runs the programs (the soft-RoCE guests, as root; there
// MRC_BPF_REQUIRED=1 makes a fallback a failure); elsewhere the tests skip, saying why.
#include <liburing.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "cache_fixture.h"
#include "mrcache/mrcache.h"

namespace {

using mrc::test::CacheFixture;
using mrc::test::kPage;

constexpr size_t kPages = 4;

bool required() {
  const char *value = getenv("MRC_BPF_REQUIRED");
  return value != nullptr && strcmp(value, "1") == 0;
}

class BpfStale : public CacheFixture {
 protected:
  void SetUp() override {
    previous_ = getenv("MRC_MONITOR") != nullptr ? getenv("MRC_MONITOR") : "";
    setenv("MRC_MONITOR", "bpf", 1);
    mrc_cache_params_t params = backend.params("bpf-stale");
    params.flags &= ~static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS);  // exact
    params.flags |= MRC_FLAG_CACHE_CHURN;  // every registration cached: the hazard
    ASSERT_EQ(create(params), MRC_OK);
    mrc_monitor_info_t info;
    ASSERT_EQ(mrc_monitor_info(&info), MRC_OK);
    if (info.mode != MRC_MONITOR_BPF) {
      if (required()) FAIL() << "MRC_BPF_REQUIRED=1, but: " << info.reason;
      GTEST_SKIP() << "bpf mode cannot run here: " << info.reason;
    }
  }
  void TearDown() override {
    CacheFixture::TearDown();
    if (previous_.empty()) {
      unsetenv("MRC_MONITOR");
    } else {
      setenv("MRC_MONITOR", previous_.c_str(), 1);
    }
  }

  // Gets [p, p + bytes) and returns the registration's key (0 on failure).
  uint64_t key_of(void *p, size_t bytes) {
    mrc_region_t *region = nullptr;
    if (mrc_get(cache, p, bytes, MRC_PROT_READ | MRC_PROT_WRITE, &region) != MRC_OK) {
      ADD_FAILURE() << "mrc_get: " << mrc_last_error();
      return 0;
    }
    const uint64_t key = mrc_region_key(region);
    mrc_put(cache, region);
    return key;
  }

  // Caches [p, p + bytes), runs `change`, makes sure memory is at p again (`remap`), and
  // expects the next get to register anew.
  void expect_fresh_after(
      const char *kind, char *p, size_t bytes, const std::function<bool()> &change,
      const std::function<bool()> &remap = [] { return true; }) {
    const uint64_t cached = key_of(p, bytes);
    ASSERT_EQ(key_of(p, bytes), cached) << kind << ": a second get hits";
    const uint64_t floor = backend.next_serial();
    ASSERT_TRUE(change()) << kind << ": " << strerror(errno);
    ASSERT_TRUE(remap()) << kind << ": mapping again: " << strerror(errno);
    memset(p, 7, bytes);
    const uint64_t after = key_of(p, bytes);
    EXPECT_GE(after, floor) << kind << ": the get returned the registration made before the change";
  }

  std::string previous_;
};

char *map_at(char *at, size_t bytes) {
  void *p = mmap(at, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | (at != nullptr ? MAP_FIXED_NOREPLACE : 0), -1, 0);
  if (p == MAP_FAILED) return nullptr;
  memset(p, 1, bytes);
  return static_cast<char *>(p);
}

TEST_F(BpfStale, Munmap) {
  char *p = map_at(nullptr, kPages * kPage);
  ASSERT_NE(p, nullptr);
  expect_fresh_after(
      "munmap", p, kPages * kPage, [&] { return munmap(p, kPages * kPage) == 0; },
      [&] { return map_at(p, kPages * kPage) == p; });
  munmap(p, kPages * kPage);
}

TEST_F(BpfStale, MapFixedOver) {
  char *p = map_at(nullptr, kPages * kPage);
  ASSERT_NE(p, nullptr);
  expect_fresh_after("mmap(MAP_FIXED) over", p, kPages * kPage, [&] {
    return mmap(p, kPages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                -1, 0) == p;
  });
  munmap(p, kPages * kPage);
}

TEST_F(BpfStale, MremapMoveAway) {
  char *p = map_at(nullptr, kPages * kPage);
  char *elsewhere = map_at(nullptr, kPages * kPage);
  ASSERT_TRUE(p != nullptr && elsewhere != nullptr);
  expect_fresh_after(
      "mremap (moving)", p, kPages * kPage,
      [&] {
        return mremap(p, kPages * kPage, kPages * kPage, MREMAP_MAYMOVE | MREMAP_FIXED,
                      elsewhere) == elsewhere;
      },
      [&] { return map_at(p, kPages * kPage) == p; });
  munmap(p, kPages * kPage);
  munmap(elsewhere, kPages * kPage);
}

TEST_F(BpfStale, MremapShrinkThenGrowInPlace) {
  char *p = map_at(nullptr, kPages * kPage);
  ASSERT_NE(p, nullptr);
  expect_fresh_after(
      "mremap (shrinking)", p, kPages * kPage,
      [&] { return mremap(p, kPages * kPage, kPage, 0) == p; },
      [&] { return map_at(p + kPage, (kPages - 1) * kPage) == p + kPage; });
  munmap(p, kPages * kPage);
}

TEST_F(BpfStale, MremapDontunmap) {
  char *p = map_at(nullptr, kPages * kPage);
  ASSERT_NE(p, nullptr);
  void *moved = nullptr;
  expect_fresh_after("mremap(MREMAP_DONTUNMAP)", p, kPages * kPage, [&] {
    // Raw: glibc 2.36 passes its fifth argument (the new address) only with MREMAP_FIXED, and
    // the kernel reads one for MREMAP_DONTUNMAP too.
    moved = reinterpret_cast<void *>(syscall(SYS_mremap, p, kPages * kPage, kPages * kPage,
                                             MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0));
    return moved != MAP_FAILED;
  });
  munmap(p, kPages * kPage);
  if (moved != MAP_FAILED) munmap(moved, kPages * kPage);
}

TEST_F(BpfStale, MadviseDontneedFreeAndRemove) {
  for (const int advice : {MADV_DONTNEED, MADV_FREE}) {
    char *p = map_at(nullptr, kPages * kPage);
    ASSERT_NE(p, nullptr);
    expect_fresh_after("madvise", p, kPages * kPage,
                       [&] { return madvise(p, kPages * kPage, advice) == 0; });
    munmap(p, kPages * kPage);
  }
  // MADV_REMOVE needs shared memory.
  void *shared =
      mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  char *p = static_cast<char *>(shared);
  memset(p, 1, kPages * kPage);
  expect_fresh_after("madvise(MADV_REMOVE)", p, kPages * kPage,
                     [&] { return madvise(p, kPages * kPage, MADV_REMOVE) == 0; });
  munmap(p, kPages * kPage);
}

TEST_F(BpfStale, IoUringMadvise) {
  io_uring ring{};
  if (io_uring_queue_init(4, &ring, 0) != 0) GTEST_SKIP() << "no io_uring here";
  char *p = map_at(nullptr, kPages * kPage);
  ASSERT_NE(p, nullptr);
  expect_fresh_after("IORING_OP_MADVISE", p, kPages * kPage, [&] {
    io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) return false;
    io_uring_prep_madvise(sqe, p, static_cast<off_t>(kPages * kPage), MADV_DONTNEED);
    io_uring_submit(&ring);
    io_uring_cqe *cqe = nullptr;
    if (io_uring_wait_cqe(&ring, &cqe) != 0) return false;
    const int result = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    errno = -result;
    return result == 0;
  });
  io_uring_queue_exit(&ring);
  munmap(p, kPages * kPage);
}

TEST_F(BpfStale, ShmatRemapAndShmdt) {
  char *p = map_at(nullptr, kPages * kPage);
  ASSERT_NE(p, nullptr);
  const int shm = shmget(IPC_PRIVATE, kPages * kPage, IPC_CREAT | 0600);
  ASSERT_GE(shm, 0);
  // userfaultfd reports nothing for this one: in bpf mode it is exact.
  expect_fresh_after("shmat(SHM_REMAP)", p, kPages * kPage,
                     [&] { return shmat(shm, p, SHM_REMAP) == p; });
  expect_fresh_after(
      "shmdt", p, kPages * kPage, [&] { return shmdt(p) == 0; },
      [&] { return shmat(shm, p, 0) == p; });
  shmdt(p);
  shmctl(shm, IPC_RMID, nullptr);
}

TEST_F(BpfStale, BrkShrink) {
  // The break moves by raw system calls; no other thread of this test allocates meanwhile.
  char *old_break = static_cast<char *>(sbrk(0));
  auto *base =
      reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(old_break) + kPage - 1) & ~(kPage - 1));
  const auto set_break = [](char *to) {
    return syscall(SYS_brk, to) == reinterpret_cast<long>(to);
  };
  ASSERT_TRUE(set_break(base + kPages * kPage));
  memset(base, 1, kPages * kPage);
  expect_fresh_after(
      "brk shrink", base, kPages * kPage, [&] { return set_break(base); },
      [&] { return set_break(base + kPages * kPage); });
  set_break(old_break);
}

}  // namespace
