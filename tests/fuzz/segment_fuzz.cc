// SPDX-License-Identifier: BSD-3-Clause
// Fuzz target "segment": every structure a segment domain reads from shared memory, written by a
// hostile or broken peer (docs/DESIGN.md, "Shared segments: shared memory is input").
//
// Each input, under a prefix of its own:
//   1. a forked peer creates the domain (a 64 MiB window) and a heap segment "a" with a few
//      blocks allocated, says it is ready, and waits (alive: its client slot and its bit in the
//      directory entry stay in use);
//   2. this process overwrites bytes of /dev/shm/<prefix>:root (the immutable header, the
//      counters, the client table, the directory entries, the page bitmap) and of the segment's
//      file (its header, its heap header, its first heap blocks) with bytes and with chosen
//      64-bit values from the input;
//   3. then joins as a second process would, through the public API (the steps the input's
//      first byte selects; an empty input runs them all): inspect and describe,
//      mrc_seg_domain_open, mrc_seg_open("a") (maps the segment where the directory says),
//      mrc_seg_heap_check, mrc_seg_alloc / mrc_seg_free, a new segment, mrc_seg_domain_check,
//      mrc_seg_domain_repair, mrc_seg_domain_scan, mrc_seg_close, mrc_seg_domain_close;
//   4. lets the peer go, and removes every file of the prefix.
// Every call must return a status (a bad value is MRC_ERR_IO or MRC_ERR_INVALID naming it); a
// crash, a sanitizer report or a hang is a finding. The robust mutexes themselves (RootHeader::
// lock, HeapHeader::lock) are not overwritten: a peer that scribbles over a lock can make a
// locker wait for its deadline, which is a hang by design, not a validation bug.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/segment/layout.h"
#include "mrcache/mrcache.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using mrc::seg::ClientSlot;
using mrc::seg::HeapHeader;
using mrc::seg::RootHeader;
using mrc::seg::SegEntry;
using mrc::seg::SegHeader;

constexpr size_t kWindow = size_t{64} << 20;
constexpr size_t kSegSize = size_t{256} << 10;
constexpr int kPeerSetupFailed = 3;

std::string g_prefix_base;
unsigned g_serial = 0;

// Where a record writes: byte ranges of the root file and of the segment's file.
struct Target {
  bool root;  // else the segment file
  size_t offset, length;
};

std::vector<Target> targets(size_t data_offset) {
  const size_t heap = offsetof(SegHeader, heap);
  return {
      {true, 0, offsetof(RootHeader, lock)},  // the immutable header
      {true, offsetof(RootHeader, state),
       offsetof(RootHeader, clients) - offsetof(RootHeader, state)},
      {true, offsetof(RootHeader, clients), 4 * sizeof(ClientSlot)},
      {true, offsetof(RootHeader, segments), 2 * sizeof(SegEntry)},
      {true, offsetof(RootHeader, va_bitmap), 64},
      {false, 0, heap},  // the segment header, up to its heap header
      {false, heap + offsetof(HeapHeader, heap_size),
       sizeof(HeapHeader) - offsetof(HeapHeader, heap_size)},
      {false, data_offset, 512},  // the first heap blocks
  };
}

constexpr uint64_t kValues[] = {0,
                                1,
                                2,
                                0xff,
                                0x1000,
                                mrc::seg::kVaPageSize,
                                kWindow,
                                kWindow / mrc::seg::kVaPageSize,
                                uint64_t{1} << 32,
                                uint64_t{1} << 40,
                                uint64_t{1} << 47,
                                uint64_t{1} << 63,
                                ~uint64_t{0},
                                ~uint64_t{0} - 4095,
                                0xffffffffu,
                                mrc::seg::kRootMagic};

// Values that depend on where things are in this process: a directory entry whose va_offset
// points at this process's own memory (its data, its heap) instead of the window, or whose
// page count reaches the top of user space. A peer can compute them as easily (addresses are
// shared: the window sits at the same place everywhere).
alignas(4096) char g_own_data[4096];

uint64_t dynamic_value(unsigned index, const RootHeader *root) {
  static char *const heap = new char[1 << 20];  // lives as long as the process
  const uint64_t base = root->base;
  const uint64_t page = mrc::seg::kVaPageSize;
  switch (index % 4) {
    case 0: return (reinterpret_cast<uintptr_t>(g_own_data) & ~(page - 1)) - base;
    case 1: return (reinterpret_cast<uintptr_t>(heap) & ~(page - 1)) - base;
    case 2: {  // pages from the first segment's start to just below the top of user space
      const uint64_t start = base + root->segments[0].va_offset;
      return start < (uint64_t{1} << 47) ? ((uint64_t{1} << 47) - start) / page - 1 : 0;
    }
    default: return root->size;  // the first byte past the window
  }
}

std::string file_of(const std::string &prefix, const char *suffix) {
  DIR *dir = opendir("/dev/shm");
  std::string found;
  if (dir == nullptr) return found;
  while (const dirent *e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix + ":", 0) == 0 && name.size() >= std::strlen(suffix) &&
        name.compare(name.size() - std::strlen(suffix), std::string::npos, suffix) == 0) {
      found = "/dev/shm/" + name;
    }
  }
  closedir(dir);
  return found;
}

void remove_files(const std::string &prefix) {
  mrc_seg_domain_params_t params;
  mrc_seg_domain_params_init(&params);
  params.prefix = prefix.c_str();
  (void)mrc_seg_domain_remove(&params, nullptr);
  // Whatever the library refused to remove (a corrupted root names the wrong files).
  std::vector<std::string> left;
  if (DIR *dir = opendir("/dev/shm")) {
    while (const dirent *e = readdir(dir)) {
      const std::string name = e->d_name;
      if (name.rfind(prefix + ":", 0) == 0) left.push_back("/dev/shm/" + name);
    }
    closedir(dir);
  }
  for (const std::string &path : left) unlink(path.c_str());
}

void domain_params(const std::string &prefix, mrc_seg_domain_params_t *params) {
  mrc_seg_domain_params_init(params);
  params->prefix = prefix.c_str();
  params->size = kWindow;
  // A joiner waits this long for a creator that never finishes (a corrupted `ready` word): short,
  // or such inputs dominate the run.
  params->join_timeout_ms = 20;
}

// The peer: creates the domain and the segment, allocates, reports, waits to be let go.
[[noreturn]] void peer(const std::string &prefix, int ready_fd, int release_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  mrc_seg_domain_params_t params;
  domain_params(prefix, &params);
  mrc_seg_domain_t *domain = nullptr;
  mrc_seg_t *seg = nullptr;
  char status = 0;
  if (mrc_seg_domain_open(&params, &domain) != MRC_OK ||
      mrc_seg_open(domain, "a", kSegSize, MRC_SEG_HEAP, &seg) != MRC_OK) {
    std::fprintf(stderr, "segment fuzz peer: %s\n", mrc_seg_last_error());
    status = kPeerSetupFailed;
  } else {
    // A few blocks, one of them freed: the heap has used and free blocks and a free list.
    // (Fixed sizes: every byte of the input goes to the corruption.)
    void *blocks[4];
    size_t size = 24;
    for (void *&b : blocks) b = mrc_seg_alloc(seg, size *= 3, 0);
    mrc_seg_free(seg, blocks[1]);
  }
  if (write(ready_fd, &status, 1) != 1) _exit(1);
  char byte;
  while (read(release_fd, &byte, 1) > 0) {
  }
  _exit(0);  // without closing: a peer that is still there when the joiner acts
}

void *map_file(const std::string &path, size_t *size) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    *size = static_cast<size_t>(st.st_size);
    p = mmap(nullptr, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  return p == MAP_FAILED ? nullptr : p;
}

// Applies the input's records to the two files.
void corrupt(fuzz::Input &in, char *root, size_t root_size, char *seg, size_t seg_size) {
  const size_t data_offset = reinterpret_cast<SegHeader *>(seg)->data_offset;
  const std::vector<Target> all = targets(data_offset < seg_size ? data_offset : 4096);
  while (!in.done()) {
    const Target &t = all[in.small_below(static_cast<uint8_t>(all.size()))];
    char *base = t.root ? root : seg;
    const size_t file_size = t.root ? root_size : seg_size;
    const uint8_t op = in.byte();
    const size_t offset = t.offset + in.u16() % t.length;
    // Never past the target's end: the targets stop short of the mutexes.
    const size_t end = t.offset + t.length < file_size ? t.offset + t.length : file_size;
    if ((op & 0x80) != 0) {  // a chosen 64-bit value at an 8-byte aligned offset
      const size_t at = offset & ~size_t{7};
      const unsigned index = op & 31u;
      const uint64_t value =
          index < 16 ? kValues[index] : dynamic_value(index, reinterpret_cast<RootHeader *>(root));
      if (at >= t.offset && at + 8 <= end) std::memcpy(base + at, &value, 8);
    } else {  // raw bytes
      const size_t len = 1 + (op & 15);
      if (offset < end) in.bytes(base + offset, len < end - offset ? len : end - offset);
    }
  }
}

// MRC_FUZZ_VERBOSE=1: every call's status and error on stderr (what an input did).
const bool g_verbose = std::getenv("MRC_FUZZ_VERBOSE") != nullptr;

void check(int status, const char *call) {
  if (g_verbose) std::fprintf(stderr, "  %s: %d %s\n", call, status, mrc_seg_last_error());
  if (status > 0 || status < MRC_ERR_IO) fuzz::fail("%s returned %d", call, status);
}

// The steps of join_and_use an input asks for (its first byte): each crash stops the input, so
// an input that skips the steps where a known crash happens can reach the ones after them.
enum : unsigned {
  kStepInspect = 1,    // an observer: describe, check
  kStepOpen = 2,       // mrc_seg_open of the peer's segment
  kStepHeap = 4,       // its heap: check, alloc, free
  kStepCreate = 8,     // a new segment
  kStepCheck = 16,     // mrc_seg_domain_check, repair, scan
  kStepDescribe = 32,  // describe and info of the joined domain
};

// What a second process does with the domain.
void join_and_use(const std::string &prefix, unsigned steps) {
  mrc_seg_domain_params_t params;
  domain_params(prefix, &params);
  char text[4096];

  mrc_seg_domain_t *observer = nullptr;
  if ((steps & kStepInspect) != 0 && mrc_seg_domain_inspect(&params, &observer) == MRC_OK) {
    (void)mrc_seg_domain_describe(observer, MRC_SEG_DESCRIBE_JSON | MRC_SEG_DESCRIBE_VERBOSE, text,
                                  sizeof text);
    check(mrc_seg_domain_check(observer), "mrc_seg_domain_check (observer)");
    check(mrc_seg_domain_close(observer), "mrc_seg_domain_close (observer)");
  }

  mrc_seg_domain_t *domain = nullptr;
  const mrc_status_t opened = mrc_seg_domain_open(&params, &domain);
  check(opened, "mrc_seg_domain_open");
  if (opened != MRC_OK) return;
  mrc_seg_t *seg = nullptr;
  const mrc_status_t seg_opened =
      (steps & kStepOpen) != 0 ? mrc_seg_open(domain, "a", 0, MRC_SEG_HEAP, &seg) : MRC_ERR_INVALID;
  check(seg_opened, "mrc_seg_open");
  if (seg_opened == MRC_OK && (steps & kStepHeap) != 0) {
    mrc_seg_heap_stats_t stats{};
    check(mrc_seg_heap_check(seg, &stats), "mrc_seg_heap_check");
    void *p = mrc_seg_alloc(seg, 64, 0);
    void *q = mrc_seg_alloc(seg, 1000, 256);
    if (p != nullptr) std::memset(p, 0xab, 64);
    if (q != nullptr) std::memset(q, 0xcd, 1000);
    mrc_seg_free(seg, p);
    check(mrc_seg_heap_check(seg, &stats), "mrc_seg_heap_check");
    mrc_seg_free(seg, q);
    mrc_seg_info_t info{};
    check(mrc_seg_info(seg, &info), "mrc_seg_info");
  }
  // A new segment: a free directory entry and free pages in the bitmap.
  mrc_seg_t *fresh = nullptr;
  const mrc_status_t created = (steps & kStepCreate) != 0
                                   ? mrc_seg_open(domain, "b", 64 << 10, MRC_SEG_HEAP, &fresh)
                                   : MRC_ERR_INVALID;
  check(created, "mrc_seg_open (new)");
  if (created == MRC_OK) {
    void *p = mrc_seg_alloc(fresh, 128, 0);
    if (p != nullptr) std::memset(p, 0x11, 128);
    mrc_seg_free(fresh, p);
    check(mrc_seg_close(fresh), "mrc_seg_close (new)");
  }
  if ((steps & kStepCheck) != 0) {
    check(mrc_seg_domain_check(domain), "mrc_seg_domain_check");
    unsigned repaired = 0;
    check(mrc_seg_domain_repair(domain, &repaired), "mrc_seg_domain_repair");
    check(mrc_seg_domain_scan(domain), "mrc_seg_domain_scan");
  }
  if ((steps & kStepDescribe) != 0) {
    (void)mrc_seg_domain_describe(domain, MRC_SEG_DESCRIBE_VERBOSE, text, sizeof text);
    mrc_seg_domain_info_t info{};
    check(mrc_seg_domain_info(domain, &info), "mrc_seg_domain_info");
  }
  if (seg_opened == MRC_OK) check(mrc_seg_close(seg), "mrc_seg_close");
  check(mrc_seg_domain_close(domain), "mrc_seg_domain_close");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  g_prefix_base = "mrcfuzz-" + std::to_string(getpid()) + "-";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (g_prefix_base.empty()) g_prefix_base = "mrcfuzz-" + std::to_string(getpid()) + "-";
  const std::string prefix = g_prefix_base + std::to_string(g_serial++);
  fuzz::Input in(data, size);
  // All steps unless the input says otherwise (an empty input runs them all).
  const unsigned steps = in.done() ? ~0u : in.byte();
  int ready[2], release[2];
  if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(release, O_CLOEXEC) != 0) fuzz::fail("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) fuzz::fail("fork failed");
  if (pid == 0) {
    close(ready[0]);
    close(release[1]);
    peer(prefix, ready[1], release[0]);
  }
  close(ready[1]);
  close(release[0]);
  pollfd pfd{ready[0], POLLIN, 0};
  char status = kPeerSetupFailed;
  // libFuzzer's -timeout timer (SIGALRM) interrupts the wait: retry then.
  int polled;
  do {
    polled = poll(&pfd, 1, 10000);
  } while (polled < 0 && errno == EINTR);
  ssize_t got = -1;
  if (polled == 1) {
    do {
      got = read(ready[0], &status, 1);
    } while (got < 0 && errno == EINTR);
  }
  if (got != 1 || status != 0) {
    // Why: said by the peer (status), dead before it could say (got 0), or hung (poll timed out).
    int wstatus = 0;
    const bool ended = waitpid(pid, &wstatus, WNOHANG) == pid;
    if (!ended) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    remove_files(prefix);
    fuzz::fail("the peer could not create the domain (status %d, poll %d, read %zd, peer %s %d)",
               status, polled, got,
               !ended                 ? "hung, killed"
               : WIFSIGNALED(wstatus) ? "killed by signal"
                                      : "exited",
               !ended                 ? 0
               : WIFSIGNALED(wstatus) ? WTERMSIG(wstatus)
                                      : WEXITSTATUS(wstatus));
  }

  size_t root_size = 0, seg_size = 0;
  char *root = static_cast<char *>(map_file("/dev/shm/" + prefix + ":root", &root_size));
  char *seg = static_cast<char *>(map_file(file_of(prefix, ":a"), &seg_size));
  if (root == nullptr || seg == nullptr || root_size < sizeof(RootHeader) ||
      seg_size < sizeof(SegHeader)) {
    fuzz::fail("cannot map the domain's files");
  }
  corrupt(in, root, root_size, seg, seg_size);
  munmap(root, root_size);
  munmap(seg, seg_size);

  join_and_use(prefix, steps);

  close(release[1]);  // the peer exits
  close(ready[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  remove_files(prefix);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    fuzz::fail("the peer ended with status %#x", wstatus);
  }
  return 0;
}
