// SPDX-License-Identifier: BSD-3-Clause
// Every way memory goes away reaches a subscription as a record, in every monitor mode; and the
// kinds of memory each mode can or cannot watch.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "tests/uffd/helpers.h"

namespace mrc::uffd::test {
namespace {

// A mapping of its own: PROT_NONE guard pages on both sides keep the kernel from merging it with
// its neighbours.
char *map_alone(size_t length) {
  char *raw = map_anonymous(length + 2 * page_size(), PROT_NONE);
  char *p = raw + page_size();
  EXPECT_EQ(mprotect(p, length, PROT_READ | PROT_WRITE), 0);
  return p;
}
void unmap_alone(char *p, size_t length) { munmap(p - page_size(), length + 2 * page_size()); }

class Events : public ::testing::TestWithParam<const char *> {
 protected:
  void SetUp() override {
    env_ = std::make_unique<ScopedEnv>("MRC_MONITOR", GetParam());
    ASSERT_EQ(uffd::subscribe(&subscription_), MRC_OK);
    if (subscription_->mode() == MRC_MONITOR_UNCACHED) {
      GTEST_SKIP() << "mode " << GetParam() << " is not available here: " << monitor_info().reason;
    }
    (void)drain_all(subscription_);
  }
  void TearDown() override {
    if (subscription_ != nullptr) uffd::unsubscribe(subscription_);
  }

  bool missing_mode() const { return subscription_->mode() == MRC_MONITOR_MISSING; }

  WatchResult try_watch(const void *p, size_t length) {
    why_[0] = '\0';
    return uffd::watch(u(p), length, why_, sizeof(why_));
  }
  void watch(const void *p, size_t length) {
    ASSERT_EQ(try_watch(p, length), WatchResult::Watched) << why_;
  }
  std::vector<Invalidation> drain() { return drain_all(subscription_); }

  // The shared-memory kinds: watched in the write-protect modes, refused in MISSING mode.
  void expect_shared_memory_events(char *p, size_t length, const char *what) {
    const WatchResult result = try_watch(p, length);
    if (missing_mode()) {
      EXPECT_EQ(result, WatchResult::NotMonitorable) << what;
      EXPECT_NE(std::string(why_).find("private anonymous"), std::string::npos) << why_;
      munmap(p, length);
      return;
    }
    ASSERT_EQ(result, WatchResult::Watched) << what << ": " << why_;
    p[0] = 1;
    ASSERT_EQ(munmap(p, length), 0);
    const auto records = drain();
    EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap))
        << what << "\n"
        << describe(records);
  }

  std::unique_ptr<ScopedEnv> env_;
  Subscription *subscription_ = nullptr;
  char why_[256];
};

TEST_P(Events, MunmapWhole) {
  const size_t length = 64 << 10;
  char *p = map_anonymous(length);
  watch(p, length);
  p[0] = 1;  // in MISSING mode the monitor resolves this fault; other modes never fault
  ASSERT_EQ(munmap(p, length), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap)) << describe(records);
}

TEST_P(Events, MunmapOnePageInsideKeepsTheRest) {
  const size_t page = page_size();
  char *p = map_anonymous(16 * page);
  watch(p, 16 * page);
  ASSERT_EQ(munmap(p + 5 * page, page), 0);
  auto records = drain();
  EXPECT_TRUE(covered(records, u(p + 5 * page), u(p + 6 * page), InvalidationKind::Unmap))
      << describe(records);
  EXPECT_FALSE(touches(records, u(p), u(p + 5 * page))) << describe(records);
  // The rest is still registered: another page inside is reported too.
  ASSERT_EQ(munmap(p + 10 * page, page), 0);
  records = drain();
  EXPECT_TRUE(covered(records, u(p + 10 * page), u(p + 11 * page), InvalidationKind::Unmap))
      << describe(records);
  munmap(p, 16 * page);
}

// Every mode registers the whole mapping a watch falls in (MISSING mode too: its monitor then
// resolves the faults of the whole mapping).
TEST_P(Events, AWatchRegistersItsWholeMapping) {
  const size_t page = page_size();
  char *p = map_alone(16 * page);
  watch(p, page);
  EXPECT_EQ(count_vmas_in(u(p), u(p) + 16 * page), 1u);
  ASSERT_EQ(munmap(p + 8 * page, page), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p + 8 * page), u(p + 9 * page), InvalidationKind::Unmap))
      << describe(records);
  uffd::unwatch(u(p), page);
  unmap_alone(p, 16 * page);
}

TEST_P(Events, MunmapSpanningTwoRegions) {
  const size_t page = page_size();
  // Reserve three adjacent ranges; the middle one becomes a hole between two regions.
  char *base = map_anonymous(12 * page);
  char *first = base;
  char *second = base + 8 * page;
  ASSERT_EQ(munmap(base + 4 * page, 4 * page), 0);
  watch(first, 4 * page);
  watch(second, 4 * page);
  ASSERT_EQ(munmap(base, 12 * page), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(first), u(first + 4 * page), InvalidationKind::Unmap))
      << describe(records);
  EXPECT_TRUE(covered(records, u(second), u(second + 4 * page), InvalidationKind::Unmap))
      << describe(records);
}

TEST_P(Events, RawMunmapSyscall) {
  const size_t length = 8 * page_size();
  char *p = map_anonymous(length);
  watch(p, length);
  ASSERT_EQ(syscall(SYS_munmap, p, length), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap)) << describe(records);
}

TEST_P(Events, MremapMoveReportsTheOldRange) {
  const size_t length = 4 * page_size();
  char *p = map_anonymous(length);
  char *target = map_anonymous(2 * length, PROT_NONE);
  watch(p, length);
  p[0] = 7;
  void *moved = mremap(p, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, target);
  ASSERT_EQ(moved, target);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Remap)) << describe(records);
  EXPECT_EQ(static_cast<char *>(moved)[0], 7);
  munmap(target, 2 * length);
}

TEST_P(Events, MremapShrinkReportsTheTail) {
  const size_t page = page_size();
  char *p = map_anonymous(8 * page);
  watch(p, 8 * page);
  ASSERT_EQ(mremap(p, 8 * page, 4 * page, 0), p);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p + 4 * page), u(p + 8 * page), InvalidationKind::Unmap))
      << describe(records);
  EXPECT_FALSE(touches(records, u(p), u(p + 4 * page))) << describe(records);
  munmap(p, 4 * page);
}

TEST_P(Events, MremapGrowInPlaceKeepsTheRegion) {
  const size_t page = page_size();
  char *p = map_anonymous(16 * page);
  ASSERT_EQ(munmap(p + 8 * page, 8 * page), 0);  // room to grow into
  watch(p, 8 * page);
  (void)drain();
  ASSERT_EQ(mremap(p, 8 * page, 16 * page, 0), p);  // no MREMAP_MAYMOVE: in place or fail
  auto records = drain();
  EXPECT_FALSE(touches(records, u(p), u(p + 8 * page))) << describe(records);
  // Still watched after growing.
  ASSERT_EQ(munmap(p, 16 * page), 0);
  records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p + 8 * page), InvalidationKind::Unmap))
      << describe(records);
}

// The application's mremap of a whole mapping that a watch lies in works in every mode: the watch
// registers the whole mapping, so the kernel still sees one VMA. A registration of the watched
// page alone (MISSING mode did that) split it in three; the grow failed with EFAULT, and the
// MREMAP_FIXED move below moved the mapping's first piece before it failed, taking the
// application's first pages away from their address (docs/DESIGN.md, "Watching").
// Odd pages are written before the watch, even ones are left untouched (in MISSING mode the
// monitor resolves their first touch): both must read as they were, wherever the data went.
void fill_odd_pages(char *p, size_t pages) {
  for (size_t i = 1; i < pages; i += 2) p[i * page_size()] = static_cast<char>(i);
}
void expect_odd_pages(const char *p, size_t pages, const char *where) {
  for (size_t i = 0; i < pages; ++i) {
    ASSERT_EQ(p[i * page_size()], i % 2 == 1 ? static_cast<char>(i) : 0) << where << ", page " << i;
  }
}

TEST_P(Events, TheApplicationCanGrowAWatchedMappingInPlace) {
  const size_t page = page_size();
  constexpr size_t kPages = 16;
  char *p = map_alone(2 * kPages * page);
  ASSERT_EQ(munmap(p + kPages * page, kPages * page), 0);  // room to grow into, up to the guard
  fill_odd_pages(p, kPages);
  watch(p + 5 * page, page);
  ASSERT_EQ(mremap(p, kPages * page, 2 * kPages * page, 0), p) << "mremap: " << strerror(errno);
  expect_odd_pages(p, kPages, "after the grow");
  for (size_t i = kPages; i < 2 * kPages; ++i) {
    ASSERT_EQ(p[i * page], 0) << "grown page " << i;
    p[i * page] = 1;
  }
  // Still watched, grown part included.
  ASSERT_EQ(munmap(p, 2 * kPages * page), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + kPages * page, InvalidationKind::Unmap))
      << describe(records);
  uffd::unwatch(u(p + 5 * page), page);
  unmap_alone(p, 2 * kPages * page);
}

TEST_P(Events, TheApplicationCanMoveAWatchedMapping) {
  const size_t page = page_size();
  constexpr size_t kPages = 16;
  char *p = map_alone(kPages * page);
  char *target = map_alone(kPages * page);
  ASSERT_EQ(mprotect(target, kPages * page, PROT_NONE), 0);  // a reservation, as allocators do
  fill_odd_pages(p, kPages);
  watch(p + 5 * page, page);
  void *moved = mremap(p, kPages * page, kPages * page, MREMAP_MAYMOVE | MREMAP_FIXED, target);
  ASSERT_EQ(moved, target) << "mremap: " << strerror(errno);
  expect_odd_pages(target, kPages, "at the new address");
  // Nothing stayed behind: the whole old range is free.
  void *again = mmap(p, kPages * page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  EXPECT_EQ(again, p) << "part of the mapping was left at its old address";
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + kPages * page, InvalidationKind::Remap))
      << describe(records);
  uffd::unwatch(u(p + 5 * page), page);
  unmap_alone(target, kPages * page);
  unmap_alone(p, kPages * page);
}

TEST_P(Events, MadviseDontneed) {
  const size_t length = 8 * page_size();
  char *p = map_anonymous(length);
  watch(p, length);
  memset(p, 1, length);
  ASSERT_EQ(madvise(p, length, MADV_DONTNEED), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Remove)) << describe(records);
  EXPECT_EQ(p[0], 0);  // MISSING mode: the monitor resolved the refault with a zero page
  munmap(p, length);
}

TEST_P(Events, MadviseFree) {
  const size_t length = 8 * page_size();
  char *p = map_anonymous(length);
  watch(p, length);
  memset(p, 1, length);
  ASSERT_EQ(madvise(p, length, MADV_FREE), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Remove)) << describe(records);
  munmap(p, length);
}

TEST_P(Events, MadviseRemoveOnSharedMemory) {
  const size_t length = 8 * page_size();
  const int fd = memfd_create("mrc-uffd-remove", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(length)), 0);
  char *p = static_cast<char *>(mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  if (missing_mode()) {
    EXPECT_EQ(try_watch(p, length), WatchResult::NotMonitorable);
    munmap(p, length);
    GTEST_SKIP() << "MISSING mode watches private anonymous memory only: " << why_;
  }
  watch(p, length);
  memset(p, 1, length);
  ASSERT_EQ(madvise(p, length, MADV_REMOVE), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Remove)) << describe(records);
  munmap(p, length);
}

TEST_P(Events, BrkShrink) {
  const size_t length = 16 * page_size();
  // Warm up: the first watch allocates the watch table, and malloc could move the break then.
  char *warm = map_anonymous(page_size());
  watch(warm, page_size());
  std::vector<Invalidation> records;
  records.reserve(64);
  // sbrk (not the raw syscall) so that malloc's idea of the break stays right.
  char *old_break = static_cast<char *>(sbrk(static_cast<intptr_t>(length)));
  ASSERT_NE(old_break, reinterpret_cast<char *>(-1));
  watch(old_break, length);
  old_break[0] = 1;
  if (sbrk(0) != old_break + length) GTEST_SKIP() << "malloc moved the break meanwhile";
  ASSERT_NE(sbrk(-static_cast<intptr_t>(length)), reinterpret_cast<void *>(-1));
  ASSERT_EQ(subscription_->drain([&records](const Invalidation &r) { records.push_back(r); }),
            DrainResult::Ok);
  EXPECT_TRUE(covered(records, u(old_break), u(old_break) + length, InvalidationKind::Unmap))
      << describe(records);
  munmap(warm, page_size());
}

TEST_P(Events, MapFixedOverAWatchedRange) {
  const size_t length = 8 * page_size();
  char *p = map_anonymous(length);
  watch(p, length);
  void *q = mmap(p, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_EQ(q, p);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap)) << describe(records);
  munmap(p, length);
}

TEST_P(Events, SharedAnonymousMemory) {
  const size_t length = 8 * page_size();
  void *p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  expect_shared_memory_events(static_cast<char *>(p), length, "MAP_SHARED|MAP_ANONYMOUS");
}

TEST_P(Events, ShmOpenMemory) {
  const size_t length = 8 * page_size();
  char name[64];
  snprintf(name, sizeof(name), "/mrc-uffd-test-%d", getpid());
  const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << strerror(errno);
  shm_unlink(name);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(length)), 0);
  void *p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  expect_shared_memory_events(static_cast<char *>(p), length, "shm_open");
}

TEST_P(Events, MemfdMemory) {
  const size_t length = 8 * page_size();
  const int fd = memfd_create("mrc-uffd-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(length)), 0);
  void *p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  expect_shared_memory_events(static_cast<char *>(p), length, "memfd_create");
}

TEST_P(Events, FileMappingNeedsWpAsync) {
  const size_t length = 8 * page_size();
  char path[] = "/tmp/mrc-uffd-file-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(length)), 0);
  char *p = static_cast<char *>(mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  const WatchResult result = try_watch(p, length);
  if (subscription_->mode() != MRC_MONITOR_WP_ASYNC) {
    // The kernel accepts write-protect registration of file pages only with WP_ASYNC.
    EXPECT_EQ(result, WatchResult::NotMonitorable);
    EXPECT_NE(why_[0], '\0');
    munmap(p, length);
    return;
  }
  ASSERT_EQ(result, WatchResult::Watched) << why_;
  p[0] = 1;
  ASSERT_EQ(munmap(p, length), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap)) << describe(records);
}

// Reserves `pages` huge pages for the scope when running as root and none are free. The test
// processes of this program run in parallel under ctest: a lock file serialises them, so that
// one never restores a count that another one raised.
class HugePages {
 public:
  explicit HugePages(long pages) {
    lock_ = open("/tmp/mrc-uffd-hugepages.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_ >= 0) flock(lock_, LOCK_EX);
    old_ = read_count();
    if (free_pages() >= pages || geteuid() != 0 || old_ < 0) return;
    write_count(old_ + pages);
    changed_ = true;
  }
  ~HugePages() {
    if (changed_) write_count(old_);
    if (lock_ >= 0) close(lock_);  // releases the lock
  }
  static long free_pages() {
    FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
    long n = 0;
    if (f != nullptr) {
      if (fscanf(f, "%ld", &n) != 1) n = 0;
      fclose(f);
    }
    return n;
  }

 private:
  static long read_count() {
    FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");
    long n = -1;
    if (f != nullptr) {
      if (fscanf(f, "%ld", &n) != 1) n = -1;
      fclose(f);
    }
    return n;
  }
  static void write_count(long n) {
    FILE *f = fopen("/proc/sys/vm/nr_hugepages", "w");
    if (f == nullptr) return;
    fprintf(f, "%ld\n", n);
    fclose(f);
  }
  int lock_ = -1;
  long old_ = -1;
  bool changed_ = false;
};

TEST_P(Events, HugetlbfsMemory) {
  const size_t huge = 2 << 20;
  HugePages reserve(2);
  void *p = mmap(nullptr, 2 * huge, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (p == MAP_FAILED) {
    GTEST_SKIP() << "no 2 MiB huge pages could be reserved (vm.nr_hugepages, free "
                 << HugePages::free_pages() << ", running as uid " << geteuid()
                 << "): " << strerror(errno);
  }
  char *bytes = static_cast<char *>(p);
  bytes[0] = 1;
  const WatchResult result = try_watch(bytes + 4096, 4096);
  if (missing_mode()) {
    EXPECT_EQ(result, WatchResult::NotMonitorable);
    munmap(p, 2 * huge);
    return;
  }
  ASSERT_EQ(result, WatchResult::Watched) << why_;
  // The watch covers the whole huge page it falls in (registration is huge-page granular).
  ASSERT_EQ(munmap(bytes, huge), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(bytes), u(bytes + huge), InvalidationKind::Unmap))
      << describe(records);
  munmap(bytes + huge, huge);
}

TEST_P(Events, SysvSharedMemoryIsNotMonitorable) {
  const size_t length = 8 * page_size();
  const int id = shmget(IPC_PRIVATE, length, IPC_CREAT | 0600);
  ASSERT_GE(id, 0) << strerror(errno);
  void *p = shmat(id, nullptr, 0);
  shmctl(id, IPC_RMID, nullptr);
  ASSERT_NE(p, reinterpret_cast<void *>(-1));
  EXPECT_EQ(try_watch(p, length), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why_).find("SysV"), std::string::npos) << why_;
  shmdt(p);
}

TEST_P(Events, UnmappedMemoryIsNotMonitorable) {
  const size_t length = 4 * page_size();
  char *p = map_anonymous(length);
  munmap(p, length);
  EXPECT_EQ(try_watch(p, length), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why_).find("not mapped"), std::string::npos) << why_;
}

TEST_P(Events, MissingModeResolvesEveryFault) {
  if (!missing_mode()) GTEST_SKIP() << "only MISSING mode takes faults";
  const size_t length = 16 * page_size();
  char *p = map_anonymous(length);
  watch(p, length);
  // A read fault, a write fault, and a fault taken inside the kernel (read(2) into the buffer):
  // each waits for the monitor's zero page. None may hang.
  EXPECT_EQ(p[0], 0);
  p[page_size()] = 5;
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  ASSERT_EQ(write(pipe_fds[1], "abc", 3), 3);
  EXPECT_EQ(read(pipe_fds[0], p + 2 * page_size(), 3), 3);
  EXPECT_EQ(memcmp(p + 2 * page_size(), "abc", 3), 0);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  munmap(p, length);
}

INSTANTIATE_TEST_SUITE_P(Modes, Events, ::testing::Values("wp-async", "wp", "missing"),
                         [](const ::testing::TestParamInfo<const char *> &param) {
                           std::string name = param.param;
                           for (char &c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace mrc::uffd::test
