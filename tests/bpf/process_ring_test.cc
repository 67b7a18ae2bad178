// SPDX-License-Identifier: BSD-3-Clause
// The eBPF monitor's programs in a process that loads them itself: the loader's choice of hooks
// or its reason for refusing, the self-test, one record per kind of change made by a raw
// system call (before the call returns), none for a forked child's changes, and a full ring.
//
// Where the kernel refuses the programs (this project's development machines: lockdown refuses
// trampolines) the tests check the refusal's reason and skip the rest, saying so; the
// soft-RoCE guests' stock kernel runs them, and there MRC_BPF_REQUIRED=1 turns a refusal into
// a failure (the bpf step of scripts/rxe/guest-tests.sh).
#include <gtest/gtest.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bpf/process_ring.h"

namespace mrc::bpf {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

bool required() {
  const char *value = getenv("MRC_BPF_REQUIRED");
  return value != nullptr && strcmp(value, "1") == 0;
}

// Opens this process's ring, or explains (and checks the explanation of) why it cannot.
ProcessRing *open_or_explain(size_t ring_bytes = ProcessRing::kDefaultRingBytes) {
  ProcessRing *own = nullptr;
  const mrc_status_t status = ProcessRing::open_own(ring_bytes, &own);
  if (status == MRC_OK) return own;
  const std::string why = mrc_last_error();
  EXPECT_EQ(status, MRC_ERR_UNSUPPORTED) << why;
  EXPECT_EQ(why.rfind("bpf monitor", 0), 0U) << why;
  EXPECT_EQ(own, nullptr);
  if (required()) ADD_FAILURE() << "MRC_BPF_REQUIRED=1 but the programs did not load: " << why;
  return nullptr;
}

#define OPEN_OR_SKIP(own, ...)                                                                  \
  ProcessRing *own = open_or_explain(__VA_ARGS__);                                              \
  if ((own) == nullptr) {                                                                       \
    GTEST_SKIP() << "this kernel or process cannot run the eBPF monitor: " << mrc_last_error(); \
  }

struct Seen {
  ChangeKind kind;
  uint64_t start, end;
  uint32_t aux;
};

// Every record now in the ring (the changes were made by calls that returned).
std::vector<Seen> drain_all(ProcessRing *own) {
  std::vector<Seen> seen;
  for (int tries = 0; tries < 1000; ++tries) {
    const RingConsumer::Drained drained = own->consumer().drain([&](const ChangeRecord &record) {
      seen.push_back({static_cast<ChangeKind>(record.kind), record.start, record.end, record.aux});
    });
    if (drained == RingConsumer::Drained::Ok) break;
    EXPECT_NE(drained, RingConsumer::Drained::Lost);
    std::this_thread::yield();
  }
  return seen;
}

bool covered(const std::vector<Seen> &seen, ChangeKind kind, const void *start, size_t length) {
  const auto begin = reinterpret_cast<uint64_t>(start);
  for (const Seen &record : seen) {
    if (record.kind == kind && record.start <= begin && record.end >= begin + length) return true;
  }
  return false;
}

uint8_t *map_touched(size_t bytes) {
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  memset(p, 7, bytes);
  return static_cast<uint8_t *>(p);
}

// Alone in its frame: nothing of the caller's is live across vfork.
[[gnu::noinline]] pid_t vfork_and_unmap(void *start, size_t length) {
  const pid_t child = vfork();
  if (child == 0) {
    syscall(SYS_munmap, start, length);
    _exit(0);
  }
  return child;
}

TEST(ProcessRing, LoadsOrSaysWhy) {
  OPEN_OR_SKIP(own);
  const Hooks hooks = own->hooks();
  ASSERT_NE(hooks.unmap, nullptr);
  ASSERT_NE(hooks.remap, nullptr);
  ASSERT_NE(hooks.madvise, nullptr);
  std::printf("hooks: unmap %s, remap %s, madvise %s\n", hooks.unmap, hooks.remap, hooks.madvise);
  EXPECT_TRUE(own->consumer().quiet());  // the self-test drained what it made
  own->close();
}

TEST(ProcessRing, ABuildWithoutProgramsSaysWhatItLacks) {
  if (Programs::built()) GTEST_SKIP() << "this build has the programs";
  Programs *programs = nullptr;
  EXPECT_EQ(Programs::load(&programs), MRC_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mrc_last_error()).find("libbpf"), std::string::npos);
}

TEST(ProcessRing, EveryKindOfChangeLeavesARecordBeforeItsCallReturns) {
  OPEN_OR_SKIP(own);
  uint8_t *unmapped = map_touched(4 * kPage);
  uint8_t *advised = map_touched(4 * kPage);
  uint8_t *moved = map_touched(2 * kPage);
  uint8_t *target = map_touched(2 * kPage);
  uint8_t *kept = map_touched(2 * kPage);
  uint8_t *fixed = map_touched(kPage);
  ASSERT_TRUE(unmapped && advised && moved && target && kept && fixed);
  ASSERT_TRUE(own->consumer().quiet() || !drain_all(own).empty());

  EXPECT_EQ(munmap(unmapped, 100), 0);  // 100 bytes: the whole page goes
  EXPECT_EQ(madvise(advised, kPage, MADV_DONTNEED), 0);
  EXPECT_EQ(madvise(advised + kPage, kPage, MADV_FREE), 0);
  EXPECT_EQ(madvise(advised + 2 * kPage, kPage, MADV_WILLNEED), 0);  // keeps the pages: none
  EXPECT_NE(mremap(moved, 2 * kPage, 2 * kPage, MREMAP_MAYMOVE | MREMAP_FIXED, target), MAP_FAILED);
  // Raw: glibc 2.36 passes the new address only with MREMAP_FIXED; the kernel reads it here too.
  void *kept_moved = reinterpret_cast<void *>(
      syscall(SYS_mremap, kept, 2 * kPage, 2 * kPage, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0));
  EXPECT_NE(kept_moved, MAP_FAILED);
  EXPECT_NE(mmap(fixed, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
            MAP_FAILED);
  EXPECT_FALSE(own->consumer().quiet());
  std::vector<Seen> seen = drain_all(own);
  EXPECT_TRUE(covered(seen, ChangeKind::Unmap, unmapped, kPage));
  EXPECT_TRUE(covered(seen, ChangeKind::Madvise, advised, kPage));
  EXPECT_TRUE(covered(seen, ChangeKind::Madvise, advised + kPage, kPage));
  EXPECT_FALSE(covered(seen, ChangeKind::Madvise, advised + 2 * kPage, kPage));
  EXPECT_TRUE(covered(seen, ChangeKind::Remap, moved, 2 * kPage));
  EXPECT_TRUE(covered(seen, ChangeKind::Unmap, target, 2 * kPage));  // the target replaced
  EXPECT_TRUE(covered(seen, ChangeKind::Remap, kept, 2 * kPage));    // DONTUNMAP empties it
  EXPECT_TRUE(covered(seen, ChangeKind::Unmap, fixed, kPage));
  EXPECT_TRUE(own->consumer().quiet());
  munmap(unmapped, 4 * kPage);
  munmap(advised, 4 * kPage);
  munmap(target, 2 * kPage);
  munmap(kept, 2 * kPage);
  if (kept_moved != MAP_FAILED) munmap(kept_moved, 2 * kPage);
  munmap(fixed, kPage);
  own->close();
}

TEST(ProcessRing, ShmBrkAndIoUringChangesLeaveRecords) {
  OPEN_OR_SKIP(own);
  // shmat(SHM_REMAP) over a mapping (userfaultfd reports nothing for it), then shmdt.
  const int shm = shmget(IPC_PRIVATE, 2 * kPage, IPC_CREAT | 0600);
  ASSERT_GE(shm, 0);
  uint8_t *over = map_touched(2 * kPage);
  ASSERT_NE(over, nullptr);
  void *attached = shmat(shm, over, SHM_REMAP);
  shmctl(shm, IPC_RMID, nullptr);
  ASSERT_EQ(attached, over);
  std::vector<Seen> seen = drain_all(own);
  EXPECT_TRUE(covered(seen, ChangeKind::Unmap, over, 2 * kPage));
  ASSERT_EQ(shmdt(attached), 0);
  seen = drain_all(own);
  EXPECT_TRUE(covered(seen, ChangeKind::Unmap, over, 2 * kPage));

  // brk shrink: grow by two pages, shrink back (no other thread of this test uses brk).
  auto *old_break = static_cast<uint8_t *>(sbrk(0));
  auto *base = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(old_break) + kPage - 1) &
                                           ~(kPage - 1));
  ASSERT_EQ(syscall(SYS_brk, base + 2 * kPage), reinterpret_cast<long>(base + 2 * kPage));
  memset(base, 1, 2 * kPage);
  ASSERT_EQ(syscall(SYS_brk, base), reinterpret_cast<long>(base));
  seen = drain_all(own);
  EXPECT_TRUE(covered(seen, ChangeKind::Unmap, base, 2 * kPage));
  syscall(SYS_brk, old_break);

  // IORING_OP_MADVISE.
  io_uring ring{};
  if (io_uring_queue_init(4, &ring, 0) == 0) {
    uint8_t *advised = map_touched(2 * kPage);
    io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_madvise(sqe, advised, static_cast<off_t>(2 * kPage), MADV_DONTNEED);
    io_uring_submit(&ring);
    io_uring_cqe *cqe = nullptr;
    ASSERT_EQ(io_uring_wait_cqe(&ring, &cqe), 0);
    const int result = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    io_uring_queue_exit(&ring);
    if (result == 0) {
      seen = drain_all(own);
      EXPECT_TRUE(covered(seen, ChangeKind::Madvise, advised, 2 * kPage));
    } else {
      std::printf("IORING_OP_MADVISE refused here (%s): not checked\n", strerror(-result));
    }
    munmap(advised, 2 * kPage);
  }
  own->close();
}

TEST(ProcessRing, AnotherThreadsAndAVforkChildsChangesReachTheRingAForkChildsDoNot) {
  OPEN_OR_SKIP(own);
  uint8_t *by_thread = map_touched(kPage);
  uint8_t *by_vfork = map_touched(kPage);
  uint8_t *by_fork = map_touched(kPage);
  ASSERT_TRUE(by_thread && by_vfork && by_fork);
  drain_all(own);
  std::thread([&] { munmap(by_thread, kPage); }).join();
  // A vfork child shares the address space: its munmap unmaps the parent's page.
  const pid_t vforked = vfork_and_unmap(by_vfork, kPage);
  ASSERT_GT(vforked, 0);
  int status = 0;
  waitpid(vforked, &status, 0);
  const pid_t forked = fork();
  if (forked == 0) {
    munmap(by_fork, kPage);
    _exit(0);
  }
  ASSERT_GT(forked, 0);
  waitpid(forked, &status, 0);
  std::vector<Seen> seen = drain_all(own);
  EXPECT_TRUE(covered(seen, ChangeKind::Unmap, by_thread, kPage));
  EXPECT_TRUE(covered(seen, ChangeKind::Unmap, by_vfork, kPage));
  EXPECT_FALSE(covered(seen, ChangeKind::Unmap, by_fork, kPage));  // the child's own copy
  munmap(by_fork, kPage);
  own->close();
}

TEST(ProcessRing, AFullRingCountsWhatItDroppedAndStaysUnquietUntilPurged) {
  OPEN_OR_SKIP(own, kPage);  // one page: about 170 records of 24 bytes and their headers
  uint8_t *area = map_touched(512 * kPage);
  ASSERT_NE(area, nullptr);
  for (size_t i = 0; i < 512; i += 2) munmap(area + i * kPage, kPage);  // 256 changes
  EXPECT_FALSE(own->consumer().quiet());
  size_t records = 0;
  const RingConsumer::Drained drained =
      own->consumer().drain([&](const ChangeRecord &) { ++records; });
  EXPECT_EQ(drained, RingConsumer::Drained::Lost);
  EXPECT_GT(records, 0U);
  EXPECT_LT(records, 256U);
  EXPECT_FALSE(own->consumer().quiet());  // until the caller purged
  own->consumer().purged();
  EXPECT_TRUE(own->consumer().quiet());
  for (size_t i = 1; i < 512; i += 2) munmap(area + i * kPage, kPage);
  own->close();
}

}  // namespace
}  // namespace mrc::bpf
