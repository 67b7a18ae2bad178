// SPDX-License-Identifier: BSD-3-Clause
// The io_uring backend: the slot table (allocation, release tags, reuse only after the kernel
// released the old buffer), its errors, concurrency, and the data-path oracle: a WRITE_FIXED
// through a registration writes the pages that were registered, so after the memory is
// replaced a stale registration writes the old bytes, and a fresh one the new bytes.
#include <gtest/gtest.h>
#include <liburing.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "helpers.h"
#include "mrcache/mrcache.h"

namespace {

using namespace mrc_test;  // NOLINT(google-build-using-namespace): test helpers
using Ctx = IouringCtx;

TEST(IouringBackend, CreateWithDefaults) {
  Ctx c;
  ASSERT_NE(c.ctx, nullptr);
  EXPECT_NE(mrc_iouring_ctx_ring(c.ctx), nullptr);
  const auto s = c.slots();
  EXPECT_EQ(s.installed, 0u);
  EXPECT_EQ(s.awaiting, 0u);
  EXPECT_EQ(s.free, MRC_IOURING_DEFAULT_SLOTS);
}

TEST(IouringBackend, BadParametersAreInvalid) {
  mrc_iouring_ctx_t *ctx = nullptr;
  mrc_iouring_params_t p;
  mrc_iouring_params_init(&p);
  EXPECT_EQ(mrc_iouring_ctx_create(&p, nullptr), MRC_ERR_INVALID);
  p.slots = MRC_IOURING_MAX_SLOTS + 1;
  EXPECT_EQ(mrc_iouring_ctx_create(&p, &ctx), MRC_ERR_INVALID);
  EXPECT_TRUE(Contains(LastError(), "iouring: 16385 slots exceed")) << LastError();
  p.slots = 4;
  p.flags = 0x80;
  EXPECT_EQ(mrc_iouring_ctx_create(&p, &ctx), MRC_ERR_INVALID);
  EXPECT_EQ(ctx, nullptr);
}

TEST(IouringBackend, RingWithATableAlreadyIsBusy) {
  io_uring ring{};
  ASSERT_EQ(io_uring_queue_init(8, &ring, 0), 0);
  ASSERT_EQ(io_uring_register_buffers_sparse(&ring, 4), 0);
  mrc_iouring_ctx_t *ctx = nullptr;
  mrc_iouring_params_t p{.ring = &ring, .slots = 4, .flags = 0};
  EXPECT_EQ(mrc_iouring_ctx_create(&p, &ctx), MRC_ERR_BUSY);
  EXPECT_TRUE(Contains(LastError(), "already has a buffer table")) << LastError();
  // The application's table survived the failed create.
  Mapping m(4096);
  iovec iov{m.addr, m.len};
  __u64 tag = 0;
  EXPECT_EQ(io_uring_register_buffers_update_tag(&ring, 0, &iov, &tag, 1), 1);
  io_uring_queue_exit(&ring);
}

TEST(IouringBackend, BadRegistrationsAreRefusedWithTheReason) {
  Ctx c(4);
  void *h = nullptr;
  uint64_t key = 0;
  // No context.
  EXPECT_EQ(Ops().reg(nullptr, &key, sizeof key, MRC_PROT_READ, &h, &key), MRC_ERR_INVALID);
  EXPECT_EQ(LastError(), "iouring: no context (backend_ctx is NULL)");
  // Memory that is not mapped.
  void *hole = mmap(nullptr, 1 << 16, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  ASSERT_EQ(munmap(hole, 1 << 16), 0);
  EXPECT_EQ(Ops().reg(c.ctx, hole, 1 << 16, MRC_PROT_READ, &h, &key), MRC_ERR_INVALID);
  EXPECT_TRUE(Contains(LastError(), "iouring: cannot pin")) << LastError();
  // Read-only memory: io_uring pins for write whatever the protection asked for.
  Mapping readonly(1 << 16, PROT_READ);
  EXPECT_EQ(Ops().reg(c.ctx, readonly.addr, readonly.len, MRC_PROT_READ, &h, &key),
            MRC_ERR_INVALID);
  EXPECT_TRUE(Contains(LastError(), "not writable")) << LastError();
  // One buffer above the kernel's 1 GiB limit.
  EXPECT_EQ(Ops().reg(c.ctx, readonly.addr, (size_t{1} << 30) + 4096, MRC_PROT_READ, &h, &key),
            MRC_ERR_UNSUPPORTED);
  EXPECT_TRUE(Contains(LastError(), "1 GiB")) << LastError();
  // Generic argument checks.
  EXPECT_EQ(Ops().reg(c.ctx, readonly.addr, 0, MRC_PROT_READ, &h, &key), MRC_ERR_INVALID);
  EXPECT_EQ(Ops().reg(c.ctx, readonly.addr, 4096, 8, &h, &key), MRC_ERR_INVALID);
  // Failures took no slot.
  const auto s = c.slots();
  EXPECT_EQ(s.installed, 0u);
  EXPECT_EQ(s.free, 4u);
}

TEST(IouringBackend, SlotsAreAllocatedFreedAndReused) {
  Ctx c(2);
  Mapping m(size_t{3} * 4096);
  const Registration a = MustReg(c.ctx, m.bytes(), 4096);
  const Registration b = MustReg(c.ctx, m.bytes() + 4096, 4096);
  EXPECT_EQ(a.key, 0u);
  EXPECT_EQ(b.key, 1u);
  EXPECT_EQ(mrc_iouring_handle_slot(a.handle), 0u);
  EXPECT_EQ(mrc_iouring_handle_slot(b.handle), 1u);
  EXPECT_EQ(mrc_iouring_handle_ring(a.handle), mrc_iouring_ctx_ring(c.ctx));

  // Full.
  void *h = nullptr;
  uint64_t key = 0;
  EXPECT_EQ(Ops().reg(c.ctx, m.bytes() + 8192, 4096, MRC_PROT_READ, &h, &key), MRC_ERR_NO_MEMORY);
  EXPECT_TRUE(Contains(LastError(), "iouring: buffer table full (2 slots: 2 in use, 0 awaiting"))
      << LastError();

  // Emptied: awaiting its release tag, not free yet.
  Ops().dereg(c.ctx, a.handle);
  auto s = c.slots();
  EXPECT_EQ(s.installed, 1u);
  EXPECT_EQ(s.awaiting, 1u);
  EXPECT_EQ(s.free, 0u);

  // The next reg finds the tag (no I/O was in flight) and reuses slot 0.
  const Registration d = MustReg(c.ctx, m.bytes() + 8192, 4096);
  EXPECT_EQ(d.key, 0u);
  s = c.slots();
  EXPECT_EQ(s.installed, 2u);
  EXPECT_EQ(s.awaiting, 0u);
  Ops().dereg(c.ctx, b.handle);
  Ops().dereg(c.ctx, d.handle);
  s = c.slots();
  EXPECT_EQ(s.installed, 0u);
  EXPECT_EQ(s.awaiting, 2u);
}

TEST(IouringBackend, SlotIsReusedOnlyAfterInFlightIoReleasedTheBuffer) {
  Ctx c(1);
  Mapping m(size_t{2} * 4096);
  const Registration a = MustReg(c.ctx, m.bytes(), 4096);
  io_uring *ring = mrc_iouring_ctx_ring(c.ctx);

  // A READ_FIXED from an empty pipe stays in flight and holds the buffer.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  io_uring_sqe *sqe = io_uring_get_sqe(ring);
  ASSERT_NE(sqe, nullptr);
  io_uring_prep_read_fixed(sqe, pipe_fds[0], m.bytes(), 64, 0, static_cast<int>(a.key));
  sqe->user_data = 77;
  ASSERT_EQ(io_uring_submit(ring), 1);
  usleep(20000);

  Ops().dereg(c.ctx, a.handle);
  void *h = nullptr;
  uint64_t key = 0;
  EXPECT_EQ(Ops().reg(c.ctx, m.bytes() + 4096, 4096, MRC_PROT_READ, &h, &key), MRC_ERR_NO_MEMORY);
  EXPECT_TRUE(Contains(LastError(), "0 in use, 1 awaiting release")) << LastError();

  // The read completes into the old buffer; then the kernel releases it.
  ASSERT_EQ(write(pipe_fds[1], "released", 8), 8);
  io_uring_cqe *cqe = nullptr;
  ASSERT_EQ(io_uring_wait_cqe(ring, &cqe), 0);
  EXPECT_EQ(mrc_iouring_ctx_complete(c.ctx, cqe->user_data), 0);  // the application's own
  EXPECT_EQ(cqe->user_data, 77u);
  EXPECT_EQ(cqe->res, 8);
  io_uring_cqe_seen(ring, cqe);
  EXPECT_EQ(std::memcmp(m.bytes(), "released", 8), 0);

  const Registration b = MustReg(c.ctx, m.bytes() + 4096, 4096);
  EXPECT_EQ(b.key, 0u);
  Ops().dereg(c.ctx, b.handle);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(IouringBackend, ApplicationThatReapsForwardsTheTags) {
  io_uring ring{};
  ASSERT_EQ(io_uring_queue_init(8, &ring, 0), 0);
  {
    Ctx c(1, &ring, MRC_IOURING_APP_REAPS);
    ASSERT_EQ(mrc_iouring_ctx_ring(c.ctx), &ring);
    Mapping m(size_t{2} * 4096);
    const Registration a = MustReg(c.ctx, m.bytes(), 4096);
    Ops().dereg(c.ctx, a.handle);
    void *h = nullptr;
    uint64_t key = 0;
    // reg does not touch the application's queue, so the tag is still unknown to it.
    EXPECT_EQ(Ops().reg(c.ctx, m.bytes(), 4096, MRC_PROT_READ, &h, &key), MRC_ERR_NO_MEMORY);
    EXPECT_TRUE(Contains(LastError(), "forward tag completions")) << LastError();

    io_uring_cqe *cqe = nullptr;
    ASSERT_EQ(io_uring_peek_cqe(&ring, &cqe), 0);
    EXPECT_EQ(cqe->user_data >> 48, MRC_IOURING_TAG_MAGIC);
    EXPECT_EQ(mrc_iouring_ctx_complete(c.ctx, cqe->user_data), 1);
    // Forwarding it twice is harmless.
    EXPECT_EQ(mrc_iouring_ctx_complete(c.ctx, cqe->user_data), 1);
    io_uring_cqe_seen(&ring, cqe);
    EXPECT_EQ(c.slots().free, 1u);
    EXPECT_EQ(mrc_iouring_ctx_complete(c.ctx, 12345), 0);

    const Registration b = MustReg(c.ctx, m.bytes(), 4096);
    EXPECT_EQ(b.key, 0u);
    // The helpers need a ring the context owns and reaps.
    size_t done = 0;
    EXPECT_EQ(mrc_iouring_ctx_write_fixed(c.ctx, b.handle, 1, m.bytes(), 16, 0, &done),
              MRC_ERR_INVALID);
    Ops().dereg(c.ctx, b.handle);
  }
  // The context removed its table: the ring can take another one.
  EXPECT_EQ(io_uring_register_buffers_sparse(&ring, 2), 0);
  io_uring_queue_exit(&ring);
}

TEST(IouringBackend, TagsBehindAForeignCompletionAreStillSeen) {
  Ctx c(1);
  io_uring *ring = mrc_iouring_ctx_ring(c.ctx);
  Mapping m(4096);
  // An application completion sits at the head of the queue, unreaped...
  io_uring_sqe *sqe = io_uring_get_sqe(ring);
  io_uring_prep_nop(sqe);
  sqe->user_data = 5;
  ASSERT_EQ(io_uring_submit(ring), 1);
  // ...and the release tag lands behind it.
  const Registration a = MustReg(c.ctx, m.bytes(), 4096);
  Ops().dereg(c.ctx, a.handle);
  const Registration b = MustReg(c.ctx, m.bytes(), 4096);
  EXPECT_EQ(b.key, 0u);
  // The application's completion was left for the application.
  io_uring_cqe *cqe = nullptr;
  ASSERT_EQ(io_uring_peek_cqe(ring, &cqe), 0);
  EXPECT_EQ(cqe->user_data, 5u);
  io_uring_cqe_seen(ring, cqe);
  ASSERT_EQ(io_uring_peek_cqe(ring, &cqe), 0);
  EXPECT_EQ(mrc_iouring_ctx_complete(c.ctx, cqe->user_data), 1);  // the old tag: a no-op now
  io_uring_cqe_seen(ring, cqe);
  EXPECT_EQ(c.slots().installed, 1u);
  Ops().dereg(c.ctx, b.handle);
}

TEST(IouringBackend, DescribeNamesSlotAndRange) {
  Ctx c(4);
  Mapping m(8192);
  const Registration r = MustReg(c.ctx, m.bytes(), 8192);
  char buf[128];
  const int n = Ops().describe(c.ctx, r.handle, buf, sizeof buf);
  EXPECT_GT(n, 0);
  EXPECT_TRUE(Contains(buf, "iouring: slot 0 [")) << buf;
  EXPECT_TRUE(Contains(buf, "+8192) ring fd")) << buf;
  Ops().dereg(c.ctx, r.handle);
}

// In a child without CAP_IPC_LOCK and with a small RLIMIT_MEMLOCK, pinning more than the limit
// fails with MRC_ERR_NO_MEMORY and a message that names the limit.
TEST(IouringBackend, MemlockLimitGivesNoMemoryWithTheReason) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipe_fds[0]);
    auto report = [&](const std::string &text, int code) {
      (void)!write(pipe_fds[1], text.data(), text.size());
      _exit(code);
    };
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (syscall(SYS_capget, &header, caps) != 0) report("capget failed", 2);
    caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    if (syscall(SYS_capset, &header, caps) != 0) report("capset failed", 2);
    rlimit limit{rlim_t{64} * 1024, rlim_t{64} * 1024};
    if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) report("setrlimit failed", 2);
    mrc_iouring_ctx_t *ctx = nullptr;
    mrc_iouring_params_t p{.ring = nullptr, .slots = 4, .flags = 0};
    if (mrc_iouring_ctx_create(&p, &ctx) != MRC_OK) report(LastError(), 3);
    void *mem = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    void *h = nullptr;
    uint64_t key = 0;
    const mrc_status_t s = Ops().reg(ctx, mem, 1 << 20, MRC_PROT_WRITE, &h, &key);
    report(LastError(), s == MRC_ERR_NO_MEMORY ? 0 : 1);
  }
  close(pipe_fds[1]);
  char buf[512] = {};
  const ssize_t n = read(pipe_fds[0], buf, sizeof buf - 1);
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_GT(n, 0);
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << "cannot drop CAP_IPC_LOCK here: " << buf;
  EXPECT_EQ(WEXITSTATUS(status), 0) << buf;
  EXPECT_TRUE(Contains(buf, "iouring: cannot pin 1048576 bytes")) << buf;
  EXPECT_TRUE(Contains(buf, "RLIMIT_MEMLOCK 64 KiB")) << buf;
}

// ---- the data-path oracle ---------------------------------------------------------------

enum class Replace { kMunmap, kMremap, kMadviseDontneed, kMapFixed };

const char *Name(Replace r) {
  switch (r) {
    case Replace::kMunmap: return "munmap";
    case Replace::kMremap: return "mremap";
    case Replace::kMadviseDontneed: return "madvise_dontneed";
    case Replace::kMapFixed: return "map_fixed";
  }
  return "?";
}

void Fill(char *p, size_t len, unsigned seed) {
  for (size_t i = 0; i < len; ++i) p[i] = static_cast<char>((i * 131 + size_t{seed} * 7919) >> 3);
}

class IouringOracle : public ::testing::TestWithParam<Replace> {
 protected:
  static constexpr size_t kLen = size_t{64} * 1024;

  void SetUp() override {
    fd_ = memfd_create("mrc-oracle", 0);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(ftruncate(fd_, kLen), 0);
  }
  void TearDown() override { close(fd_); }

  // Writes the registration's [addr, addr+kLen) to the file through WRITE_FIXED and returns
  // what the file holds afterwards.
  std::string WriteThrough(const Registration &r, const char *addr) const {
    std::vector<char> zeros(kLen, 0);
    EXPECT_EQ(pwrite(fd_, zeros.data(), kLen, 0), static_cast<ssize_t>(kLen));
    size_t done = 0;
    EXPECT_EQ(mrc_iouring_ctx_write_fixed(ctx_.ctx, r.handle, fd_, addr, kLen, 0, &done), MRC_OK)
        << LastError();
    EXPECT_EQ(done, kLen);
    std::string file(kLen, '\0');
    EXPECT_EQ(pread(fd_, file.data(), kLen, 0), static_cast<ssize_t>(kLen));
    return file;
  }

  Ctx ctx_{8};
  int fd_ = -1;
};

TEST_P(IouringOracle, StaleRegistrationWritesOldPagesFreshOneWritesNewOnes) {
  char *addr = static_cast<char *>(
      mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(addr, MAP_FAILED);
  Fill(addr, kLen, 1);
  const std::string old_bytes(addr, kLen);
  const Registration old_reg = MustReg(ctx_.ctx, addr, kLen);

  // The oracle agrees with memory while the registration is current.
  ASSERT_EQ(WriteThrough(old_reg, addr), old_bytes);

  // Replace the memory at the same address with new contents.
  void *moved = nullptr;
  switch (GetParam()) {
    case Replace::kMunmap:
      ASSERT_EQ(munmap(addr, kLen), 0);
      ASSERT_EQ(mmap(addr, kLen, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
                addr);
      break;
    case Replace::kMremap:
      moved = mmap(nullptr, kLen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(moved, MAP_FAILED);
      ASSERT_EQ(mremap(addr, kLen, kLen, MREMAP_MAYMOVE | MREMAP_FIXED, moved), moved);
      ASSERT_EQ(mmap(addr, kLen, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
                addr);
      break;
    case Replace::kMadviseDontneed: ASSERT_EQ(madvise(addr, kLen, MADV_DONTNEED), 0); break;
    case Replace::kMapFixed:
      ASSERT_EQ(
          mmap(addr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
          addr);
      break;
  }
  Fill(addr, kLen, 2);
  const std::string new_bytes(addr, kLen);
  ASSERT_NE(new_bytes, old_bytes);

  // The stale registration still writes the old pages: what the oracle must catch.
  const std::string stale = WriteThrough(old_reg, addr);
  EXPECT_EQ(stale, old_bytes) << Name(GetParam());
  EXPECT_NE(stale, std::string(addr, kLen));

  // A fresh registration writes what is in memory now.
  Ops().dereg(ctx_.ctx, old_reg.handle);
  const Registration new_reg = MustReg(ctx_.ctx, addr, kLen);
  EXPECT_EQ(WriteThrough(new_reg, addr), new_bytes) << Name(GetParam());

  // Reading back through the fresh registration lands in the new pages.
  std::memset(addr, 0, kLen);
  size_t done = 0;
  ASSERT_EQ(mrc_iouring_ctx_read_fixed(ctx_.ctx, new_reg.handle, fd_, addr, kLen, 0, &done), MRC_OK)
      << LastError();
  EXPECT_EQ(done, kLen);
  EXPECT_EQ(std::string(addr, kLen), new_bytes);

  Ops().dereg(ctx_.ctx, new_reg.handle);
  munmap(addr, kLen);
  if (moved != nullptr) munmap(moved, kLen);
}

INSTANTIATE_TEST_SUITE_P(Replacements, IouringOracle,
                         ::testing::Values(Replace::kMunmap, Replace::kMremap,
                                           Replace::kMadviseDontneed, Replace::kMapFixed),
                         [](const auto &param_info) {
                           return std::string(Name(param_info.param));
                         });

TEST(IouringBackend, HelperRefusesRangesOutsideTheRegistration) {
  Ctx c(2);
  Mapping m(size_t{3} * 4096);
  const Registration r = MustReg(c.ctx, m.bytes() + 4096, 4096);
  size_t done = 0;
  EXPECT_EQ(mrc_iouring_ctx_write_fixed(c.ctx, r.handle, 1, m.bytes(), 16, 0, &done),
            MRC_ERR_INVALID);
  EXPECT_TRUE(Contains(LastError(), "outside slot 0")) << LastError();
  EXPECT_EQ(mrc_iouring_ctx_write_fixed(c.ctx, r.handle, 1, m.bytes() + 4096, 4097, 0, &done),
            MRC_ERR_INVALID);
  EXPECT_EQ(mrc_iouring_ctx_write_fixed(c.ctx, r.handle, -1, m.bytes() + 4096, 16, 0, &done),
            MRC_ERR_IO);
  EXPECT_TRUE(Contains(LastError(), "Bad file descriptor")) << LastError();
  Ops().dereg(c.ctx, r.handle);
  // A handle that was deregistered is refused.
  EXPECT_EQ(mrc_iouring_ctx_write_fixed(c.ctx, r.handle, 1, m.bytes() + 4096, 16, 0, &done),
            MRC_ERR_INVALID);
}

}  // namespace
