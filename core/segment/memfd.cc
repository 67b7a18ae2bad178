// SPDX-License-Identifier: BSD-3-Clause
// memfd segments: no name in /dev/shm. The creator makes a sealed memfd (its size can never
// change, so no receiver can be hit by SIGBUS), maps it at a 2 MiB-aligned address, and passes
// the descriptor over an AF_UNIX socket (SCM_RIGHTS); the receiver verifies the seals and the
// header and maps it at the same address with MAP_FIXED_NOREPLACE.
//
// SYNCHRONIZATION: the header is written by the creator before the descriptor is sent; the
// sendmsg/recvmsg pair orders those writes before the receiver's reads. After that the header
// is immutable, except the heap (HeapHeader::lock, heap.h). The kernel reference-counts the
// memfd: no client tracking, no unlink.
#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/segment/domain.h"
#include "core/segment/heap.h"
#include "core/segment/internal/seg_params.h"
#include "core/segment/internal/sys.h"
#include "core/segment/internal/validate.h"

namespace mrc::seg {

namespace {

constexpr uint64_t kMsgMagic = 0x3144464d43524dULL;  // "MRCMFD1"
constexpr uint64_t kAlign = uint64_t{1} << 21;
constexpr unsigned kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

struct Message {
  uint64_t magic;
  uint64_t base;
  uint64_t map_size;
};

// SCM_PIDFD (Linux 6.5, <asm-generic/socket.h>; newer than Debian 12's headers): the sender's
// pidfd, which the kernel adds to every message when the receiving socket has SO_PASSPIDFD set.
constexpr int kScmPidfd = 0x04;

// Room for what a sane peer sends (one descriptor) beside what the receiver's own socket options
// add (SO_PASSCRED's credentials, SO_PASSPIDFD's pidfd, SO_PASSSEC's label), and for descriptors
// beyond the one, so that a message with too many is seen, refused and cleaned up. What does not
// fit is cut off by the kernel (MSG_CTRUNC), which closes the descriptors it did not pass on.
constexpr size_t kControlSize = 512;

// The descriptors one message brought: those of every SCM_RIGHTS and SCM_PIDFD record. The peer
// is input (docs/DESIGN.md, "Shared segments: shared memory is input"), and what it sends is the
// receiver's from the moment recvmsg returns: each descriptor that does not become the segment's
// is closed here, whether the message is refused or not. Nobody else knows their numbers, and a
// peer could otherwise leak descriptors into the receiver with every message.
class ReceivedFds {
 public:
  explicit ReceivedFds(msghdr *mh) noexcept {
    for (cmsghdr *c = CMSG_FIRSTHDR(mh); c != nullptr; c = CMSG_NXTHDR(mh, c)) {
      if (c->cmsg_level != SOL_SOCKET ||
          (c->cmsg_type != SCM_RIGHTS && c->cmsg_type != kScmPidfd) || c->cmsg_len < CMSG_LEN(0)) {
        continue;
      }
      const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n && count_ < kMax; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds_[count_++] = fd;
        if (c->cmsg_type == SCM_RIGHTS) {
          ++rights_;
          rights_fd_ = fd;
        }
      }
    }
  }
  ReceivedFds(const ReceivedFds &) = delete;
  ReceivedFds &operator=(const ReceivedFds &) = delete;
  ~ReceivedFds() {
    for (size_t i = 0; i < count_; ++i) {
      if (fds_[i] != kept_) close(fds_[i]);
    }
  }
  // Descriptors passed with SCM_RIGHTS (a memfd segment's message carries exactly one).
  size_t rights() const noexcept { return rights_; }
  // Hands the SCM_RIGHTS descriptor over to the caller (when rights() is 1): it is not closed.
  int take_memfd() noexcept {
    kept_ = rights_fd_;
    return kept_;
  }

 private:
  static constexpr size_t kMax = kControlSize / sizeof(int);
  int fds_[kMax] = {};
  size_t count_ = 0;
  size_t rights_ = 0;
  int rights_fd_ = -1;
  int kept_ = -1;
};

inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Maps `len` bytes of fd at a kAlign-aligned address the kernel chose.
char *map_aligned(int fd, uint64_t len) {
  void *area =
      mmap(nullptr, len + kAlign, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) return nullptr;
  const auto raw = reinterpret_cast<uint64_t>(area);
  const uint64_t start = round_up(raw, kAlign);
  if (start > raw) munmap(area, start - raw);
  const uint64_t tail = raw + len + kAlign - (start + len);
  if (tail != 0) munmap(reinterpret_cast<void *>(start + len), tail);
  void *want = reinterpret_cast<void *>(start);
  // Over our own reservation: nothing else can be there.
  if (mmap(want, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != want) {
    munmap(want, len);
    return nullptr;
  }
  return static_cast<char *>(want);
}

mrc_seg *wrap(MappedSegment *m, bool created) {
  auto *seg = new (std::nothrow) mrc_seg;
  if (seg == nullptr) return nullptr;
  m->refs = 1;
  seg->map = m;
  seg->created = created;
  return seg;
}

}  // namespace

void memfd_close(MappedSegment *m) noexcept {
  if (m == nullptr) return;
  munmap(m->start, m->map_size);
  if (m->memfd >= 0) close(m->memfd);
  delete m;
}

}  // namespace mrc::seg

using mrc::seg::fail;

extern "C" {

// mrc_seg_params_t gained struct_size in 0.2 (internal/seg_params.h): mrc_seg_memfd_create exists
// as
// *_v2 (name@@MRCACHE_0.2) and as *_v0 (name@MRCACHE_0, the 0.1 layout), as in segment.cc.
MRC_API mrc_status_t mrc_seg_memfd_create_v2(const mrc_seg_params_t *params, mrc_seg_t **out);
MRC_API mrc_status_t mrc_seg_memfd_create_v0(const mrc::seg::SegParamsV0 *params, mrc_seg_t **out);
__asm__(".symver mrc_seg_memfd_create_v2, mrc_seg_memfd_create@@MRCACHE_0.2");
__asm__(".symver mrc_seg_memfd_create_v0, mrc_seg_memfd_create@MRCACHE_0");

mrc_status_t mrc_seg_memfd_create_v2(const mrc_seg_params_t *params, mrc_seg_t **out) {
  using namespace mrc::seg;
  clear_error();
  if (params == nullptr || out == nullptr) return fail(MRC_ERR_INVALID, "params or out is NULL");
  mrc_seg_params_t known;
  if (seg_params_read(params, &known) != MRC_OK) return MRC_ERR_INVALID;
  const mrc_seg_params_t *p = &known;
  if (!valid_name(p->name)) {
    return fail(MRC_ERR_INVALID, "segment name must be 1..{} characters of [A-Za-z0-9._-]",
                kNameMax);
  }
  if ((p->flags & ~static_cast<unsigned>(MRC_SEG_HEAP | MRC_SEG_HUGETLB)) != 0) {
    return fail(MRC_ERR_INVALID, "memfd segments take MRC_SEG_HEAP and MRC_SEG_HUGETLB only");
  }
  if (p->size == 0 || p->size > (uint64_t{1} << 46)) {
    return fail(MRC_ERR_INVALID, "size {}: 1 byte to 64 TiB", p->size);
  }
  if (p->numa_node < -1) return fail(MRC_ERR_INVALID, "numa_node: -1 or a node");
  if (p->numa_node >= 0) {
    const mrc_status_t st = numa_check_node(p->numa_node);
    if (st != MRC_OK) return st;
  }
  const bool huge = (p->flags & MRC_SEG_HUGETLB) != 0;
  const int fd = memfd_create(p->name, MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0U));
  if (fd < 0) {
    return fail(huge ? MRC_ERR_UNSUPPORTED : MRC_ERR_IO, "memfd_create{}: {}",
                huge ? " with MFD_HUGETLB" : "", errno_text(errno));
  }
  uint64_t page = 4096;
  if (huge) {
    struct statfs fs {};
    if (fstatfs(fd, &fs) == 0 && fs.f_bsize > 0) page = static_cast<uint64_t>(fs.f_bsize);
  }
  const uint64_t header = page > kSegHeaderSize ? page : kSegHeaderSize;
  const uint64_t data_size = round_up(p->size, page);
  const uint64_t map_size = header + data_size;
  if ((p->flags & MRC_SEG_HEAP) != 0 && data_size > SharedHeap::kMaxHeapSize) {
    close(fd);
    return fail(MRC_ERR_INVALID, "a heap segment holds at most {} bytes", SharedHeap::kMaxHeapSize);
  }
  if (ftruncate(fd, static_cast<off_t>(map_size)) != 0 ||
      fcntl(fd, F_ADD_SEALS, kRequiredSeals) != 0) {
    const int err = errno;
    close(fd);
    return fail(MRC_ERR_IO, "sizing and sealing the memfd: {}", errno_text(err));
  }
  char *start = map_aligned(fd, map_size);
  if (start == nullptr) {
    const int err = errno;
    close(fd);
    return fail(MRC_ERR_NO_MEMORY, "mapping {} bytes{}: {}", map_size,
                huge ? " of huge pages (are enough reserved? see HugePages_Free)" : "",
                errno_text(err));
  }
  auto *m = new (std::nothrow) MappedSegment;
  if (m == nullptr) {
    munmap(start, map_size);
    close(fd);
    return fail(MRC_ERR_NO_MEMORY, "out of memory");
  }
  m->start = start;
  m->va_len = map_size;
  m->map_size = map_size;
  m->data = start + header;
  m->data_size = data_size;
  m->flags = p->flags & (MRC_SEG_HEAP | MRC_SEG_HUGETLB);
  m->numa_node = p->numa_node;
  m->memfd = fd;
  m->generation = random_u64();
  std::strcpy(m->name, p->name);  // NOLINT: bounded by valid_name
  mrc_status_t st = MRC_OK;
  if (p->numa_node >= 0) st = numa_bind(start, map_size, p->numa_node);
  if (st == MRC_OK) {
    auto *h = reinterpret_cast<SegHeader *>(start);
    h->magic = kSegMagic;
    h->layout_version = kLayoutVersion;
    h->flags = m->flags;
    h->domain_id = 0;
    h->generation = m->generation;
    h->base = reinterpret_cast<uint64_t>(start);
    h->map_size = map_size;
    h->data_offset = header;
    h->data_size = data_size;
    h->numa_node = p->numa_node;
    std::strcpy(h->name, p->name);  // NOLINT: bounded
    m->header = h;
    if ((p->flags & MRC_SEG_HEAP) != 0) st = SharedHeap::init(&h->heap, m->data, data_size);
  }
  mrc_seg *seg = st == MRC_OK ? wrap(m, true) : nullptr;
  if (seg == nullptr) {
    memfd_close(m);
    return st != MRC_OK ? st : fail(MRC_ERR_NO_MEMORY, "out of memory");
  }
  *out = seg;
  return MRC_OK;
}

mrc_status_t mrc_seg_memfd_create_v0(const mrc::seg::SegParamsV0 *params, mrc_seg_t **out) {
  if (params == nullptr) return mrc_seg_memfd_create_v2(nullptr, out);
  const mrc_seg_params_t current = mrc::seg::seg_params_from_v0(*params);
  return mrc_seg_memfd_create_v2(&current, out);
}

mrc_status_t mrc_seg_send(const mrc_seg_t *seg, int sock) {
  using namespace mrc::seg;
  clear_error();
  if (seg == nullptr || seg->map == nullptr || seg->map->memfd < 0) {
    return fail(MRC_ERR_INVALID, "only memfd segments are sent");
  }
  Message msg{kMsgMagic, reinterpret_cast<uint64_t>(seg->map->start), seg->map->map_size};
  iovec iov{&msg, sizeof msg};
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
  std::memcpy(CMSG_DATA(c), &seg->map->memfd, sizeof(int));
  ssize_t n;
  do {
    n = sendmsg(sock, &mh, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof msg)) {
    return fail(MRC_ERR_IO, "sendmsg: {}", n < 0 ? errno_text(errno) : "short write");
  }
  return MRC_OK;
}

mrc_status_t mrc_seg_recv(int sock, mrc_seg_t **out) {
  using namespace mrc::seg;
  clear_error();
  if (out == nullptr) return fail(MRC_ERR_INVALID, "out is NULL");
  Message msg{};
  iovec iov{&msg, sizeof msg};
  alignas(cmsghdr) char control[kControlSize] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail(MRC_ERR_IO, "recvmsg: {}", errno_text(errno));
  ReceivedFds received(&mh);  // closes every descriptor of the message but the one taken
  if (n != static_cast<ssize_t>(sizeof msg) || msg.magic != kMsgMagic) {
    return fail(MRC_ERR_INVALID, "not a memfd segment message");
  }
  if ((mh.msg_flags & MSG_CTRUNC) != 0) {
    return fail(MRC_ERR_INVALID,
                "memfd segment message refused: its control data was cut off (MSG_CTRUNC), so "
                "it carried more than the one descriptor of a memfd segment message");
  }
  if (received.rights() != 1) {
    return fail(MRC_ERR_INVALID,
                "memfd segment message refused: it carried {} descriptors instead of one",
                received.rights());
  }
  const int fd = received.take_memfd();
  auto reject = [&](mrc_status_t st) {
    close(fd);
    return st;
  };
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (static_cast<unsigned>(seals) & kRequiredSeals) != kRequiredSeals) {
    return reject(fail(MRC_ERR_INVALID, "received descriptor is not a sealed memfd: refused"));
  }
  // The segment is mapped writable, its heap's lock included: a memfd sealed against writing, or
  // a descriptor opened for reading only, can never be. The peer's error, not a lack of memory.
  if ((static_cast<unsigned>(seals) & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return reject(fail(MRC_ERR_INVALID,
                       "received memfd is sealed against writing (F_SEAL_WRITE or "
                       "F_SEAL_FUTURE_WRITE) and cannot be mapped writable: refused"));
  }
  const int access = fcntl(fd, F_GETFL);
  if (access < 0 || (access & O_ACCMODE) != O_RDWR) {
    return reject(fail(MRC_ERR_INVALID,
                       "received memfd is not open for reading and writing (opened {}): refused",
                       access < 0                         ? "unknown"
                       : (access & O_ACCMODE) == O_RDONLY ? "read-only"
                                                          : "write-only"));
  }
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) != msg.map_size ||
      msg.base % kAlign != 0 || msg.map_size == 0 || msg.base >= (uint64_t{1} << 47) ||
      msg.map_size > (uint64_t{1} << 47) - msg.base) {
    return reject(fail(MRC_ERR_INVALID, "memfd size or address does not match the message"));
  }
  // Read the header through a private view first, then map for real at the sender's address.
  struct statfs fs {};
  const uint64_t page =
      fstatfs(fd, &fs) == 0 && fs.f_bsize > 0 ? static_cast<uint64_t>(fs.f_bsize) : 4096;
  void *peek = mmap(nullptr, page, PROT_READ, MAP_SHARED, fd, 0);
  if (peek == MAP_FAILED)
    return reject(fail(MRC_ERR_IO, "mapping the header: {}", errno_text(errno)));
  SegHeader h;
  std::memcpy(&h, peek, sizeof h);
  munmap(peek, page);
  const uint64_t header = page > kSegHeaderSize ? page : kSegHeaderSize;
  // The peer is not trusted (internal/validate.h): every field is checked, the heap's too. The heap
  // is checked again each time its lock is taken, since the peer can still write to it.
  if (check_memfd_header(h, msg.base, msg.map_size, header) != MRC_OK ||
      ((h.flags & MRC_SEG_HEAP) != 0 && check_heap_header(h.heap, h.data_size) != MRC_OK)) {
    char why[mrc::kLastErrorSize];
    std::snprintf(why, sizeof why, "%s", mrc_seg_last_error());
    return reject(fail(MRC_ERR_INVALID, "memfd segment header is not sane ({}): refused", why));
  }
  void *want = reinterpret_cast<void *>(msg.base);
  void *got =
      mmap(want, msg.map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
  if (got == MAP_FAILED || got != want) {
    const int err = errno;
    if (got != MAP_FAILED) munmap(got, msg.map_size);
    // EACCES and EPERM: the descriptor cannot be mapped writable after all (an LSM, a seal added
    // since the checks above); what the peer sent is unusable, as above.
    const mrc_status_t st = got != MAP_FAILED || err == EEXIST ? MRC_ERR_EXISTS
                            : err == EACCES || err == EPERM    ? MRC_ERR_INVALID
                                                               : MRC_ERR_NO_MEMORY;
    return reject(fail(st, "cannot map the segment at {} here: {}", want,
                       got == MAP_FAILED ? errno_text(err) : "address taken"));
  }
  auto *m = new (std::nothrow) MappedSegment;
  if (m == nullptr) {
    munmap(want, msg.map_size);
    return reject(fail(MRC_ERR_NO_MEMORY, "out of memory"));
  }
  m->start = static_cast<char *>(want);
  m->va_len = msg.map_size;
  m->map_size = msg.map_size;
  m->data = m->start + header;
  m->data_size = h.data_size;
  m->flags = h.flags;
  m->numa_node = h.numa_node;
  m->memfd = fd;
  m->generation = h.generation;
  std::strcpy(m->name, h.name);  // NOLINT: bounded
  m->header = reinterpret_cast<SegHeader *>(m->start);
  mrc_seg *seg = wrap(m, false);
  if (seg == nullptr) {
    memfd_close(m);
    return fail(MRC_ERR_NO_MEMORY, "out of memory");
  }
  *out = seg;
  return MRC_OK;
}

}  // extern "C"
