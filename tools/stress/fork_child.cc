// SPDX-License-Identifier: BSD-3-Clause
// The fork child (fork_child.h).
#include "tools/stress/fork_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mrcache/mrcache.h"

namespace stress {
namespace {

// Exit statuses of a fork child.
constexpr int kChildStale = 10;
constexpr int kChildError = 11;
constexpr int kChildLeak = 12;
constexpr int kChildSetup = 13;
constexpr int kChildNoMemory = 14;  // set-up or a get failed for lack of memory
constexpr int kChildTimeoutSeconds = 60;

// What a forked child does: a cache of its own over mappings of its own (mutated between
// checks), plus brk: grow the program break, register it, shrink it, grow it again and check
// that the cache did not keep the old pages. brk is only safe here: the child has one thread,
// so no malloc can move the break between our sbrk calls (checked anyway).
int child_main(const Run &run) {
  auto say = [](const std::string &text) {
    dprintf(STDERR_FILENO, "mrcache-stress child %d: %s\n", getpid(), text.c_str());
  };
  Rng rng(mix64(run.seed ^ static_cast<uint64_t>(getpid()) ^ 0xc41d));
  const bool pfn = std::string(run.oracle->name()) == "pfn";
  int pagemap_fd = -1;
  if (pfn) pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  BackendSetup::Config config;
  config.backend = run.opt.backend == Backend::kVerbs ? Backend::kIouring : run.opt.backend;
  config.seed = rng.next();
  config.pagemap_fd = pagemap_fd;
  config.iouring_slots = 64;
  std::string error;
  std::unique_ptr<BackendSetup> backend = BackendSetup::create(config, &error);
  if (backend == nullptr) {
    say("backend set-up failed: " + error);
    return says_no_memory(error) ? kChildNoMemory : kChildSetup;
  }
  std::unique_ptr<Oracle> oracle;
  if (backend->iouring() != nullptr) {
    oracle = make_iouring_oracle(backend->iouring(), &backend->instrumented(), 4);
  } else if (pfn) {
    oracle = make_pfn_oracle(&backend->instrumented(), pagemap_fd, 4);
  } else {
    oracle = make_no_oracle();
  }
  std::unique_ptr<OracleThread> check = oracle->thread(0, &error);
  if (check == nullptr) {
    say("oracle set-up failed: " + error);
    return says_no_memory(error) ? kChildNoMemory : kChildSetup;
  }
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.name = "mrcache-stress-child";
  params.flags = (params.flags & ~static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS)) |
                 (run.fast ? static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS) : 0U);
  params.backend = backend->backend();
  params.backend_ctx = backend->backend_ctx();
  mrc_cache_t *cache = nullptr;
  mrc_status_t status = mrc_cache_create(&params, &cache);
  if (status != MRC_OK) {
    say(std::string("mrc_cache_create: ") + mrc_status_string(status));
    return status == MRC_ERR_NO_MEMORY ? kChildNoMemory : kChildSetup;
  }

  int verdict = 0;
  // One get + check + put; false when the child must stop.
  auto use = [&](uintptr_t start, size_t len, const char *what) {
    mrc_region_t *region = nullptr;
    status = mrc_get(cache, reinterpret_cast<void *>(start), len, MRC_PROT_READ | MRC_PROT_WRITE,
                     &region);
    if (status != MRC_OK) {
      say(std::string(what) + ": mrc_get " + range_text(start, len) + " = " +
          mrc_status_string(status) + " (" + mrc_backend_last_error() + ")");
      verdict = status == MRC_ERR_NO_MEMORY ? kChildNoMemory : kChildError;
      return false;
    }
    const CheckResult result = check->check(region, start, len, rng);
    mrc_put(cache, region);
    if (result.kind == CheckResult::kStale) {
      say(std::string("STALE REGISTRATION in the fork child (") + what + ") at " +
          range_text(start, len) + ": " + result.detail + " (seed " + std::to_string(run.seed) +
          ")");
      verdict = kChildStale;
      return false;
    }
    if (result.kind == CheckResult::kError) {
      say(std::string(what) + ": oracle: " + result.detail);
      verdict = kChildError;
      return false;
    }
    return true;
  };

  {
    PoolConfig pool_config;
    pool_config.slots = 4;
    pool_config.min_size = page_size();
    pool_config.max_size = 1u << 20;
    pool_config.shared_fraction = run.opt.shared_fraction;
    pool_config.stable_frames = pfn;
    Pool pool(pool_config, rng.next(), now_ns());
    static constexpr MutationKind kKinds[] = {MutationKind::kRemap,    MutationKind::kMove,
                                              MutationKind::kShrink,   MutationKind::kGrow,
                                              MutationKind::kDontneed, MutationKind::kFree,
                                              MutationKind::kFixed,    MutationKind::kUnmapTail};
    for (int i = 0; i < 64 && verdict == 0; ++i) {
      Slot &slot = pool.slot(rng.below(pool.size()));
      if (i % 3 == 2) {
        (void)pool.mutate(slot, kKinds[rng.below(std::size(kKinds))], rng);
        continue;
      }
      if (slot.start == 0) continue;
      const size_t len = page_up(rng.log_uniform(page_size(), slot.len));
      const uintptr_t offset = page_down(rng.below(slot.len - std::min(len, slot.len) + 1));
      use(slot.start + offset, std::min(len, slot.len - offset), "pool");
    }

    // brk: the break is process-wide; only this single-threaded child may move it.
    const size_t len = 16 * page_size();
    void *const old_break = sbrk(0);
    const uintptr_t base = page_up(reinterpret_cast<uintptr_t>(old_break));
    if (verdict == 0 && brk(reinterpret_cast<void *>(base + len)) == 0) {
      bool ok = use(base, len, "brk grown");
      if (ok && sbrk(0) == reinterpret_cast<void *>(base + len)) {
        // Shrinking unmaps the top half (an UNMAP event); growing again maps fresh zero pages
        // at the same addresses: the cache must not hand out the old registration.
        if (brk(reinterpret_cast<void *>(base + len / 2)) == 0 &&
            brk(reinterpret_cast<void *>(base + len)) == 0) {
          ok = use(base, len, "brk shrunk and grown again");
        }
      }
      if (sbrk(0) == reinterpret_cast<void *>(base + len)) (void)brk(old_break);
    }
  }

  mrc_cache_destroy(cache);
  check.reset();
  oracle.reset();
  const std::vector<std::string> leaks = backend->leaks();
  for (const std::string &leak : leaks) say("leak: " + leak);
  if (verdict == 0 && !leaks.empty()) verdict = kChildLeak;
  backend.reset();
  if (pagemap_fd >= 0) close(pagemap_fd);
  return verdict;
}

}  // namespace

void do_fork(Run &run, ThreadCounters &c) {
  const auto kind = static_cast<size_t>(MutationKind::kFork);
  const pid_t pid = fork();
  if (pid == 0) _exit(child_main(run));
  if (pid < 0) {
    c.refused[kind].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  c.mutations[kind].fetch_add(1, std::memory_order_relaxed);
  run.forks.fetch_add(1, std::memory_order_relaxed);
  int wstatus = 0;
  const uint64_t deadline = now_ns() + kChildTimeoutSeconds * 1000000000ULL;
  pid_t done = 0;
  while ((done = waitpid(pid, &wstatus, WNOHANG)) == 0 && now_ns() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &wstatus, 0);
    c.fork_failures.fetch_add(1, std::memory_order_relaxed);
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "fork child " + std::to_string(pid) + " hung for " +
                       std::to_string(kChildTimeoutSeconds) + " s (killed)");
    return;
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return;
  if (WIFSIGNALED(wstatus) && g_interrupted.load(std::memory_order_relaxed)) {
    return;  // Ctrl-C reached the child too: not a failure of the child
  }
  c.fork_failures.fetch_add(1, std::memory_order_relaxed);
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == kChildStale) {
    c.stale.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(run.report_mutex);
    if (run.stale_reports.size() < kMaxReports) {
      run.stale_reports.push_back("stale registration in fork child " + std::to_string(pid) +
                                  " (its report is on stderr), seed " + std::to_string(run.seed));
    }
    if (!run.opt.keep_going) run.stop.store(true, std::memory_order_relaxed);
    return;
  }
  c.errors.fetch_add(1, std::memory_order_relaxed);
  std::string why;
  if (WIFSIGNALED(wstatus)) {
    why = std::string("killed by signal ") + strsignal(WTERMSIG(wstatus));
  } else {
    const int code = WEXITSTATUS(wstatus);
    why = code == kChildLeak       ? "leaked registrations"
          : code == kChildSetup    ? "could not set up its cache"
          : code == kChildNoMemory ? std::string("ran out of memory: ") + strerrordesc_np(ENOMEM)
          : code == kChildError    ? "hit an error"
                                   : "exited with status " + std::to_string(code);
  }
  add_error(run, "fork child " + std::to_string(pid) + " " + why + " (its messages are on stderr)");
}

}  // namespace stress
