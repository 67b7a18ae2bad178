// SPDX-License-Identifier: BSD-3-Clause
// seg_helper: the other process of the multi-process segment tests (fork + exec'd by them).
//
//   seg_helper COMMAND key=value...
// Domain keys: prefix, base (hex), wsize (hex), mode (octal), uid, gid, timeout (ms).
// Segment keys: seg, segsize, flags. barrier=FD: wait until FD reaches end of file first.
// Replies on stdout, one line each ("ok ...", "err STATUS MESSAGE", ...); "hold" commands wait
// until stdin reaches end of file before closing.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/segment/domain.h"
#include "core/segment/heap.h"
#include "core/segment/internal/sys.h"
#include "core/segment/layout.h"
#include "mrcache/mrcache.h"

namespace {

std::map<std::string, std::string> g_args;

std::string arg(const char *key, const char *fallback = "") {
  auto it = g_args.find(key);
  return it == g_args.end() ? fallback : it->second;
}
uint64_t num(const char *key, uint64_t fallback = 0, int base = 10) {
  auto it = g_args.find(key);
  return it == g_args.end() ? fallback : std::strtoull(it->second.c_str(), nullptr, base);
}

void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::putchar('\n');
  std::fflush(stdout);
}

[[noreturn]] void die(mrc_status_t st, const char *what) {
  say("err %d %s: %s", static_cast<int>(st), what, mrc_seg_last_error());
  std::exit(1);
}

void wait_eof(int fd) {
  char buf[256];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EINTR)) return;
  }
}

mrc_seg_domain_t *open_domain() {
  mrc_seg_domain_params_t p;
  mrc_seg_domain_params_init(&p);
  const std::string prefix = arg("prefix", "mrcache");
  p.prefix = prefix.c_str();
  p.base = num("base", 0, 16);
  p.size = num("wsize", 0, 16);
  p.mode = static_cast<unsigned>(num("mode", 0, 8));
  p.uid = static_cast<int>(std::strtol(arg("uid", "-1").c_str(), nullptr, 10));
  p.gid = static_cast<int>(std::strtol(arg("gid", "-1").c_str(), nullptr, 10));
  p.join_timeout_ms = static_cast<unsigned>(num("timeout", 0));
  mrc_seg_domain_t *d = nullptr;
  const mrc_status_t st = mrc_seg_domain_open(&p, &d);
  if (st != MRC_OK) die(st, "domain open");
  return d;
}

mrc_seg_t *open_segment(mrc_seg_domain_t *d) {
  mrc_seg_t *s = nullptr;
  const std::string name = arg("seg");
  const mrc_status_t st =
      mrc_seg_open(d, name.c_str(), num("segsize", 0), static_cast<unsigned>(num("flags", 0)), &s);
  if (st != MRC_OK) die(st, "segment open");
  return s;
}

int cmd_join() {
  if (g_args.count("barrier") != 0) wait_eof(static_cast<int>(num("barrier")));
  mrc_seg_domain_t *d = open_domain();
  mrc_seg_domain_info_t di{};
  if (mrc_seg_domain_info(d, &di) != MRC_OK) die(MRC_ERR_IO, "info");
  mrc_seg_t *s = nullptr;
  mrc_seg_info_t si{};
  if (!arg("seg").empty()) {
    s = open_segment(d);
    if (mrc_seg_info(s, &si) != MRC_OK) die(MRC_ERR_IO, "seg info");
  }
  if (s != nullptr && g_args.count("write") != 0) {
    *static_cast<volatile uint64_t *>(mrc_seg_base(s)) = num("write");
  }
  say("ok %d %d %" PRIxPTR " %" PRIxPTR " %d", di.created, si.created,
      reinterpret_cast<uintptr_t>(si.base), di.base, di.slot);
  if (s != nullptr && g_args.count("verify") != 0) {
    const uint64_t v = *static_cast<volatile uint64_t *>(mrc_seg_base(s));
    say(v == num("verify") ? "verified" : "mismatch %" PRIu64, v);
  }
  if (num("hold") != 0) wait_eof(0);
  if (s != nullptr && mrc_seg_close(s) != MRC_OK) die(MRC_ERR_IO, "seg close");
  const mrc_status_t st = mrc_seg_domain_close(d);
  if (st != MRC_OK) die(st, "domain close");
  say("closed");
  return 0;
}

// Never returns: the test kills it at a random moment, often inside the domain or heap lock.
int cmd_churn() {
  mrc_seg_domain_t *d = open_domain();
  mrc_seg_t *heap = nullptr;
  mrc_status_t st = mrc_seg_open(d, "heap", 0, MRC_SEG_HEAP | MRC_SEG_NOCREATE, &heap);
  if (st != MRC_OK) die(st, "heap open");
  std::mt19937_64 rng(static_cast<uint64_t>(getpid()));
  std::vector<std::pair<uint8_t *, size_t>> live;
  say("ready");
  const std::string me = "c" + std::to_string(getpid()) + "-";
  for (uint64_t i = 0;; ++i) {
    const std::string name = me + std::to_string(i % 3);
    mrc_seg_t *s = nullptr;
    if (mrc_seg_open(d, name.c_str(), 64 << 10, MRC_SEG_HEAP, &s) == MRC_OK) {
      void *p = mrc_seg_alloc(s, 100, 0);
      mrc_seg_free(s, p);
      (void)mrc_seg_close(s);
    }
    const size_t size = 16 + rng() % 4096;
    auto *p = static_cast<uint8_t *>(mrc_seg_alloc(heap, size, (rng() & 1) != 0 ? 64 : 0));
    if (p != nullptr) {
      std::memset(p, static_cast<int>(size & 0xff), size);
      live.emplace_back(p, size);
    }
    if (live.size() > 8 || (p == nullptr && !live.empty())) {
      auto [q, n] = live.front();
      live.erase(live.begin());
      for (size_t k = 0; k < n; ++k) {
        if (q[k] != static_cast<uint8_t>(n & 0xff)) {
          say("corrupt");
          std::abort();
        }
      }
      mrc_seg_free(heap, q);
    }
  }
}

int cmd_heapwork() {
  mrc_seg_domain_t *d = open_domain();
  mrc_seg_t *s = open_segment(d);
  std::mt19937_64 rng(static_cast<uint64_t>(getpid()));
  struct Block {
    uint8_t *p;
    size_t n;
    uint8_t fill;
  };
  std::vector<Block> live;
  const uint64_t iterations = num("iterations", 10000);
  const uint8_t tag = static_cast<uint8_t>(getpid());
  static const size_t kAligns[] = {0, 16, 64, 256, 4096};
  uint64_t fails = 0;
  auto verify_free = [&](size_t i) {
    const Block b = live[i];
    for (size_t k = 0; k < b.n; ++k) {
      if (b.p[k] != b.fill) {
        say("corrupt at %p", static_cast<void *>(b.p + k));
        std::exit(2);
      }
    }
    mrc_seg_free(s, b.p);
    live[i] = live.back();
    live.pop_back();
  };
  for (uint64_t it = 0; it < iterations; ++it) {
    if (live.size() < 64 && (rng() % 2 == 0 || live.empty())) {
      const size_t n = 1 + rng() % 2000;
      const size_t align = kAligns[rng() % 5];
      auto *p = static_cast<uint8_t *>(mrc_seg_alloc(s, n, align));
      if (p == nullptr) {
        ++fails;
        continue;
      }
      if (align != 0 && reinterpret_cast<uintptr_t>(p) % align != 0) {
        say("misaligned");
        return 2;
      }
      const auto fill = static_cast<uint8_t>(tag ^ it);
      std::memset(p, fill, n);
      live.push_back({p, n, fill});
    } else {
      verify_free(rng() % live.size());
    }
  }
  const size_t keep = num("keep", 0);
  while (live.size() < keep) {
    auto *p = static_cast<uint8_t *>(mrc_seg_alloc(s, 100, 0));
    if (p == nullptr) die(MRC_ERR_NO_MEMORY, "alloc");
    std::memset(p, tag, 100);
    live.push_back({p, 100, tag});
  }
  for (size_t i = 0; i < live.size() && i < keep; ++i) {
    say("keep %" PRIxPTR " %zu %u", reinterpret_cast<uintptr_t>(live[i].p), live[i].n,
        live[i].fill);
  }
  while (live.size() > keep) verify_free(live.size() - 1);
  say("done %" PRIu64, fails);
  wait_eof(0);
  if (mrc_seg_close(s) != MRC_OK) die(MRC_ERR_IO, "close");
  (void)mrc_seg_domain_close(d);
  return 0;
}

int cmd_memfd_recv() {
  mrc_seg_t *s = nullptr;
  const mrc_status_t st = mrc_seg_recv(3, &s);
  if (st != MRC_OK) die(st, "recv");
  say("ok %" PRIxPTR, reinterpret_cast<uintptr_t>(mrc_seg_base(s)));
  // The sender's first heap block (its payload follows the 16-byte block header).
  say("value %" PRIu64,
      *reinterpret_cast<volatile uint64_t *>(static_cast<char *>(mrc_seg_base(s)) + 16));
  void *p = mrc_seg_alloc(s, 64, 0);
  if (p == nullptr) die(MRC_ERR_NO_MEMORY, "alloc");
  *static_cast<uint64_t *>(p) = 0xfeedULL;
  say("alloc %" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  wait_eof(0);
  return mrc_seg_close(s) == MRC_OK ? 0 : 1;
}

// Takes the domain lock and leaves a change half done, as a process killed at that point would:
// state=creating (entry kEntryCreating, file created, pages marked), state=deleting, or
// state=closing (its last client bit cleared, not torn down). Waits to be killed.
int cmd_holdlock() {
  using namespace mrc::seg;
  mrc_seg_domain_t *d = open_domain();
  mrc_seg_t *closing = nullptr;
  if (arg("state") == "closing" && mrc_seg_open(d, "half", 4096, 0, &closing) != MRC_OK) {
    die(MRC_ERR_IO, "open");
  }
  if (lock_domain(d, nullptr) != MRC_OK) die(MRC_ERR_BUSY, "lock");
  if (closing != nullptr) {
    // A close that left the directory entry and died before tearing the segment down.
    SegEntry &e = d->root->segments[closing->map->entry];
    const auto slot = static_cast<unsigned>(d->slot);
    e.clients[slot / 64] &= ~(uint64_t{1} << (slot % 64));
  }
  if (arg("state") == "creating" || arg("state") == "deleting") {
    RootHeader *root = d->root;
    unsigned i = 0;
    while (root->segments[i].state != kEntryFree) ++i;
    SegEntry &e = root->segments[i];
    e.generation = root->next_generation++;
    e.va_offset = 0;
    e.va_pages = 1;
    e.map_size = 8192;
    e.data_offset = kSegHeaderSize;
    e.data_size = 4096;
    e.numa_node = -1;
    std::strcpy(e.name, "half");
    e.state = arg("state") == "creating" ? kEntryCreating : kEntryDeleting;
    root->va_bitmap[0] |= 1;
    char name[160];
    segment_shm_name(d->prefix, e.generation, e.file_tag, e.name, name);
    const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, 8192) != 0) die(MRC_ERR_IO, "half file");
    close(fd);
  }
  say("locked");
  wait_eof(0);
  unlock_domain(d);
  return 0;
}

// Takes the heap lock of segment `seg` and leaves a free() half done: the first block marked free
// (one store) but neither merged nor on the free list. Waits to be killed.
int cmd_heaplock() {
  mrc_seg_domain_t *d = open_domain();
  mrc_seg_t *s = open_segment(d);
  void *a = mrc_seg_alloc(s, 1000, 0);
  void *b = mrc_seg_alloc(s, 1000, 0);
  if (a == nullptr || b == nullptr) die(MRC_ERR_NO_MEMORY, "alloc");
  mrc::seg::SharedHeap heap(&s->map->header->heap, s->map->data, s->map->data_size);
  if (heap.lock_for_test() != MRC_OK) die(MRC_ERR_BUSY, "heap lock");
  auto *word = reinterpret_cast<uint64_t *>(static_cast<char *>(a) - 16);
  std::atomic_ref<uint64_t>(*word).store(*word & ~uint64_t{1}, std::memory_order_relaxed);
  say("locked %" PRIxPTR " %" PRIxPTR, reinterpret_cast<uintptr_t>(a),
      reinterpret_cast<uintptr_t>(b));
  wait_eof(0);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: seg_helper COMMAND key=value...\n");
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    const char *eq = std::strchr(argv[i], '=');
    if (eq == nullptr) continue;
    g_args[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = eq + 1;
  }
  const std::string cmd = argv[1];
  if (cmd == "join") return cmd_join();
  if (cmd == "churn") return cmd_churn();
  if (cmd == "heapwork") return cmd_heapwork();
  if (cmd == "memfd-recv") return cmd_memfd_recv();
  if (cmd == "holdlock") return cmd_holdlock();
  if (cmd == "heaplock") return cmd_heaplock();
  std::fprintf(stderr, "seg_helper: unknown command %s\n", cmd.c_str());
  return 2;
}
