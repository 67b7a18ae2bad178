// SPDX-License-Identifier: BSD-3-Clause
// Shared memory is input (docs/DESIGN.md, "Shared segments: shared memory is input"): values
// scribbled into the directory, the client table, a heap header or a memfd a peer sends are
// refused with MRC_ERR_IO (the field named in mrc_last_error()) and nothing outside the window
// or the mapping is touched. Where today's code would crash the process, the scenario runs in a
// forked child (tests/common/fork_child.h) so that a regression fails instead of killing the
// test program. Also: the pure checks of core/segment/internal/validate.h, and squatted file names.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/segment/domain.h"
#include "core/segment/heap.h"
#include "core/segment/internal/validate.h"
#include "core/segment/layout.h"
#include "mrcache/mrcache.h"
#include "seg_test_util.h"
#include "tests/common/fork_child.h"

namespace {

using segtest::Child;
using segtest::shm_files;

bool error_says(const char *word) { return std::strstr(mrc_last_error(), word) != nullptr; }

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = segtest::unique_prefix("h");
    children_.reserve(8);
  }
  void TearDown() override {
    children_.clear();
    segtest::remove_shm(prefix_);
  }
  mrc_seg_domain_params_t params() const {
    mrc_seg_domain_params_t p;
    mrc_seg_domain_params_init(&p);
    p.prefix = prefix_.c_str();
    p.join_timeout_ms = 10000;
    return p;
  }
  // A helper process that created segment `name` and holds it (so that it is not mapped here).
  void helper_holds(const std::string &name, const std::string &size, const std::string &flags) {
    children_.push_back(Child::spawn({"join", "prefix=" + prefix_, "timeout=10000", "seg=" + name,
                                      "segsize=" + size, "flags=" + flags, "hold=1"}));
    children_.back().expect("ok");
  }
  static int entry_of(mrc_seg_domain_t *d, const char *name) {
    for (unsigned i = 0; i < mrc::seg::kMaxSegments; ++i) {
      const mrc::seg::SegEntry &e = d->root->segments[i];
      if (e.state == mrc::seg::kEntryReady && std::strcmp(e.name, name) == 0) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  std::string prefix_;
  std::vector<Child> children_;
};

// A 2 MiB-aligned page of ours outside any window, holding a known value: what a bad directory
// entry would make a joiner map over (MAP_FIXED) and then turn PROT_NONE.
struct Canary {
  Canary() {
    area = static_cast<char *>(
        mmap(nullptr, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    page = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(area) + (2 << 20) - 1) &
                                    ~uintptr_t{(2 << 20) - 1});
    std::memcpy(page, "canary", 7);
  }
  ~Canary() { munmap(area, 8 << 20); }
  bool intact() const { return std::memcmp(page, "canary", 7) == 0; }
  char *area;
  char *page;
};

// Break 1: va_offset used unchecked by mrc_seg_open.
TEST_F(Hostile, EntryOffsetOutsideTheWindowIsRefused) {
  helper_holds("victim", "65536", "0");
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    const mrc_seg_domain_params_t p = params();
    mrc_seg_domain_t *d = nullptr;
    CHILD_CHECK(mrc_seg_domain_open(&p, &d) == MRC_OK);
    const int i = entry_of(d, "victim");
    CHILD_CHECK(i >= 0);
    Canary canary;
    mrc::seg::SegEntry &e = d->root->segments[i];
    const uint64_t saved = e.va_offset;
    e.va_offset = reinterpret_cast<uintptr_t>(canary.page) - reinterpret_cast<uintptr_t>(d->base);
    mrc_seg_t *s = nullptr;
    CHILD_CHECK(mrc_seg_open(d, "victim", 0, 0, &s) == MRC_ERR_IO);
    CHILD_CHECK(error_says("va_offset"));
    CHILD_CHECK(canary.intact());  // still mapped, still ours
    CHILD_CHECK(mrc_seg_domain_check(d) == MRC_ERR_IO);
    CHILD_CHECK(error_says("va_offset"));
    e.va_offset = saved;
    CHILD_CHECK(mrc_seg_open(d, "victim", 0, 0, &s) == MRC_OK);
    CHILD_CHECK(mrc_seg_close(s) == MRC_OK);
    CHILD_CHECK(mrc_seg_domain_close(d) == MRC_OK);
    _exit(0);
  }
  EXPECT_EQ(wait_child(pid), 0);
}

// Break 2: a page count far beyond the window passed the open; the close then made everything
// up to the top of user space PROT_NONE.
TEST_F(Hostile, PageCountBeyondTheWindowIsRefused) {
  helper_holds("victim", "65536", "0");
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    const mrc_seg_domain_params_t p = params();
    mrc_seg_domain_t *d = nullptr;
    CHILD_CHECK(mrc_seg_domain_open(&p, &d) == MRC_OK);
    const int i = entry_of(d, "victim");
    CHILD_CHECK(i >= 0);
    mrc::seg::SegEntry &e = d->root->segments[i];
    const uint64_t saved = e.va_pages;
    e.va_pages = (uint64_t{41} << 40) >> mrc::seg::kVaPageShift;  // 41 TiB
    mrc_seg_t *s = nullptr;
    const mrc_status_t st = mrc_seg_open(d, "victim", 0, 0, &s);
    if (st == MRC_OK) (void)mrc_seg_close(s);  // what used to take the stack with it
    CHILD_CHECK(st == MRC_ERR_IO);
    CHILD_CHECK(error_says("va_pages"));
    // Within the window but more than the data needs: refused too.
    e.va_pages = saved + 1;
    CHILD_CHECK(mrc_seg_open(d, "victim", 0, 0, &s) == MRC_ERR_IO);
    CHILD_CHECK(error_says("va_pages"));
    e.va_pages = saved;
    CHILD_CHECK(mrc_seg_open(d, "victim", 0, 0, &s) == MRC_OK);
    CHILD_CHECK(mrc_seg_close(s) == MRC_OK);
    CHILD_CHECK(mrc_seg_domain_close(d) == MRC_OK);
    _exit(0);
  }
  EXPECT_EQ(wait_child(pid), 0);
}

// The page bitmap is shared memory too: a cleared one (and a live entry wiped as well) must not
// place a new segment over one this process has mapped (core/segment/bitmap.cc, find_pages). Found
// by the segment fuzz target: the new segment's close then unmapped the old one under its user.
TEST_F(Hostile, ClearedPageBitmapDoesNotPlaceASegmentOverALiveOne) {
  for (const bool wipe_entry : {false, true}) {
    SCOPED_TRACE(wipe_entry ? "bitmap cleared, entry wiped" : "bitmap cleared");
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(60);
      const mrc_seg_domain_params_t p = params();
      mrc_seg_domain_t *d = nullptr;
      CHILD_CHECK(mrc_seg_domain_open(&p, &d) == MRC_OK);
      mrc_seg_t *live = nullptr;
      CHILD_CHECK(mrc_seg_open(d, "live", 1 << 20, 0, &live) == MRC_OK);
      auto *data = static_cast<char *>(mrc_seg_base(live));
      std::memcpy(data, "still mine", 11);
      std::memset(d->root->va_bitmap, 0, sizeof d->root->va_bitmap);
      if (wipe_entry) {
        const int i = entry_of(d, "live");
        CHILD_CHECK(i >= 0);
        std::memset(&d->root->segments[i], 0, sizeof d->root->segments[i]);
      }
      mrc_seg_t *fresh = nullptr;
      CHILD_CHECK(mrc_seg_open(d, "fresh", 1 << 20, 0, &fresh) == MRC_OK);
      const auto *fresh_base = static_cast<const char *>(mrc_seg_base(fresh));
      CHILD_CHECK(fresh_base + mrc_seg_size(fresh) <= data ||
                  data + mrc_seg_size(live) <= fresh_base);
      CHILD_CHECK(mrc_seg_close(fresh) == MRC_OK);
      CHILD_CHECK(std::memcmp(data, "still mine", 11) == 0);  // mapped, and still ours
      (void)mrc_seg_close(live);  // its entry may be gone: only the mapping matters here
      (void)mrc_seg_domain_close(d);
      _exit(0);
    }
    EXPECT_EQ(wait_child(pid), 0);
    segtest::remove_shm(prefix_);
  }
}

// Every other field of an entry: open, check and describe see the bad value, name the field,
// and touch nothing; restoring it makes the segment usable again.
TEST_F(Hostile, EveryEntryFieldIsChecked) {
  helper_holds("victim", "65536", "1");
  const mrc_seg_domain_params_t p = params();
  mrc_seg_domain_t *d = nullptr;
  ASSERT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK);
  const int i = entry_of(d, "victim");
  ASSERT_GE(i, 0);
  mrc::seg::SegEntry &e = d->root->segments[i];
  struct Case {
    const char *field;
    void (*scribble)(mrc::seg::SegEntry &);
  };
  const Case cases[] = {
      {"va_offset", [](mrc::seg::SegEntry &x) { x.va_offset += 4096; }},
      {"data_offset", [](mrc::seg::SegEntry &x) { x.data_offset = uint64_t{1} << 62; }},
      {"map_size", [](mrc::seg::SegEntry &x) { x.map_size += 4096; }},
      {"data_size", [](mrc::seg::SegEntry &x) { x.data_size += 1; }},
      {"flags", [](mrc::seg::SegEntry &x) { x.flags |= 0x100; }},
      {"generation", [](mrc::seg::SegEntry &x) { x.generation = ~uint64_t{0}; }},
      {"numa_node", [](mrc::seg::SegEntry &x) { x.numa_node = -7; }},
      {"creator_slot", [](mrc::seg::SegEntry &x) { x.creator_slot = 100000; }},
      {"backing_path", [](mrc::seg::SegEntry &x) { std::memset(x.backing_path, 'x', 8); }},
  };
  const mrc::seg::SegEntry saved = e;
  for (const Case &c : cases) {
    SCOPED_TRACE(c.field);
    c.scribble(e);
    mrc_seg_t *s = nullptr;
    EXPECT_EQ(mrc_seg_open(d, "victim", 0, MRC_SEG_HEAP, &s), MRC_ERR_IO);
    EXPECT_TRUE(error_says(c.field)) << mrc_last_error();
    EXPECT_EQ(mrc_seg_domain_check(d), MRC_ERR_IO);
    EXPECT_TRUE(error_says(c.field)) << mrc_last_error();
    char buf[8192];
    EXPECT_GT(mrc_seg_domain_describe(d, MRC_SEG_DESCRIBE_VERBOSE, buf, sizeof buf), 0);
    e = saved;
  }
  // A name without its NUL: refused, and never read past the field.
  std::memset(e.name, 'n', sizeof e.name);
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_ERR_IO);
  EXPECT_TRUE(error_says("name")) << mrc_last_error();
  char buf[8192];
  EXPECT_GT(
      mrc_seg_domain_describe(d, MRC_SEG_DESCRIBE_JSON | MRC_SEG_DESCRIBE_VERBOSE, buf, sizeof buf),
      0);
  e = saved;
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "victim", 0, MRC_SEG_HEAP, &s), MRC_OK) << mrc_last_error();
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_OK) << mrc_last_error();
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

// Break 3: the heap trusted heap_size and the free-list links in shared memory.
TEST_F(Hostile, HeapHeaderAndLinksAreChecked) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    const mrc_seg_domain_params_t p = params();
    mrc_seg_domain_t *d = nullptr;
    CHILD_CHECK(mrc_seg_domain_open(&p, &d) == MRC_OK);
    mrc_seg_t *s = nullptr;
    CHILD_CHECK(mrc_seg_open(d, "heap", 65536, MRC_SEG_HEAP, &s) == MRC_OK);
    mrc::seg::HeapHeader &h = s->map->header->heap;
    const uint64_t size = h.heap_size;
    // heap_size larger than the mapping: the walk would run off its end.
    h.heap_size = size + (1 << 20);
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_ERR_IO);
    CHILD_CHECK(error_says("heap_size"));
    CHILD_CHECK(mrc_seg_alloc(s, 64, 0) == nullptr);
    CHILD_CHECK(error_says("heap_size"));
    h.heap_size = size;
    // free_head outside the heap, misaligned, or too close to its end.
    for (uint64_t bad : {size + 4096, uint64_t{8}, size - 16}) {
      const uint64_t head = h.free_head;
      h.free_head = bad;
      CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_ERR_IO);
      CHILD_CHECK(error_says("free_head"));
      CHILD_CHECK(mrc_seg_alloc(s, 64, 0) == nullptr);
      h.free_head = head;
    }
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_OK);
    // A free block's back link pointing a terabyte away: the alloc would write there.
    auto *links = reinterpret_cast<uint64_t *>(s->map->data + h.free_head + 16);
    const uint64_t back = links[1];
    links[1] = uint64_t{1} << 40;
    CHILD_CHECK(mrc_seg_alloc(s, 64, 0) == nullptr);
    CHILD_CHECK(error_says("link"));
    links[1] = back;
    // The heap was marked corrupt (nothing changed but the mark): refused until repaired.
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_ERR_IO);
    h.state = mrc::seg::kHeapOk;
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_OK);
    // A free list that goes round in a cycle ends.
    void *a = mrc_seg_alloc(s, 64, 0);
    void *b = mrc_seg_alloc(s, 64, 0);
    void *c = mrc_seg_alloc(s, 64, 0);
    CHILD_CHECK(a != nullptr && b != nullptr && c != nullptr);
    mrc_seg_free(s, a);
    mrc_seg_free(s, c);
    const uint64_t head = h.free_head;
    auto *head_links = reinterpret_cast<uint64_t *>(s->map->data + head + 16);
    const uint64_t next = head_links[0];
    head_links[0] = head;  // next = itself
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_ERR_IO);
    CHILD_CHECK(mrc_seg_alloc(s, size - 100, 0) == nullptr);  // walks the whole list: must end
    head_links[0] = next;
    h.state = mrc::seg::kHeapOk;
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_OK);
    // A scribbled state word.
    h.state = 77;
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_ERR_IO);
    CHILD_CHECK(error_says("state"));
    h.state = mrc::seg::kHeapOk;
    mrc_seg_free(s, b);
    CHILD_CHECK(mrc_seg_heap_check(s, nullptr) == MRC_OK);
    CHILD_CHECK(mrc_seg_close(s) == MRC_OK);
    CHILD_CHECK(mrc_seg_domain_close(d) == MRC_OK);
    _exit(0);
  }
  EXPECT_EQ(wait_child(pid), 0);
}

// Break 3, from a peer: a memfd segment whose heap header lies is refused by mrc_seg_recv; one
// whose header the peer breaks afterwards fails the heap calls with MRC_ERR_IO.
TEST_F(Hostile, MemfdPeerWithABadHeapIsRefused) {
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "peer";
  sp.size = 1 << 16;
  sp.flags = MRC_SEG_HEAP;
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_memfd_create(&sp, &s), MRC_OK) << mrc_last_error();
  mrc_seg_info_t si;
  ASSERT_EQ(mrc_seg_info(s, &si), MRC_OK);
  mrc::seg::HeapHeader &h = s->map->header->heap;
  const uint64_t size = h.heap_size;
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    // The receiver is another process: free the address the sender maps it at.
    CHILD_CHECK(munmap(si.map_base, si.map_size) == 0);
    mrc_seg_t *r = nullptr;
    const mrc_status_t first = mrc_seg_recv(sv[1], &r);  // heap_size lies
    if (first == MRC_OK) (void)mrc_seg_heap_check(r, nullptr);
    CHILD_CHECK(first == MRC_ERR_INVALID);
    CHILD_CHECK(error_says("heap_size"));
    CHILD_CHECK(write(sv[1], "n", 1) == 1);          // the sender may repair its header now
    CHILD_CHECK(mrc_seg_recv(sv[1], &r) == MRC_OK);  // sane now
    CHILD_CHECK(mrc_seg_heap_check(r, nullptr) == MRC_OK);
    r->map->header->heap.heap_size = uint64_t{1} << 40;  // the peer writes again
    CHILD_CHECK(mrc_seg_heap_check(r, nullptr) == MRC_ERR_IO);
    CHILD_CHECK(mrc_seg_alloc(r, 64, 0) == nullptr);
    CHILD_CHECK(mrc_seg_close(r) == MRC_OK);
    _exit(0);
  }
  close(sv[1]);  // a child that dies ends our read below
  h.heap_size = size + (1 << 20);
  EXPECT_EQ(mrc_seg_send(s, sv[0]), MRC_OK);
  char ack = 0;
  if (read(sv[0], &ack, 1) == 1) {  // the child looked at the lying header
    h.heap_size = size;
    EXPECT_EQ(mrc_seg_send(s, sv[0]), MRC_OK);
  }
  const int child = wait_child(pid);
  EXPECT_EQ(child, 0);
  if (child == 0) {
    EXPECT_EQ(mrc_seg_heap_check(s, nullptr), MRC_ERR_IO);  // its last scribble
  }
  h.heap_size = size;
  EXPECT_EQ(mrc_seg_heap_check(s, nullptr), MRC_OK);
  close(sv[0]);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
}

// A peer's message that mrc_seg_recv refuses closes every descriptor it brought, whatever its
// shape: two descriptors in one SCM_RIGHTS record, two records (the kernel hands them over as one),
// more descriptors than the receiver's control buffer holds (MSG_CTRUNC: the kernel closes those
// that did not fit, the ones that arrived are the receiver's), a descriptor beside the receiver's
// own SO_PASSPIDFD record, and a sane segment refused because its address is taken here.
TEST_F(Hostile, RefusedMemfdMessagesCloseEveryDescriptor) {
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "fds";
  sp.size = 1 << 16;
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_memfd_create(&sp, &s), MRC_OK) << mrc_last_error();
  const int memfd = s->map->memfd;
  segtest::MemfdMessage msg;
  msg.base = reinterpret_cast<uint64_t>(s->map->start);
  msg.map_size = s->map->map_size;
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  // SCM_MAX_FD (253): more than any receiver's buffer takes.
  std::vector<int> many(253, memfd);
  const int before = segtest::open_fds();
  mrc_seg_t *r = nullptr;
  const struct {
    const char *shape;
    std::vector<std::vector<int>> records;
    int times;
  } cases[] = {
      {"two descriptors in one record", {{memfd, memfd}}, 100},
      {"two records", {{memfd}, {memfd}}, 20},
      {"three records of two", {{memfd, memfd}, {memfd, memfd}, {memfd, memfd}}, 20},
      {"253 descriptors (truncated)", {many}, 5},
  };
  for (const auto &c : cases) {
    const int start = segtest::open_fds();
    for (int i = 0; i < c.times; ++i) {
      ASSERT_EQ(segtest::send_with_fds(sv[0], &msg, sizeof msg, c.records),
                static_cast<ssize_t>(sizeof msg))
          << c.shape << ": " << std::strerror(errno);
      EXPECT_EQ(mrc_seg_recv(sv[1], &r), MRC_ERR_INVALID) << c.shape;
    }
    EXPECT_EQ(segtest::open_fds(), start) << c.shape << ": descriptors left open";
  }
  EXPECT_TRUE(error_says("descriptor")) << mrc_last_error();
  EXPECT_EQ(segtest::open_fds(), before);
  // The one good shape, refused here because the address is ours: closed too.
  ASSERT_EQ(mrc_seg_send(s, sv[0]), MRC_OK);
  EXPECT_EQ(mrc_seg_recv(sv[1], &r), MRC_ERR_EXISTS);
  EXPECT_EQ(segtest::open_fds(), before) << "a sane message refused with MRC_ERR_EXISTS";
  // The receiver asked for the sender's pidfd (SO_PASSPIDFD, Linux 6.5): a second record with a
  // descriptor, closed whatever becomes of the message.
  constexpr int kSoPassPidfd = 76;  // <asm-generic/socket.h>, newer than Debian 12's headers
  const int on = 1;
  if (setsockopt(sv[1], SOL_SOCKET, kSoPassPidfd, &on, sizeof on) == 0) {
    ASSERT_EQ(mrc_seg_send(s, sv[0]), MRC_OK);
    EXPECT_EQ(mrc_seg_recv(sv[1], &r), MRC_ERR_EXISTS) << mrc_last_error();
    ASSERT_EQ(segtest::send_with_fds(sv[0], &msg, sizeof msg, {{memfd, memfd}}),
              static_cast<ssize_t>(sizeof msg));
    EXPECT_EQ(mrc_seg_recv(sv[1], &r), MRC_ERR_INVALID);
    EXPECT_EQ(segtest::open_fds(), before) << "with SO_PASSPIDFD";
  } else {
    RecordProperty("so_passpidfd", "unsupported by this kernel");
  }
  close(sv[0]);
  close(sv[1]);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
}

// Garbage in the client table (neither free nor active) is reported by check and reaped by
// scan, instead of taking every slot for ever.
TEST_F(Hostile, GarbageClientSlotsAreReaped) {
  const mrc_seg_domain_params_t p = params();
  mrc_seg_domain_t *d = nullptr;
  ASSERT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK);
  for (unsigned s = 0; s < mrc::seg::kMaxClients; ++s) {
    if (static_cast<int>(s) != d->slot) d->root->clients[s].state = 0x5a5a5a5a;
  }
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_ERR_IO);
  EXPECT_TRUE(error_says("client slot")) << mrc_last_error();
  // A joiner finds room: the garbage has no presence lock behind it.
  children_.push_back(Child::spawn(
      {"join", "prefix=" + prefix_, "timeout=10000", "seg=j", "segsize=4096", "hold=1"}));
  children_.back().expect("ok");
  ASSERT_EQ(mrc_seg_domain_scan(d), MRC_OK);
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  EXPECT_EQ(di.clients, 2u);
  EXPECT_EQ(mrc_seg_domain_check(d), MRC_OK) << mrc_last_error();
  children_.back().finish_input();
  EXPECT_EQ(children_.back().wait(), 0);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty()) << segtest::join(shm_files(prefix_));
}

// Squatting: a file at the name a segment would have had under the old, predictable scheme
// ("<prefix>:<generation>:<name>"), and foreign files in the name space, cost nothing.
TEST_F(Hostile, SquattedNamesCostNothing) {
  const mrc_seg_domain_params_t p = params();
  mrc_seg_domain_t *d = nullptr;
  ASSERT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK);
  const bool root = geteuid() == 0;
  const std::vector<std::string> squats{"/" + prefix_ + ":1:sq", "/" + prefix_ + ":2:sq",
                                        "/" + prefix_ + ":1.0000000000000000:sq",
                                        "/" + prefix_ + ":junk"};
  for (const std::string &n : squats) {
    const int fd = shm_open(n.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
    ASSERT_GE(fd, 0) << n;
    if (root) {
      EXPECT_EQ(fchown(fd, 65534, 65534), 0);  // another user's
    }
    close(fd);
  }
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "sq", 4096, 0, &s), MRC_OK) << mrc_last_error();
  if (root) {
    EXPECT_EQ(mrc_seg_domain_check(d), MRC_OK) << mrc_last_error();
    unsigned repaired = 0;
    EXPECT_EQ(mrc_seg_domain_repair(d, &repaired), MRC_OK) << mrc_last_error();
    char buf[16384];
    ASSERT_GT(mrc_seg_domain_describe(d, 0, buf, sizeof buf), 0);
    EXPECT_NE(std::strstr(buf, "foreign files"), nullptr) << buf;
    EXPECT_NE(std::strstr(buf, (prefix_ + ":junk (uid 65534)").c_str()), nullptr) << buf;
  } else {
    // Our own stray files are orphans: reported, and removed by repair.
    EXPECT_EQ(mrc_seg_domain_check(d), MRC_ERR_IO);
    unsigned repaired = 0;
    EXPECT_EQ(mrc_seg_domain_repair(d, &repaired), MRC_OK) << mrc_last_error();
  }
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  // The foreign files are left alone (they are not the domain's to remove).
  for (const std::string &n : squats) shm_unlink(n.c_str());
}

// The pure checks, on values no domain ever holds.
TEST(Validate, PureChecksRejectEachBadField) {
  using namespace mrc::seg;
  const WindowLimits w{512, 10};
  SegEntry e{};
  e.state = kEntryReady;
  e.flags = MRC_SEG_HEAP;
  e.generation = 3;
  e.va_offset = 4 * kVaPageSize;
  e.data_offset = kSegHeaderSize;
  e.data_size = 1 << 20;
  e.map_size = kSegHeaderSize + e.data_size;
  e.va_pages = 1;
  e.numa_node = -1;
  std::strcpy(e.name, "ok");
  EXPECT_EQ(check_entry(e, 0, w), MRC_OK) << mrc_last_error();
  SegEntry bad = e;
  bad.va_offset = 512 * kVaPageSize;
  EXPECT_EQ(check_entry(bad, 0, w), MRC_ERR_IO);
  bad = e;
  bad.va_offset = ~uint64_t{0} - kVaPageSize + 1;  // wraps
  EXPECT_EQ(check_entry(bad, 0, w), MRC_ERR_IO);
  bad = e;
  bad.data_size = ~uint64_t{0} - 4095;  // the sum overflows
  EXPECT_EQ(check_entry(bad, 0, w), MRC_ERR_IO);
  bad = e;
  bad.state = 9;
  EXPECT_EQ(check_entry(bad, 0, w), MRC_ERR_IO);
  EXPECT_TRUE(error_says("state"));

  HeapHeader h{};
  h.heap_size = heap_size_for(1 << 20);
  h.free_head = 0;
  EXPECT_EQ(check_heap_header(h, 1 << 20), MRC_OK) << mrc_last_error();
  h.free_head = kHeapNil;
  EXPECT_EQ(check_heap_header(h, 1 << 20), MRC_OK);
  h.used_blocks = ~uint64_t{0};
  EXPECT_EQ(check_heap_header(h, 1 << 20), MRC_ERR_IO);
  EXPECT_TRUE(error_says("used_blocks"));
  h.used_blocks = 0;
  EXPECT_EQ(check_heap_header(h, 1 << 19), MRC_ERR_IO);  // not this mapping's heap
  EXPECT_TRUE(error_says("heap_size"));

  ClientSlot c{};
  EXPECT_EQ(check_client_slot(c, 3), MRC_OK);
  c.state = 2;
  EXPECT_EQ(check_client_slot(c, 3), MRC_ERR_IO);
}

}  // namespace
