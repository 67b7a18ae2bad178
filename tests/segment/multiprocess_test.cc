// SPDX-License-Identifier: BSD-3-Clause
// Shared segments across real processes (fork + exec of seg_helper): create/join at one address,
// 64 racing creators, kill -9 inside the domain and heap locks, pid reuse, a heap used by
// several processes, last-out teardown, refusals seen from a joiner, memfd over SCM_RIGHTS.
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/segment/domain.h"
#include "core/segment/layout.h"
#include "mrcache/mrcache.h"
#include "seg_test_util.h"

namespace {

using segtest::Child;
using segtest::hex;
using segtest::shm_files;
using segtest::words;

class MultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = segtest::unique_prefix("m");
    children_.reserve(128);  // references handed out by spawn() stay valid
  }
  void TearDown() override {
    children_.clear();  // kills what is left
    segtest::remove_shm(prefix_);
  }
  std::vector<std::string> args(const std::string &cmd, std::vector<std::string> extra = {}) {
    std::vector<std::string> a{cmd, "prefix=" + prefix_, "timeout=10000"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  Child &spawn(const std::string &cmd, std::vector<std::string> extra = {}, int keep_fd = -1,
               int barrier = -1, int as_uid = -1, int as_gid = -1,
               const std::string &helper = MRC_SEG_HELPER) {
    children_.push_back(
        Child::spawn(args(cmd, std::move(extra)), keep_fd, barrier, as_uid, as_gid, helper));
    return children_.back();
  }
  mrc_seg_domain_params_t params() const {
    mrc_seg_domain_params_t p;
    mrc_seg_domain_params_init(&p);
    p.prefix = prefix_.c_str();
    p.join_timeout_ms = 10000;
    return p;
  }
  mrc_seg_domain_t *open() {
    const mrc_seg_domain_params_t p = params();
    mrc_seg_domain_t *d = nullptr;
    EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK) << mrc_seg_last_error();
    return d;
  }
  std::string prefix_;
  std::vector<Child> children_;
};

TEST_F(MultiProcess, CreateAndJoinFromSeparateProcessesAtOneAddress) {
  Child &a = spawn("join", {"seg=shared", "segsize=1048576", "write=12345", "hold=1"});
  auto wa = words(a.expect("ok"));
  EXPECT_EQ(wa[1], "1");  // created the domain
  EXPECT_EQ(wa[2], "1");  // created the segment
  Child &b = spawn("join", {"seg=shared", "verify=12345", "hold=1"});
  auto wb = words(b.expect("ok"));
  EXPECT_EQ(wb[1], "0");
  EXPECT_EQ(wb[2], "0");
  EXPECT_EQ(wb[3], wa[3]);  // the segment at the same address
  EXPECT_EQ(wb[4], wa[4]);  // the window too
  EXPECT_EQ(b.expect("verified"), "verified");
  // And in this process.
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "shared", 0, 0, &s), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mrc_seg_base(s)), hex(wa[3]));
  EXPECT_EQ(*static_cast<uint64_t *>(mrc_seg_base(s)), 12345u);
  mrc_seg_info_t si;
  mrc_seg_info(s, &si);
  EXPECT_EQ(si.clients, 3u);
  a.finish_input();
  EXPECT_EQ(a.expect("closed"), "closed");
  EXPECT_EQ(a.wait(), 0);
  b.finish_input();
  EXPECT_EQ(b.wait(), 0);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty()) << segtest::join(shm_files(prefix_));
}

TEST_F(MultiProcess, SixtyFourRacingCreatorsMakeOneDomainAndOneSegment) {
  int barrier[2];
  ASSERT_EQ(pipe2(barrier, O_CLOEXEC), 0);
  constexpr int kProcs = 64;
  for (int i = 0; i < kProcs; ++i) {
    spawn("join", {"seg=raced", "segsize=65536", "flags=1", "hold=1"}, -1, barrier[0]);
  }
  close(barrier[0]);
  close(barrier[1]);  // go
  int domain_creators = 0, segment_creators = 0;
  std::set<std::string> seg_addrs, windows, slots;
  for (Child &c : children_) {
    auto w = words(c.expect("ok", 60000));
    ASSERT_EQ(w.size(), 6u);
    domain_creators += w[1] == "1";
    segment_creators += w[2] == "1";
    seg_addrs.insert(w[3]);
    windows.insert(w[4]);
    slots.insert(w[5]);
  }
  EXPECT_EQ(domain_creators, 1);
  EXPECT_EQ(segment_creators, 1);
  EXPECT_EQ(seg_addrs.size(), 1u);
  EXPECT_EQ(windows.size(), 1u);
  EXPECT_EQ(slots.size(), static_cast<size_t>(kProcs));  // every client its own slot
  for (Child &c : children_) c.finish_input();
  for (Child &c : children_) EXPECT_EQ(c.wait(), 0);
  EXPECT_TRUE(shm_files(prefix_).empty()) << segtest::join(shm_files(prefix_));
}

// A process killed in the middle of creating, deleting or closing a segment, holding the lock.
TEST_F(MultiProcess, KilledInsideTheDomainLockHalfwayIsRepaired) {
  for (const char *state : {"creating", "deleting", "closing"}) {
    SCOPED_TRACE(state);
    mrc_seg_domain_t *d = open();
    Child &c = spawn("holdlock", {std::string("state=") + state});
    c.expect("locked");
    EXPECT_EQ(shm_files(prefix_).size(), 2u);  // root + the half-made segment file
    c.kill9();
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(mrc_seg_domain_scan(d), MRC_OK) << mrc_seg_last_error();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    mrc_seg_domain_info_t di;
    ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
    EXPECT_EQ(di.repairs, 1u);
    EXPECT_EQ(di.segments, 0u);
    EXPECT_EQ(di.pages_used, 0u);
    EXPECT_EQ(di.clients, 1u);
    EXPECT_EQ(di.clients_reaped, 1u);
    EXPECT_EQ(shm_files(prefix_).size(), 1u);
    EXPECT_EQ(mrc_seg_domain_check(d), MRC_OK) << mrc_seg_last_error();
    // Usable afterwards.
    mrc_seg_t *s = nullptr;
    ASSERT_EQ(mrc_seg_open(d, "after", 4096, 0, &s), MRC_OK);
    EXPECT_EQ(mrc_seg_close(s), MRC_OK);
    EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
    children_.clear();
  }
}

TEST_F(MultiProcess, KilledInsideTheHeapLockHalfwayIsRepaired) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "heap", 1 << 20, MRC_SEG_HEAP, &s), MRC_OK);
  Child &c = spawn("heaplock", {"seg=heap", "flags=1"});
  auto w = words(c.expect("locked"));
  c.kill9();
  mrc_seg_heap_stats_t hs;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(mrc_seg_heap_check(s, &hs), MRC_OK) << mrc_seg_last_error();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(hs.repairs, 1u);
  EXPECT_EQ(hs.used_blocks, 1u);  // b; a was half freed, and the repair finished the free
  EXPECT_EQ(hs.free_blocks, 2u);  // a's block, and the tail after b
  void *again = mrc_seg_alloc(s, 1000, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(again), hex(w[1]));
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_scan(d), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

// A process with the pid of a dead client must not keep the client's slot alive.
TEST_F(MultiProcess, PidReuseDoesNotKeepADeadClientAlive) {
  mrc_seg_domain_t *d = open();
  Child &c = spawn("join", {"seg=theirs", "segsize=4096", "hold=1"});
  auto w = words(c.expect("ok"));
  const int slot = std::stoi(w[5]);
  const pid_t dead = c.pid();
  c.kill9();
  // Give the dead pid to a live process: exactly, with clone3(set_tid) when allowed; else
  // write a live pid (ours) into the slot, which is what reuse looks like from the slot.
  pid_t reused = -1;
  clone_args ca{};
  ca.exit_signal = SIGCHLD;
  ca.set_tid = reinterpret_cast<uint64_t>(&dead);
  ca.set_tid_size = 1;
  const long r = syscall(SYS_clone3, &ca, sizeof ca);
  if (r == 0) {
    pause();
    _exit(0);
  }
  if (r > 0) {
    reused = static_cast<pid_t>(r);
    EXPECT_EQ(reused, dead);
  } else {
    d->root->clients[slot].pid = getpid();
  }
  const pid_t shown = d->root->clients[slot].pid;
  EXPECT_EQ(kill(shown, 0), 0);  // kill(pid, 0) would call it alive
  ASSERT_EQ(mrc_seg_domain_scan(d), MRC_OK);
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  EXPECT_EQ(di.clients, 1u);
  EXPECT_EQ(di.clients_reaped, 1u);
  EXPECT_EQ(di.segments, 0u);  // its segment went with it
  EXPECT_EQ(shm_files(prefix_).size(), 1u);
  if (reused > 0) {
    kill(reused, SIGKILL);
    waitpid(reused, nullptr, 0);
  }
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

// A live client whose pid looks dead (or belongs to another user, where kill() says EPERM) must
// not be removed.
TEST_F(MultiProcess, PidReuseDoesNotKillALiveClient) {
  mrc_seg_domain_params_t p = params();
  const bool root = geteuid() == 0;
  if (root) {  // a group-shared domain, so that the helper can run as another user
    p.mode = 0660;
    p.gid = 65534;
  }
  // nobody may not reach the build tree (a clone under /root, mode 0700): it runs a copy.
  std::optional<segtest::HelperCopy> copy;
  if (root) {
    copy.emplace(65534);
    if (!copy->ok()) GTEST_SKIP() << "cannot run the helper as nobody: " << copy->why();
  }
  mrc_seg_domain_t *d = nullptr;
  ASSERT_EQ(mrc_seg_domain_open(&p, &d), MRC_OK) << mrc_seg_last_error();
  std::vector<std::string> extra{"seg=live", "segsize=4096", "hold=1"};
  if (root) extra.insert(extra.end(), {"mode=660", "uid=0", "gid=65534"});
  Child &c = spawn("join", extra, -1, -1, root ? 65534 : -1, root ? 65534 : -1,
                   root ? copy->path() : std::string(MRC_SEG_HELPER));
  auto w = words(c.expect("ok"));
  const int slot = std::stoi(w[5]);
  // A pid that is certainly dead: a child we reaped.
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  d->root->clients[slot].pid = gone;
  ASSERT_EQ(mrc_seg_domain_scan(d), MRC_OK);
  mrc_seg_domain_info_t di;
  ASSERT_EQ(mrc_seg_domain_info(d, &di), MRC_OK);
  EXPECT_EQ(di.clients, 2u);
  EXPECT_EQ(di.clients_reaped, 0u);
  EXPECT_EQ(di.segments, 1u);
  c.finish_input();
  EXPECT_EQ(c.expect("closed"), "closed");
  EXPECT_EQ(c.wait(), 0);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

TEST_F(MultiProcess, HeapUsedBySeveralProcesses) {
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "pool", 8 << 20, MRC_SEG_HEAP, &s), MRC_OK);
  for (int i = 0; i < 4; ++i) {
    spawn("heapwork", {"seg=pool", "flags=1", "iterations=20000", "keep=5"});
  }
  struct Kept {
    uintptr_t addr;
    size_t n;
    unsigned fill;
  };
  std::vector<Kept> kept;
  for (Child &c : children_) {
    for (;;) {
      const std::string l = c.line(60000);
      ASSERT_FALSE(l.empty());
      auto w = words(l);
      if (w[0] == "done") {
        EXPECT_EQ(w[1], "0");  // no allocation failed
        break;
      }
      ASSERT_EQ(w[0], "keep") << l;
      kept.push_back({hex(w[1]), std::stoul(w[2]), static_cast<unsigned>(std::stoul(w[3]))});
    }
  }
  ASSERT_EQ(kept.size(), 20u);
  mrc_seg_heap_stats_t hs;
  ASSERT_EQ(mrc_seg_heap_check(s, &hs), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(hs.used_blocks, 20u);
  EXPECT_GE(hs.allocs, 4u * 5000);
  // Memory another process allocated: readable here, and ours to free.
  for (const Kept &k : kept) {
    const auto *p = reinterpret_cast<const uint8_t *>(k.addr);
    for (size_t i = 0; i < k.n; ++i) ASSERT_EQ(p[i], k.fill);
    mrc_seg_free(s, reinterpret_cast<void *>(k.addr));
  }
  ASSERT_EQ(mrc_seg_heap_check(s, &hs), MRC_OK);
  EXPECT_EQ(hs.used_blocks, 0u);
  EXPECT_EQ(hs.free_blocks, 1u);
  for (Child &c : children_) c.finish_input();
  for (Child &c : children_) EXPECT_EQ(c.wait(), 0);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
}

TEST_F(MultiProcess, LastClientOutLeavesNothingInDevShm) {
  Child &a = spawn("join", {"seg=one", "segsize=65536", "hold=1"});
  a.expect("ok");
  Child &b = spawn("join", {"seg=two", "segsize=65536", "flags=1", "hold=1"});
  b.expect("ok");
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_open(d, "one", 0, 0, &s), MRC_OK);
  EXPECT_EQ(shm_files(prefix_).size(), 3u);
  a.finish_input();
  EXPECT_EQ(a.wait(), 0);
  EXPECT_EQ(shm_files(prefix_).size(), 3u);  // "one" is still ours
  b.finish_input();
  EXPECT_EQ(b.wait(), 0);
  EXPECT_EQ(shm_files(prefix_).size(), 2u);  // "two" went with its last client
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty()) << segtest::join(shm_files(prefix_));
}

TEST_F(MultiProcess, DeadClientsSegmentsAreReapedByScanAndRemoveAll) {
  Child &a = spawn("join", {"seg=orphaned", "segsize=65536", "hold=1"});
  a.expect("ok");
  a.kill9();
  // Everybody is dead: the files stay until someone looks.
  EXPECT_EQ(shm_files(prefix_).size(), 2u);
  const mrc_seg_domain_params_t p = params();
  unsigned removed = 0;
  ASSERT_EQ(mrc_seg_domain_remove(&p, &removed), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(removed, 2u);
  EXPECT_TRUE(shm_files(prefix_).empty());
  // With a live client, remove --all keeps its domain and its segment.
  Child &b = spawn("join", {"seg=alive", "segsize=65536", "hold=1"});
  b.expect("ok");
  EXPECT_EQ(mrc_seg_domain_remove(&p, &removed), MRC_ERR_BUSY);
  EXPECT_EQ(removed, 0u);
  EXPECT_EQ(shm_files(prefix_).size(), 2u);
  b.finish_input();
  EXPECT_EQ(b.wait(), 0);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

TEST_F(MultiProcess, JoinerRefusesAWindowOverItsOwnMappings) {
  const uint64_t base = 0x588000000000ULL;
  Child &a = spawn("join", {"base=588000000000", "wsize=40000000", "hold=1"});
  auto w = words(a.expect("ok"));
  ASSERT_EQ(hex(w[4]), base);
  void *mine = mmap(reinterpret_cast<void *>(base + (100 << 20)), 4096, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(mine, reinterpret_cast<void *>(base + (100 << 20)));
  std::strcpy(static_cast<char *>(mine), "still here");
  mrc_seg_domain_t *d = nullptr;
  const mrc_seg_domain_params_t p = params();  // default window: accepts the helper's
  EXPECT_EQ(mrc_seg_domain_open(&p, &d), MRC_ERR_EXISTS);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("already mapped"), std::string::npos);
  EXPECT_STREQ(static_cast<char *>(mine), "still here");
  EXPECT_EQ(shm_files(prefix_).size(), 1u);  // the helper's domain is untouched
  munmap(mine, 4096);
  // A joiner configured for another window refuses the header.
  mrc_seg_domain_params_t q = params();
  q.base = 0x598000000000ULL;
  q.size = 1ULL << 30;
  EXPECT_EQ(mrc_seg_domain_open(&q, &d), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("outside the configured window"),
            std::string::npos);
  a.finish_input();
  EXPECT_EQ(a.wait(), 0);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

TEST_F(MultiProcess, SegmentFileOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user (chown)";
  Child &a = spawn("join", {"seg=victim", "segsize=65536", "hold=1"});
  a.expect("ok");
  std::string seg_file;
  for (const auto &f : shm_files(prefix_)) {
    if (f.find(":root") == std::string::npos) seg_file = f;
  }
  ASSERT_FALSE(seg_file.empty());
  ASSERT_EQ(chown(("/dev/shm/" + seg_file).c_str(), 65534, 65534), 0);
  mrc_seg_domain_t *d = open();
  mrc_seg_t *s = nullptr;
  EXPECT_EQ(mrc_seg_open(d, "victim", 0, 0, &s), MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_seg_last_error()).find("owned by uid 65534"), std::string::npos)
      << mrc_seg_last_error();
  a.finish_input();
  EXPECT_EQ(a.wait(), 0);
  // Not ours any more: the last client out leaves it alone.
  EXPECT_EQ(shm_files(prefix_).size(), 2u);
  EXPECT_EQ(mrc_seg_domain_close(d), MRC_OK);
  EXPECT_EQ(shm_files(prefix_).size(), 1u);
  EXPECT_EQ(shm_files(prefix_)[0], seg_file);
}

TEST_F(MultiProcess, MemfdSegmentPassedOverAUnixSocket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  mrc_seg_params_t sp;
  mrc_seg_params_init(&sp);
  sp.name = "passed";
  sp.size = 1 << 20;
  sp.flags = MRC_SEG_HEAP;
  mrc_seg_t *s = nullptr;
  ASSERT_EQ(mrc_seg_memfd_create(&sp, &s), MRC_OK) << mrc_seg_last_error();
  auto *first = static_cast<uint64_t *>(mrc_seg_alloc(s, 64, 0));  // the first block
  ASSERT_EQ(reinterpret_cast<char *>(first), static_cast<char *>(mrc_seg_base(s)) + 16);
  *first = 4242;
  Child &c = spawn("memfd-recv", {}, sv[1]);
  close(sv[1]);
  ASSERT_EQ(mrc_seg_send(s, sv[0]), MRC_OK);
  auto w = words(c.expect("ok"));
  EXPECT_EQ(hex(w[1]), reinterpret_cast<uintptr_t>(mrc_seg_base(s)));
  EXPECT_EQ(c.expect("value"), "value 4242");
  auto a = words(c.expect("alloc"));
  EXPECT_EQ(*reinterpret_cast<uint64_t *>(hex(a[1])), 0xfeedu);
  mrc_seg_free(s, reinterpret_cast<void *>(hex(a[1])));  // freed here, allocated there
  mrc_seg_heap_stats_t hs;
  ASSERT_EQ(mrc_seg_heap_check(s, &hs), MRC_OK) << mrc_seg_last_error();
  EXPECT_EQ(hs.used_blocks, 1u);
  EXPECT_EQ(hs.allocs, 2u);
  c.finish_input();
  EXPECT_EQ(c.wait(), 0);
  close(sv[0]);
  EXPECT_EQ(mrc_seg_close(s), MRC_OK);
  EXPECT_TRUE(shm_files(prefix_).empty());
}

}  // namespace
