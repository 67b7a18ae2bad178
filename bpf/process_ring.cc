// SPDX-License-Identifier: BSD-3-Clause
// This process's ring (process_ring.h), the programs of its own or the daemon's, and the
// self-test of every kind of change.
#include "bpf/process_ring.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>

#include "base/error.h"
#include "bpf/abi.h"

namespace mrc::bpf {
namespace {

int64_t now_ns() noexcept {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1'000'000'000LL + now.tv_nsec;
}

// Drains until a record of `kind` covering [start, end) shows, for at most 100 ms (a record
// another thread's change left in flight ahead of ours holds the drain up that long at most).
bool record_shows(RingConsumer &consumer, ChangeKind kind, uintptr_t start, uintptr_t end) {
  const int64_t deadline = now_ns() + 100'000'000;
  bool seen = false;
  do {
    const RingConsumer::Drained drained = consumer.drain([&](const ChangeRecord &record) {
      if (record.kind == static_cast<uint32_t>(kind) && record.start <= start &&
          record.end >= end) {
        seen = true;
      }
    });
    if (drained == RingConsumer::Drained::Lost) consumer.purged();
    if (seen) return true;
    sched_yield();
  } while (now_ns() < deadline);
  return false;
}

// The changes go to the kernel by raw system calls: the self-test proves the kernel's hooks, and
// a library that interposes libc's wrappers (UCX 1.13's libucm drops mremap's fifth argument)
// must not make them fail or look missed.
long sys_mmap(void *at, size_t bytes, int extra_flags) noexcept {
  return syscall(SYS_mmap, at, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
}

uint8_t *map_pages(size_t bytes, void *at = nullptr, int extra_flags = 0) noexcept {
  const long p = sys_mmap(at, bytes, extra_flags);
  if (p < 0 && p > -4096) return nullptr;         // a raw system call returns -errno
  memset(reinterpret_cast<void *>(p), 1, bytes);  // pages to drop
  return reinterpret_cast<uint8_t *>(p);
}

// A raw call's result: true when it succeeded; else errno holds why.
bool succeeded(long result) noexcept {
  if (result < 0 && result > -4096) {
    errno = static_cast<int>(-result);
    return false;
  }
  return true;
}

}  // namespace

mrc_status_t self_test(RingConsumer &consumer) noexcept {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Two scratch areas of four pages; every step leaves them mapped or unmaps them itself.
  uint8_t *a = map_pages(4 * page);
  uint8_t *b = map_pages(4 * page);
  if (a == nullptr || b == nullptr) {
    const int error = errno;
    if (a != nullptr) syscall(SYS_munmap, a, 4 * page);
    if (b != nullptr) syscall(SYS_munmap, b, 4 * page);
    set_last_error("bpf monitor self-test: mmap: %s", strerror(error));
    return MRC_ERR_NO_MEMORY;
  }
  const auto at = [](const uint8_t *p) { return reinterpret_cast<uintptr_t>(p); };
  struct Step {
    const char *name;
    ChangeKind kind;
    uintptr_t start, end;
  };
  // Each change and the record it must leave: munmap of a part, madvise(MADV_DONTNEED),
  // mmap(MAP_FIXED) over a mapping, a shrinking mremap (its old range), a moving one onto `a`
  // (its old range; the unmap of the target reports too).
  const Step steps[] = {
      {"munmap", ChangeKind::Unmap, at(a + 3 * page), at(a + 4 * page)},
      {"madvise(MADV_DONTNEED)", ChangeKind::Madvise, at(a), at(a + page)},
      {"mmap(MAP_FIXED) over a mapping", ChangeKind::Unmap, at(a + page), at(a + 2 * page)},
      {"mremap (shrinking)", ChangeKind::Remap, at(b), at(b + 4 * page)},
      {"mremap (moving)", ChangeKind::Remap, at(b), at(b + 3 * page)},
  };
  const auto change = [&](size_t step) -> long {
    switch (step) {
      case 0: return syscall(SYS_munmap, a + 3 * page, page);
      case 1: return syscall(SYS_madvise, a, page, MADV_DONTNEED);
      case 2: return sys_mmap(a + page, page, MAP_FIXED);
      case 3: return syscall(SYS_mremap, b, 4 * page, 3 * page, 0, 0);
      default: return syscall(SYS_mremap, b, 3 * page, 3 * page, MREMAP_MAYMOVE | MREMAP_FIXED, a);
    }
  };
  mrc_status_t status = MRC_OK;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0] && status == MRC_OK; ++i) {
    if (!succeeded(change(i))) {
      set_last_error("bpf monitor self-test: %s failed: %s", steps[i].name, strerror(errno));
      status = MRC_ERR_IO;
    } else if (!record_shows(consumer, steps[i].kind, steps[i].start, steps[i].end)) {
      set_last_error("bpf monitor self-test: %s left no record in the ring", steps[i].name);
      status = MRC_ERR_UNSUPPORTED;
    }
  }
  syscall(SYS_munmap, a, 4 * page);
  syscall(SYS_munmap, b, 4 * page);
  record_shows(consumer, ChangeKind::Unmap, at(b), at(b + 4 * page));
  return status;
}

mrc_status_t ProcessRing::map_and_test(int lost_fd) noexcept {
  mrc_status_t status = ring_.map(client_.ring_fd, client_.ring_bytes);
  if (status != MRC_OK) return status;
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  lost_bytes_ =
      (MRC_BPF_MAX_CLIENTS * MRC_BPF_LOST_STRIDE * sizeof(uint64_t) + page - 1) & ~(page - 1);
  // Frozen: mappable read-only only.
  void *lost = mmap(nullptr, lost_bytes_, PROT_READ, MAP_SHARED, lost_fd, 0);
  if (lost == MAP_FAILED) {
    set_last_error("bpf monitor: mmap of the lost counters: %s", strerror(errno));
    return MRC_ERR_IO;
  }
  lost_ = lost;
  RingLayout layout = ring_.layout();
  layout.lost =
      static_cast<const std::atomic<uint64_t> *>(lost) + size_t{client_.slot} * MRC_BPF_LOST_STRIDE;
  consumer_.attach(layout);
  return self_test(consumer_);
}

mrc_status_t ProcessRing::open_own(size_t ring_bytes, ProcessRing **out) noexcept {
  *out = nullptr;
  auto *own = new (std::nothrow) ProcessRing();
  if (own == nullptr) {
    set_last_error("bpf monitor: out of memory");
    return MRC_ERR_NO_MEMORY;
  }
  own->owner_ = getpid();
  mrc_status_t status = Programs::load(&own->programs_);
  if (status == MRC_OK) status = own->programs_->add_client(own->owner_, ring_bytes, &own->client_);
  if (status == MRC_OK) {
    const Hooks hooks = own->programs_->hooks();
    snprintf(own->hooks_[0], sizeof own->hooks_[0], "%s", hooks.unmap);
    snprintf(own->hooks_[1], sizeof own->hooks_[1], "%s", hooks.remap);
    snprintf(own->hooks_[2], sizeof own->hooks_[2], "%s", hooks.madvise);
    status = own->map_and_test(own->programs_->lost_fd());
  }
  if (status != MRC_OK) {
    own->close();
    return status;
  }
  *out = own;
  return MRC_OK;
}

void ProcessRing::release(bool end_registration) noexcept {
  ring_.unmap();
  if (lost_ != nullptr) munmap(lost_, lost_bytes_);
  if (programs_ != nullptr) {
    // A forked child's copy of the programs shares their maps with the parent: only the
    // parent may take its registration out of them. Closing the copy's descriptors detaches
    // nothing while the parent holds its own.
    if (end_registration && client_.ring_fd >= 0) programs_->remove_client(client_, owner_);
    programs_->close();
  }
  if (client_.ring_fd >= 0) ::close(client_.ring_fd);
  if (lost_fd_ >= 0) ::close(lost_fd_);
  if (socket_ >= 0) ::close(socket_);  // the daemon forgets the process once no copy is open
  delete this;
}

void ProcessRing::close() noexcept { release(/*end_registration=*/true); }

void ProcessRing::forget() noexcept { release(/*end_registration=*/false); }

}  // namespace mrc::bpf
