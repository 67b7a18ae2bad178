// SPDX-License-Identifier: BSD-3-Clause
// base/proc_maps.h: a mapping's facts from PROCMAP_QUERY and from the /proc/self/maps parser
// (each test runs on both), and the descriptors' fork handlers.
#include "base/proc_maps.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/testing.h"
#include "tests/common/fork_child.h"

namespace mrc::os {
namespace {

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
uintptr_t u(const void *p) { return reinterpret_cast<uintptr_t>(p); }

char *map_anonymous(size_t length, int prot = PROT_READ | PROT_WRITE) {
  void *p = mmap(nullptr, length, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  return static_cast<char *>(p);
}

class Query : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { testing::force_maps_fallback(GetParam()); }
  void TearDown() override { testing::force_maps_fallback(false); }
};

TEST_P(Query, AnonymousPrivateMemory) {
  const size_t length = 8 * page_size();
  char *p = map_anonymous(length, PROT_READ);
  Vma m;
  ASSERT_EQ(query_vma(u(p) + page_size(), &m), MRC_OK);
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
  Vma m;
  ASSERT_EQ(query_vma(u(p), &m), MRC_OK);
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
  Vma m;
  ASSERT_EQ(query_vma(u(p), &m), MRC_OK);
  EXPECT_TRUE(m.sysv_shm);
  EXPECT_TRUE(m.shared);
  shmdt(p);
}

TEST_P(Query, HeapAndStack) {
  int on_stack = 0;
  Vma m;
  ASSERT_EQ(query_vma(u(&on_stack), &m), MRC_OK);
  EXPECT_TRUE(m.anonymous);
  EXPECT_LE(m.start, u(&on_stack));
  EXPECT_GT(m.end, u(&on_stack));
}

// start_brk from /proc/self/stat (field 47): the first VMA of the heap starts there once the heap
// has grown, and the break is never below it.
TEST(BrkHeap, StartIsWhereTheHeapBegins) {
  const uintptr_t start = brk_heap_start();
  ASSERT_NE(start, 0u);
  EXPECT_EQ(start % page_size(), 0u);
  ASSERT_NE(sbrk(static_cast<intptr_t>(page_size())), reinterpret_cast<void *>(-1));
  const uintptr_t brk_now = u(sbrk(0));
  EXPECT_LT(start, brk_now);
  Vma heap{};
  ASSERT_EQ(query_vma(start, &heap), MRC_OK) << "the heap's first page is mapped";
  EXPECT_EQ(heap.start, start);
  EXPECT_TRUE(heap.anonymous);
}

TEST_P(Query, UnmappedAndNext) {
  const size_t page = page_size();
  char *p = map_anonymous(3 * page);
  ASSERT_EQ(munmap(p, page), 0);
  ASSERT_EQ(mprotect(p + page, 2 * page, PROT_READ), 0);  // its own VMA
  Vma m;
  EXPECT_EQ(query_vma(u(p), &m), MRC_ERR_NOT_FOUND);
  ASSERT_EQ(query_vma_from(u(p), &m), MRC_OK);
  EXPECT_EQ(m.start, u(p) + page);
  EXPECT_EQ(query_vma(~uintptr_t{0} - 4096, &m), MRC_ERR_NOT_FOUND);
  EXPECT_EQ(query_vma(0, nullptr), MRC_ERR_INVALID);
  munmap(p + page, 2 * page);
}

INSTANTIATE_TEST_SUITE_P(Sources, Query, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &param) {
                           return param.param ? std::string("ProcMapsParser")
                                              : std::string("ProcmapQuery");
                         });

// A /proc/self/maps descriptor kept open by the parent describes the parent: a forked child
// must query its own address space, even if it never subscribed.
TEST(ProcMapsFork, QueriesInAForkedChildDescribeTheChild) {
  Vma m;
  int on_stack = 0;
  ASSERT_EQ(query_vma(u(&on_stack), &m), MRC_OK);  // the parent opens its descriptor
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char *fresh = static_cast<char *>(
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    Vma child;
    CHILD_CHECK(query_vma(u(fresh), &child) == MRC_OK);
    CHILD_CHECK(child.start <= u(fresh) && child.end > u(fresh));
    _exit(0);
  }
  EXPECT_EQ(wait_child(pid), 0);
}

}  // namespace
}  // namespace mrc::os
