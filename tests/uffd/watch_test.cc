// Watching: block widening, reference counting, re-arming after unmaps, VMA accounting and
// budget, memory that cannot be watched, and the mapping queries behind it.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "tests/uffd/helpers.h"

namespace mrc::uffd::test {
namespace {

class Watch : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(Monitor::subscribe(&consumer_), MRC_OK);
    if (consumer_->mode() == MRC_MONITOR_UNCACHED) {
      GTEST_SKIP() << "no userfaultfd here: " << monitor_info().reason;
    }
  }
  void TearDown() override {
    if (consumer_ != nullptr) Monitor::unsubscribe(consumer_);
    testing::set_vma_budget(0);
  }
  WatchResult try_watch(const void *p, size_t length) {
    why_[0] = '\0';
    return consumer_->watch(u(p), length, why_, sizeof(why_));
  }
  void watch(const void *p, size_t length) {
    ASSERT_EQ(try_watch(p, length), WatchResult::Watched) << why_;
  }
  void unwatch(const void *p, size_t length) { consumer_->unwatch(u(p), length); }
  std::vector<Invalidation> drain() { return drain_all(consumer_); }

  Consumer *consumer_ = nullptr;
  char why_[256];
};

TEST_F(Watch, AWatchOnAnArmedBlockCostsNoSyscall) {
  const size_t page = page_size();
  char *p = map_aligned(kWatchBlock, kWatchBlock);
  const uint64_t before = testing::registrations();
  watch(p, page);
  EXPECT_EQ(testing::registrations(), before + 1);
  watch(p + 100 * page, 4 * page);
  watch(p, page);
  watch(p + kWatchBlock - page, page);
  EXPECT_EQ(testing::registrations(), before + 1);
  munmap(p, kWatchBlock);
}

TEST_F(Watch, ALargeWatchIsOneRegistration) {
  const size_t length = 64 * kWatchBlock;
  char *p = map_aligned(length, kWatchBlock);
  const uint64_t before = testing::registrations();
  watch(p + 4096, length - 8192);
  EXPECT_EQ(testing::registrations(), before + 1);
  EXPECT_EQ(monitor_info().watched_bytes, length);
  munmap(p, length);
}

TEST_F(Watch, WideningCoversTheBlockButNotTheNextMapping) {
  const size_t page = page_size();
  char *p = map_aligned(kWatchBlock, kWatchBlock);
  // Two mappings in one block: different protections keep them separate VMAs.
  ASSERT_EQ(mprotect(p + kWatchBlock / 2, kWatchBlock / 2, PROT_READ), 0);
  watch(p, page);
  // Unwatched, but in the watched block and mapping: reported (widening).
  ASSERT_EQ(munmap(p + 10 * page, page), 0);
  auto records = drain();
  EXPECT_TRUE(covered(records, u(p + 10 * page), u(p + 11 * page), InvalidationKind::Unmap))
      << describe(records);
  // The other mapping in the same block was not registered: no report.
  ASSERT_EQ(munmap(p + kWatchBlock / 2, page), 0);
  records = drain();
  EXPECT_FALSE(touches(records, u(p + kWatchBlock / 2), u(p + kWatchBlock / 2 + page)))
      << describe(records);
  munmap(p, kWatchBlock);
}

TEST_F(Watch, NeighboursNeverUnwatchEachOther) {
  const size_t page = page_size();
  char *p = map_aligned(kWatchBlock, kWatchBlock);
  watch(p, page);
  watch(p + 2 * page, page);
  watch(p, page);  // the same range twice: two references
  unwatch(p, page);
  unwatch(p, page);
  // The neighbour's watch keeps the block registered.
  ASSERT_EQ(munmap(p + 2 * page, page), 0);
  auto records = drain();
  EXPECT_TRUE(covered(records, u(p + 2 * page), u(p + 3 * page), InvalidationKind::Unmap))
      << describe(records);
  unwatch(p + 2 * page, page);
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  // Last reference gone: unregistered, nothing is reported any more.
  ASSERT_EQ(munmap(p + 4 * page, page), 0);
  records = drain();
  EXPECT_TRUE(records.empty()) << describe(records);
  munmap(p, kWatchBlock);
}

TEST_F(Watch, ReRegistersAfterAnUnmapTookTheRegistrationAway) {
  const size_t page = page_size();
  char *p = map_aligned(kWatchBlock, kWatchBlock);
  watch(p, page);
  ASSERT_EQ(munmap(p + 3 * page, page), 0);  // the kernel drops the registration of that page
  auto records = drain();
  ASSERT_TRUE(covered(records, u(p + 3 * page), u(p + 4 * page), InvalidationKind::Unmap));
  // New memory at the same address, then a watch there: must register again (it is no longer
  // covered by the old registration), or its unmap would go unseen.
  void *again = mmap(p + 3 * page, page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(again, p + 3 * page);
  const uint64_t before = testing::registrations();
  watch(p + 3 * page, page);
  EXPECT_GT(testing::registrations(), before);
  ASSERT_EQ(munmap(p + 3 * page, page), 0);
  records = drain();
  EXPECT_TRUE(covered(records, u(p + 3 * page), u(p + 4 * page), InvalidationKind::Unmap))
      << describe(records);
  munmap(p, kWatchBlock);
}

// A piece re-armed while its range has a hole must not claim the hole: memory mapped there
// later is not registered by the earlier registration, and no unmap tells us it appeared.
TEST_F(Watch, MemoryMappedIntoAHoleIsRegisteredWhenWatched) {
  const size_t page = page_size();
  char *p = map_aligned(16 * page, kWatchBlock);
  watch(p, page);
  ASSERT_EQ(munmap(p + 4 * page, page), 0);  // a hole; the piece loses its armed state
  (void)drain();
  watch(p, page);  // registers again, around the hole
  void *filled = mmap(p + 4 * page, page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(filled, p + 4 * page);
  watch(p + 4 * page, page);
  ASSERT_EQ(munmap(p + 4 * page, page), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p + 4 * page), u(p + 5 * page), InvalidationKind::Unmap))
      << describe(records);
  munmap(p, 16 * page);
}

// The kernel removes a VMA before it queues the UNMAP event. New memory mapped at the same
// address in between lies in a piece that still looks armed; the watch must wait for the unmap
// in flight to be read, learn that the piece lost its registration, and register again.
TEST_F(Watch, AWatchWaitsForUnmapsInFlight) {
  const size_t page = page_size();
  char *p = map_aligned(16 * page, kWatchBlock);
  watch(p, page);
  char *hole = p + 4 * page;
  testing::pause_monitor(true);
  struct Resume {
    ~Resume() { testing::pause_monitor(false); }
  } resume;
  std::thread unmapper([hole, page] { munmap(hole, page); });  // blocks: nobody reads the event
  void *again = MAP_FAILED;
  for (int i = 0; i < 5000 && again == MAP_FAILED; ++i) {  // until the VMA is gone
    again = mmap(hole, page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (again == MAP_FAILED) usleep(200);
  }
  ASSERT_EQ(again, hole);
  std::atomic<bool> watched{false};
  WatchResult result = WatchResult::NotMonitorable;
  std::thread watcher([&] {
    result = consumer_->watch(u(hole), page);
    watched.store(true);
  });
  usleep(50000);
  EXPECT_FALSE(watched.load()) << "the watch did not wait for the unmap in flight";
  testing::pause_monitor(false);
  unmapper.join();
  watcher.join();
  ASSERT_EQ(result, WatchResult::Watched);
  (void)drain();
  ASSERT_EQ(munmap(hole, page), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(hole), u(hole) + page, InvalidationKind::Unmap))
      << describe(records);
  munmap(p, 16 * page);
}

TEST_F(Watch, SettleWaitsForUnmapsInFlight) {
  const size_t page = page_size();
  char *p = map_anonymous(4 * page);
  watch(p, 4 * page);
  testing::pause_monitor(true);
  struct Resume {
    ~Resume() { testing::pause_monitor(false); }
  } resume;
  std::thread unmapper([p, page] { munmap(p, 4 * page); });
  usleep(20000);
  std::atomic<bool> settled{false};
  std::thread settler([&] {
    consumer_->settle();
    settled.store(true);
  });
  usleep(50000);
  EXPECT_FALSE(settled.load());
  testing::pause_monitor(false);
  settler.join();
  unmapper.join();
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + 4 * page, InvalidationKind::Unmap))
      << describe(records);
}

TEST_F(Watch, ReRegistersAfterAMove) {
  const size_t length = 4 * page_size();
  char *p = map_anonymous(length);
  char *elsewhere = map_anonymous(length, PROT_NONE);
  watch(p, length);
  ASSERT_EQ(mremap(p, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, elsewhere), elsewhere);
  void *again = mmap(p, length, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(again, p);
  watch(p, length);
  (void)drain();
  ASSERT_EQ(munmap(p, length), 0);
  const auto records = drain();
  EXPECT_TRUE(covered(records, u(p), u(p) + length, InvalidationKind::Unmap)) << describe(records);
  munmap(elsewhere, length);
}

TEST_F(Watch, AMillionRegionsInOneMappingAddAtMostTwoVmas) {
  const size_t length = size_t{4} << 30;  // virtual only: never touched
  void *raw = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  char *p = static_cast<char *>(raw);
  const size_t vmas_before = count_vmas_in(u(p), u(p) + length);
  const uint64_t registrations_before = testing::registrations();
  const size_t regions = 1000000;
  const size_t stride = length / regions & ~size_t{63};
  for (size_t i = 0; i < regions; ++i) {
    ASSERT_EQ(try_watch(p + i * stride, 64), WatchResult::Watched) << why_;
  }
  const mrc_monitor_info_t info = monitor_info();
  const size_t added = count_vmas_in(u(p), u(p) + length) - vmas_before;
  EXPECT_LE(added, 2u);
  EXPECT_LE(info.vmas_added, 2u);
  // One registration per block, not per region.
  EXPECT_LE(testing::registrations() - registrations_before, length / kWatchBlock + 1);
  for (size_t i = 0; i < regions; ++i) unwatch(p + i * stride, 64);
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  EXPECT_EQ(monitor_info().vmas_added, 0u);
  EXPECT_EQ(count_vmas_in(u(p), u(p) + length), vmas_before);
  munmap(p, length);
}

TEST_F(Watch, IsolatedIslandsAreCountedAsTheKernelSplitsThem) {
  const size_t length = size_t{1} << 30;
  void *raw = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  char *p = static_cast<char *>(raw);
  const uintptr_t first_block = (u(p) + kWatchBlock - 1) & ~(kWatchBlock - 1);
  const size_t vmas_before = count_vmas_in(u(p), u(p) + length);
  // 100 one-page islands, two blocks apart: each one's block is registered alone.
  for (size_t i = 1; i <= 100; ++i) {
    watch(reinterpret_cast<char *>(first_block + 2 * i * kWatchBlock), page_size());
  }
  const int64_t added =
      static_cast<int64_t>(count_vmas_in(u(p), u(p) + length)) - static_cast<int64_t>(vmas_before);
  const int64_t estimated = static_cast<int64_t>(monitor_info().vmas_added);
  EXPECT_EQ(added, 200);
  EXPECT_EQ(estimated, added);
  munmap(p, length);
}

TEST_F(Watch, PastTheVmaBudgetTheAnswerIsNotMonitorable) {
  Monitor::unsubscribe(consumer_);
  testing::set_vma_budget(4);
  ASSERT_EQ(Monitor::subscribe(&consumer_), MRC_OK);
  EXPECT_EQ(monitor_info().vma_budget, 4u);
  const size_t length = size_t{256} << 20;
  void *raw = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  const uintptr_t block = (u(raw) + kWatchBlock - 1) & ~(kWatchBlock - 1);
  auto at = [block](size_t i) { return reinterpret_cast<char *>(block + i * kWatchBlock); };
  watch(at(2), 4096);  // +2 VMAs
  watch(at(6), 4096);  // +2 VMAs: budget reached
  EXPECT_EQ(try_watch(at(10), 4096), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why_).find("VMA budget"), std::string::npos) << why_;
  // Next to a registered block: the VMAs merge, nothing is added.
  watch(at(3), 4096);
  EXPECT_EQ(monitor_info().vmas_added, 4u);
  munmap(raw, length);
}

TEST_F(Watch, AnotherUserfaultfdsMemoryIsNotMonitorable) {
  const int foreign =
      static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  ASSERT_GE(foreign, 0) << strerror(errno);
  uffdio_api api{UFFD_API, 0, 0};
  ASSERT_EQ(ioctl(foreign, UFFDIO_API, &api), 0);
  const size_t length = 4 * page_size();
  char *p = map_anonymous(length);
  uffdio_register reg{};
  reg.range.start = u(p);
  reg.range.len = length;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;  // never touched, so never faults
  ASSERT_EQ(ioctl(foreign, UFFDIO_REGISTER, &reg), 0);
  EXPECT_EQ(try_watch(p, length), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why_).find("EBUSY"), std::string::npos) << why_;
  close(foreign);
  munmap(p, length);
}

TEST_F(Watch, ReadOnlySharedFileIsNotMonitorable) {
  char path[] = "/tmp/mrc-uffd-ro-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(page_size())), 0);
  close(fd);
  const int ro = open(path, O_RDONLY | O_CLOEXEC);
  unlink(path);
  void *p = mmap(nullptr, page_size(), PROT_READ, MAP_SHARED, ro, 0);
  close(ro);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(try_watch(p, page_size()), WatchResult::NotMonitorable);
  EXPECT_NE(why_[0], '\0');
  munmap(p, page_size());
}

TEST_F(Watch, EmptyAndWrappingRangesAreRefused) {
  char *p = map_anonymous(page_size());
  EXPECT_EQ(try_watch(p, 0), WatchResult::NotMonitorable);
  EXPECT_EQ(consumer_->watch(UINTPTR_MAX - 100, 4096, why_, sizeof(why_)),
            WatchResult::NotMonitorable);
  unwatch(p, 0);  // harmless
  munmap(p, page_size());
}

TEST_F(Watch, AFailedWatchLeavesNothingBehind) {
  const size_t page = page_size();
  char *p = map_aligned(kWatchBlock, kWatchBlock);
  ASSERT_EQ(munmap(p + 8 * page, page), 0);  // a hole inside the range
  const size_t vmas_before = count_vmas_in(u(p), u(p) + kWatchBlock);
  EXPECT_EQ(try_watch(p, 16 * page), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why_).find("not mapped"), std::string::npos) << why_;
  EXPECT_EQ(monitor_info().watched_bytes, 0u);
  EXPECT_EQ(count_vmas_in(u(p), u(p) + kWatchBlock), vmas_before);
  // Nothing stayed registered.
  ASSERT_EQ(munmap(p, page), 0);
  const auto records = drain();
  EXPECT_TRUE(records.empty()) << describe(records);
  munmap(p, kWatchBlock);
}

TEST(WatchUncached, MonitorOffWatchesNothing) {
  ScopedEnv off("MRC_MONITOR", "off");
  Subscription consumer;
  EXPECT_EQ(consumer->mode(), MRC_MONITOR_UNCACHED);
  char why[256];
  char *p = map_anonymous(page_size());
  EXPECT_EQ(consumer->watch(u(p), page_size(), why, sizeof(why)), WatchResult::NotMonitorable);
  EXPECT_NE(std::string(why).find("uncached"), std::string::npos) << why;
  EXPECT_TRUE(consumer->quiescent());
  EXPECT_EQ(consumer->drain([](const Invalidation &) { FAIL(); }), DrainResult::Ok);
  const mrc_monitor_info_t info = monitor_info();
  EXPECT_EQ(info.mode, MRC_MONITOR_UNCACHED);
  EXPECT_STREQ(info.mode_name, "uncached");
  EXPECT_NE(std::string(info.reason).find("MRC_MONITOR=off"), std::string::npos) << info.reason;
  EXPECT_EQ(info.running, 0);
  munmap(p, page_size());
}

// ---- mapping queries ----

class Query : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { testing::force_maps_fallback(GetParam()); }
  void TearDown() override { testing::force_maps_fallback(false); }
};

TEST_P(Query, AnonymousPrivateMemory) {
  const size_t length = 8 * page_size();
  char *p = map_anonymous(length, PROT_READ);
  Mapping m;
  ASSERT_EQ(query_mapping(u(p) + page_size(), &m), MRC_OK);
  EXPECT_LE(m.start, u(p));
  EXPECT_GE(m.end, u(p) + length);
  EXPECT_EQ(m.prot, static_cast<unsigned>(PROT_READ));
  EXPECT_FALSE(m.shared);
  EXPECT_TRUE(m.anonymous);
  EXPECT_FALSE(m.sysv_shm);
  EXPECT_EQ(m.inode, 0u);
  EXPECT_EQ(m.page_size, page_size());
  munmap(p, length);
}

TEST_P(Query, SharedFileMemory) {
  char path[] = "/tmp/mrc-uffd-q-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(page_size())), 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  void *p = mmap(nullptr, page_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  Mapping m;
  ASSERT_EQ(query_mapping(u(p), &m), MRC_OK);
  EXPECT_EQ(m.start, u(p));
  EXPECT_EQ(m.end, u(p) + page_size());
  EXPECT_EQ(m.prot, static_cast<unsigned>(PROT_READ | PROT_WRITE));
  EXPECT_TRUE(m.shared);
  EXPECT_FALSE(m.anonymous);
  EXPECT_EQ(m.inode, st.st_ino);
  munmap(p, page_size());
}

TEST_P(Query, SysvSharedMemory) {
  const int id = shmget(IPC_PRIVATE, page_size(), IPC_CREAT | 0600);
  ASSERT_GE(id, 0);
  void *p = shmat(id, nullptr, 0);
  shmctl(id, IPC_RMID, nullptr);
  Mapping m;
  ASSERT_EQ(query_mapping(u(p), &m), MRC_OK);
  EXPECT_TRUE(m.sysv_shm);
  EXPECT_TRUE(m.shared);
  shmdt(p);
}

TEST_P(Query, HeapAndStack) {
  int on_stack = 0;
  Mapping m;
  ASSERT_EQ(query_mapping(u(&on_stack), &m), MRC_OK);
  EXPECT_TRUE(m.anonymous);
  EXPECT_LE(m.start, u(&on_stack));
  EXPECT_GT(m.end, u(&on_stack));
}

TEST_P(Query, UnmappedAndNext) {
  const size_t page = page_size();
  char *p = map_anonymous(3 * page);
  ASSERT_EQ(munmap(p, page), 0);
  ASSERT_EQ(mprotect(p + page, 2 * page, PROT_READ), 0);  // its own VMA
  Mapping m;
  EXPECT_EQ(query_mapping(u(p), &m), MRC_ERR_NOT_FOUND);
  ASSERT_EQ(query_mapping_from(u(p), &m), MRC_OK);
  EXPECT_EQ(m.start, u(p) + page);
  EXPECT_EQ(query_mapping(~uintptr_t{0} - 4096, &m), MRC_ERR_NOT_FOUND);
  EXPECT_EQ(query_mapping(0, nullptr), MRC_ERR_INVALID);
  munmap(p + page, 2 * page);
}

INSTANTIATE_TEST_SUITE_P(Sources, Query, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &param) {
                           return param.param ? std::string("ProcMapsParser")
                                              : std::string("ProcmapQuery");
                         });

}  // namespace
}  // namespace mrc::uffd::test
