// SPDX-License-Identifier: BSD-3-Clause
// Re-entrancy (docs/DESIGN.md, "The C API contract", "User code"): a backend's reg and dereg, a
// log handler and an invalidate callback may call back into the cache, or fork; each call either
// works or returns MRC_ERR_BUSY, never deadlocks. mrc_cache_destroy refuses (MRC_ERR_BUSY) while
// a region is held or from inside one of the cache's callbacks.
//
// Every scenario that deadlocked or recursed without end before runs in a forked child under
// alarm(): a regression ends the child (SIGALRM, SIGSEGV) and fails the test instead of hanging.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

#include "../common/fork_child.h"
#include "mrcache/backends.h"
#include "mrcache/mrcache.h"
#include "mrcache/mrcache.hpp"

extern "C" void mrc_cache_destroy_v0(mrc_cache_t *cache);

#if defined(__SANITIZE_THREAD__) || defined(MRC_TSAN)
// Every scenario runs in a child forked from a process with threads (the monitor), and some fork
// again from inside user code: ThreadSanitizer tolerates that only when told so. The CI's tsan
// lane runs these tests (label concurrency): locks taken across user code are its subject.
extern "C" const char *__tsan_default_options() { return "die_after_fork=0"; }
#endif

namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr unsigned kAlarmSeconds = 20;

// Runs body in a forked child under alarm(); returns its exit status (0: every check passed).
template <class Body>
int in_child(Body body) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(kAlarmSeconds);
    _exit(body());
  }
  return wait_child(pid);
}

char *map_pages(size_t pages) {
  void *p =
      mmap(nullptr, pages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 0x5a, pages * kPage);
  return static_cast<char *>(p);
}

// A plugin whose reg and dereg run hooks (set per test: each test runs in its own child).
mrc_cache_t *g_cache = nullptr;
std::atomic<int> g_live{0};  // registrations not yet deregistered
std::atomic<int> g_regs{0};
mrc_status_t (*g_reg_hook)(void *addr, size_t len) = nullptr;  // non-OK: reg fails with it
void (*g_dereg_hook)() = nullptr;

mrc_status_t hook_reg(void * /*ctx*/, void *addr, size_t len, unsigned /*prot*/, void **handle,
                      uint64_t *key) {
  if (g_reg_hook != nullptr) {
    const mrc_status_t status = g_reg_hook(addr, len);
    if (status != MRC_OK) return status;
  }
  *handle = addr;
  *key = static_cast<uint64_t>(++g_regs);
  ++g_live;
  return MRC_OK;
}

void hook_dereg(void * /*ctx*/, void * /*handle*/) {
  --g_live;
  if (g_dereg_hook != nullptr) g_dereg_hook();
}

const mrc_backend_t kHookOps = {.struct_size = sizeof(mrc_backend_t),
                                .name = "reentry",
                                .reg = hook_reg,
                                .dereg = hook_dereg,
                                .describe = nullptr};

mrc_cache_t *create_cache(size_t max_unreleased = 0, unsigned flags = 0) {
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.name = "reentry";
  params.backend = &kHookOps;
  params.max_unreleased = max_unreleased;
  params.flags |= flags;
  mrc_cache_t *cache = nullptr;
  return mrc_cache_create(&params, &cache) == MRC_OK ? cache : nullptr;
}

bool cached_mode() {
  mrc_monitor_info_t info;
  return mrc_monitor_info(&info) == MRC_OK && info.mode != MRC_MONITOR_UNCACHED;
}

// ---- reg: re-entering the cache that called it --------------------------------------------

std::atomic<int> g_reentry_checked{0};
mrc_region_t *g_held = nullptr;  // a region the test holds, put from inside reg
char *g_cached = nullptr;        // memory whose region is cached (unused)

bool cached_mode();

mrc_status_t reg_reenters(void *addr, size_t /*len*/) {
  if (g_reentry_checked.load() != 0) return MRC_OK;
  ++g_reentry_checked;
  mrc_region_t *region = nullptr;
  mrc_stats_t stats;
  char json[64];
  // Every call that would need the mutex reg runs under is refused, not deadlocked.
  CHILD_CHECK(mrc_get(g_cache, static_cast<char *>(addr) + 1, 1, MRC_PROT_READ, &region) ==
              MRC_ERR_BUSY);
  CHILD_CHECK(std::strstr(mrc_last_error(), "from inside its own backend's reg") != nullptr);
  CHILD_CHECK(mrc_cache_stats(g_cache, &stats) == MRC_ERR_BUSY);
  CHILD_CHECK(std::strstr(mrc_last_error(), "called back from its own backend's reg") != nullptr);
  CHILD_CHECK(mrc_cache_stats_json(g_cache, json, sizeof json) == MRC_ERR_BUSY);
  CHILD_CHECK(mrc_cache_purge(g_cache) == MRC_ERR_BUSY);
  CHILD_CHECK(mrc_invalidate(g_cache, g_held, nullptr, nullptr) == MRC_ERR_BUSY);
  CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_ERR_BUSY);
  // A hit needs no lock.
  if (cached_mode()) {
    CHILD_CHECK(mrc_get(g_cache, g_cached, kPage, MRC_PROT_READ, &region) == MRC_OK);
    mrc_put(g_cache, region);
  }
  // A put is never refused: its deregistration (the last reference of an invalidated region)
  // runs after the lock.
  mrc_put(g_cache, g_held);
  g_held = nullptr;
  return MRC_OK;
}

TEST(CacheReentry, RegCallingBackIsRefusedWithBusy) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              char *a = map_pages(2);
              char *b = map_pages(2);
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &g_held) == MRC_OK);
              CHILD_CHECK(mrc_invalidate(g_cache, g_held, nullptr, nullptr) == MRC_OK);
              g_cached = map_pages(2);
              mrc_region_t *cached = nullptr;
              CHILD_CHECK(mrc_get(g_cache, g_cached, kPage, MRC_PROT_READ, &cached) == MRC_OK);
              mrc_put(g_cache, cached);
              g_dereg_hook = [] {
                mrc_stats_t stats;
                CHILD_CHECK(mrc_cache_stats(g_cache, &stats) == MRC_OK);
              };
              g_reg_hook = reg_reenters;
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, b, kPage, MRC_PROT_READ, &region) == MRC_OK);
              CHILD_CHECK(g_reentry_checked.load() == 1);
              CHILD_CHECK(g_held == nullptr);
              mrc_put(g_cache, region);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

// A reg of one cache may use another cache whose lock is free.
mrc_cache_t *g_other = nullptr;
TEST(CacheReentry, RegMayUseAnotherCache) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              g_other = create_cache();
              CHILD_CHECK(g_cache != nullptr && g_other != nullptr);
              g_reg_hook = [](void *addr, size_t) {
                if (g_reentry_checked.exchange(1) != 0) return MRC_OK;
                mrc_region_t *region = nullptr;
                // The other cache's reg runs this hook again: it returns at once.
                CHILD_CHECK(mrc_get(g_other, addr, kPage, MRC_PROT_READ, &region) == MRC_OK);
                mrc_put(g_other, region);
                return MRC_OK;
              };
              char *a = map_pages(1);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
              mrc_put(g_cache, region);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              CHILD_CHECK(mrc_cache_destroy(g_other) == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

// Two regs, each calling into the other's cache while both hold their own lock: one side (or
// both) gets MRC_ERR_BUSY instead of the two waiting for each other forever.
std::atomic<int> g_in_reg{0};
thread_local bool tls_crossed = false;
mrc_status_t g_cross_status[2] = {MRC_OK, MRC_OK};

TEST(CacheReentry, RegsCallingEachOthersCacheDoNotDeadlock) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              g_other = create_cache();
              CHILD_CHECK(g_cache != nullptr && g_other != nullptr);
              static char *memory = map_pages(8);
              g_reg_hook = [](void *addr, size_t) {
                if (tls_crossed) return MRC_OK;  // the nested get's own reg
                tls_crossed = true;
                const bool first = static_cast<char *>(addr) < memory + 4 * kPage;
                ++g_in_reg;
                while (g_in_reg.load() < 2) usleep(100);  // both threads hold their own lock
                mrc_region_t *region = nullptr;
                mrc_cache_t *other = first ? g_other : g_cache;
                const mrc_status_t status =
                    mrc_get(other, memory + (first ? 6 : 2) * kPage, kPage, MRC_PROT_READ, &region);
                g_cross_status[first ? 0 : 1] = status;
                if (status == MRC_OK) mrc_put(other, region);
                return MRC_OK;
              };
              auto run = [](mrc_cache_t *cache, char *at) {
                mrc_region_t *region = nullptr;
                CHILD_CHECK(mrc_get(cache, at, kPage, MRC_PROT_READ, &region) == MRC_OK);
                mrc_put(cache, region);
              };
              std::thread a(run, g_cache, memory);
              std::thread b(run, g_other, memory + 4 * kPage);
              a.join();
              b.join();
              for (mrc_status_t status : g_cross_status) {
                CHILD_CHECK(status == MRC_OK || status == MRC_ERR_BUSY);
              }
              CHILD_CHECK(g_cross_status[0] == MRC_ERR_BUSY || g_cross_status[1] == MRC_ERR_BUSY);
              g_reg_hook = nullptr;
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              CHILD_CHECK(mrc_cache_destroy(g_other) == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

// ---- fork from inside user code --------------------------------------------------------

std::atomic<int> g_forks{0};
bool g_in_grandchild = false;
int g_grandchild_status = -1;

// The grandchild, forked from inside reg or a log handler: the documented fork rule holds
// (its caches forget inherited regions; it uses them as any fork child).
int use_cache_in_grandchild() {
  char *fresh = map_pages(2);
  mrc_region_t *region = nullptr;
  CHILD_CHECK(mrc_get(g_cache, fresh, kPage, MRC_PROT_READ, &region) == MRC_OK);
  mrc_put(g_cache, region);
  mrc_stats_t stats;
  CHILD_CHECK(mrc_cache_stats(g_cache, &stats) == MRC_OK);
  return 0;
}

void fork_and_wait() {
  if (g_forks.exchange(1) != 0) return;
  const pid_t pid = fork();
  if (pid == 0) {
    g_in_grandchild = true;
    return;  // the grandchild goes on in the caller of the hook
  }
  g_grandchild_status = wait_child(pid);
}

TEST(CacheReentry, ForkInsideRegDoesNotDeadlock) {
  if (!cached_mode()) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
  for (unsigned flags : {0U, unsigned{MRC_FLAG_PURGE_ON_FORK}}) {
    EXPECT_EQ(in_child([flags] {
                g_cache = create_cache(0, flags);
                CHILD_CHECK(g_cache != nullptr);
                g_reg_hook = [](void *, size_t) {
                  fork_and_wait();
                  return MRC_OK;
                };
                char *a = map_pages(2);
                mrc_region_t *region = nullptr;
                CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
                mrc_put(g_cache, region);
                if (g_in_grandchild) _exit(use_cache_in_grandchild());
                CHILD_CHECK(g_grandchild_status == 0);
                CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
                CHILD_CHECK(g_live.load() == 0);
                return 0;
              }),
              0)
        << "flags " << flags;
  }
}

// A message logged under the cache mutex (a registration failure, at debug level).
TEST(CacheReentry, ForkFromLogHandlerDoesNotDeadlock) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              mrc_set_log_level(MRC_LOG_DEBUG);
              mrc_set_log_handler(
                  [](void *, mrc_log_level_t, const char *) {
                    fork_and_wait();
                    if (g_in_grandchild) {
                      mrc_set_log_handler(nullptr, nullptr);
                      _exit(use_cache_in_grandchild());
                    }
                  },
                  nullptr);
              g_reg_hook = [](void *, size_t) { return g_forks.load() == 0 ? MRC_ERR_IO : MRC_OK; };
              char *a = map_pages(2);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_ERR_IO);
              mrc_set_log_handler(nullptr, nullptr);
              CHILD_CHECK(g_forks.load() == 1);
              CHILD_CHECK(g_grandchild_status == 0);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              return 0;
            }),
            0);
}

// ---- fork while another thread runs reg ---------------------------------------------------
// The fork handlers used to wait for every cache mutex: a reg (which runs under its cache's)
// that forked too, or created a cache, waited for that fork in turn.

mrc_cache_t *g_pair[2] = {nullptr, nullptr};
thread_local int t_side = 0;  // which of g_pair this thread's gets use
std::atomic<int> g_regs_running{0};
std::atomic<int> g_fork_status[2] = {-1, -1};

// Waits (bounded) until `flag` reaches `value`.
void wait_for(const std::atomic<int> &flag, int value) {
  for (int i = 0; i < 5000 && flag.load() < value; ++i) usleep(1000);
}

// In the grandchild: the cache whose mutex another thread held across its reg at the fork works.
int get_in_grandchild(mrc_cache_t *cache) {
  alarm(kAlarmSeconds);  // alarms do not cross fork()
  char *fresh = map_pages(2);
  mrc_region_t *region = nullptr;
  CHILD_CHECK(mrc_get(cache, fresh, kPage, MRC_PROT_READ, &region) == MRC_OK);
  mrc_put(cache, region);
  return 0;
}

TEST(CacheReentry, TwoThreadsForkingFromRegsOfTwoCachesDoNotWaitForEachOther) {
  if (!cached_mode()) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
  EXPECT_EQ(in_child([] {
              g_pair[0] = create_cache();
              g_pair[1] = create_cache();
              CHILD_CHECK(g_pair[0] != nullptr && g_pair[1] != nullptr);
              g_reg_hook = [](void *, size_t) {
                // The first reg of each thread (not the grandchild's): both run, then both fork.
                if (g_regs_running.fetch_add(1) >= 2) return MRC_OK;
                wait_for(g_regs_running, 2);
                const pid_t pid = fork();
                if (pid == 0) _exit(get_in_grandchild(g_pair[1 - t_side]));
                g_fork_status[t_side] = wait_child(pid);
                return MRC_OK;
              };
              auto get_and_put = [](int side) {
                t_side = side;
                char *a = map_pages(2);
                mrc_region_t *region = nullptr;
                CHILD_CHECK(mrc_get(g_pair[side], a, kPage, MRC_PROT_READ, &region) == MRC_OK);
                mrc_put(g_pair[side], region);
              };
              std::thread other(get_and_put, 1);
              get_and_put(0);
              other.join();
              CHILD_CHECK(g_fork_status[0].load() == 0);
              CHILD_CHECK(g_fork_status[1].load() == 0);
              CHILD_CHECK(mrc_cache_destroy(g_pair[0]) == MRC_OK);
              CHILD_CHECK(mrc_cache_destroy(g_pair[1]) == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

std::atomic<int> g_forking{0};

TEST(CacheReentry, RegCreatingACacheWhileAnotherThreadForksDoesNotDeadlock) {
  if (!cached_mode()) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              // In the grandchild too: its get's reg creates a cache (the list of caches is
              // unlocked there, though its fork handler's thread has a new id).
              g_reg_hook = [](void *, size_t) {
                ++g_regs_running;
                wait_for(g_forking, 1);
                usleep(100 * 1000);  // the fork's handlers run meanwhile
                mrc_cache_t *extra = create_cache();
                CHILD_CHECK(extra != nullptr);
                CHILD_CHECK(mrc_cache_destroy(extra) == MRC_OK);
                return MRC_OK;
              };
              std::thread registering([] {
                char *a = map_pages(2);
                mrc_region_t *region = nullptr;
                CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
                mrc_put(g_cache, region);
              });
              wait_for(g_regs_running, 1);
              g_forking = 1;
              const pid_t pid = fork();
              if (pid == 0) _exit(get_in_grandchild(g_cache));
              CHILD_CHECK(wait_child(pid) == 0);
              registering.join();
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

// MRC_FLAG_PURGE_ON_FORK deregisters in the fork's prepare handler: that dereg may create and
// destroy a cache (the list of caches the handler walks is locked meanwhile).
TEST(CacheReentry, PurgeOnForkDeregThatCreatesACacheDoesNotDeadlock) {
  if (!cached_mode()) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
  EXPECT_EQ(in_child([] {
              g_cache = create_cache(0, MRC_FLAG_PURGE_ON_FORK);
              CHILD_CHECK(g_cache != nullptr);
              char *a = map_pages(2);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
              mrc_put(g_cache, region);
              g_dereg_hook = [] {
                mrc_cache_t *extra = create_cache();
                CHILD_CHECK(extra != nullptr);
                CHILD_CHECK(mrc_cache_destroy(extra) == MRC_OK);
                ++g_forks;
              };
              const pid_t pid = fork();
              if (pid == 0) _exit(0);
              CHILD_CHECK(wait_child(pid) == 0);
              CHILD_CHECK(g_forks.load() == 1);  // the dereg ran, before the fork
              CHILD_CHECK(g_live.load() == 0);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              return 0;
            }),
            0);
}

// ---- dereg and log handlers call back ------------------------------------------------------

// Out of registration resources, a get evicts the unused regions and retries: their dereg runs
// after the cache mutex is released.
TEST(CacheReentry, DeregCallingStatsDuringEvictionDoesNotDeadlock) {
  if (!cached_mode()) GTEST_SKIP() << "userfaultfd unavailable: uncached mode";
  EXPECT_EQ(
      in_child([] {
        g_cache = create_cache();
        CHILD_CHECK(g_cache != nullptr);
        static std::atomic<int> stats_calls{0};
        g_dereg_hook = [] {
          mrc_stats_t stats;
          CHILD_CHECK(mrc_cache_stats(g_cache, &stats) == MRC_OK);
          ++stats_calls;
        };
        // Room for two registrations only.
        g_reg_hook = [](void *, size_t) { return g_live.load() >= 2 ? MRC_ERR_NO_MEMORY : MRC_OK; };
        char *a = map_pages(8);
        mrc_region_t *region = nullptr;
        for (int i = 0; i < 2; ++i) {  // two cached regions, unused (apart: no merge)
          CHILD_CHECK(mrc_get(g_cache, a + 3 * i * kPage, kPage, MRC_PROT_READ, &region) == MRC_OK);
          mrc_put(g_cache, region);
        }
        CHILD_CHECK(mrc_get(g_cache, a + 6 * kPage, kPage, MRC_PROT_READ, &region) == MRC_OK);
        CHILD_CHECK(stats_calls.load() == 2);
        mrc_stats_t stats;
        CHILD_CHECK(mrc_cache_stats(g_cache, &stats) == MRC_OK);
        CHILD_CHECK(stats.evictions == 2);
        mrc_put(g_cache, region);
        CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
        CHILD_CHECK(g_live.load() == 0);
        return 0;
      }),
      0);
}

TEST(CacheReentry, LogHandlerCallingStatsDoesNotDeadlock) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              static std::atomic<int> messages{0};
              mrc_set_log_level(MRC_LOG_DEBUG);
              mrc_set_log_handler(
                  [](void *, mrc_log_level_t, const char *) {
                    mrc_stats_t stats;
                    CHILD_CHECK(mrc_cache_stats(g_cache, &stats) == MRC_OK);
                    ++messages;
                  },
                  nullptr);
              g_reg_hook = [](void *, size_t) { return MRC_ERR_IO; };
              char *a = map_pages(2);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_ERR_IO);
              mrc_set_log_handler(nullptr, nullptr);
              CHILD_CHECK(messages.load() >= 1);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              return 0;
            }),
            0);
}

// A message logged during a call reaches the handler when the call is done with its cache: a
// handler may destroy the very cache whose get logged (the get used to go on reading the freed
// cache: AddressSanitizer and valgrind saw it).
TEST(CacheReentry, LogHandlerMayDestroyTheCacheWhoseGetLogged) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              static std::atomic<int> destroyed{0};
              static mrc_status_t destroy_status = MRC_ERR_INVALID;
              mrc_set_log_level(MRC_LOG_DEBUG);
              mrc_set_log_handler(
                  [](void *, mrc_log_level_t, const char *) {
                    if (destroyed.exchange(1) == 0) destroy_status = mrc_cache_destroy(g_cache);
                  },
                  nullptr);
              g_reg_hook = [](void *, size_t) { return MRC_ERR_IO; };
              char *a = map_pages(2);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_ERR_IO);
              mrc_set_log_handler(nullptr, nullptr);
              CHILD_CHECK(destroyed.load() == 1);
              CHILD_CHECK(destroy_status == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

// mrc_put logs its refusals: a double put of a region parked in the thread's line is refused
// while the put reads that line (inside an epoch guard), and a handler that destroys the cache
// waits for every guard to end (it used to wait for its own thread's, for ever).
TEST(CacheReentry, LogHandlerMayDestroyTheCacheWhosePutWasRefused) {
  if (!cached_mode()) GTEST_SKIP() << "userfaultfd unavailable: nothing is cached, nothing parks";
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              static std::atomic<int> errors{0};
              static mrc_status_t destroy_status = MRC_ERR_INVALID;
              mrc_set_log_handler(
                  [](void *, mrc_log_level_t level, const char *) {
                    if (level == MRC_LOG_ERROR && errors.exchange(1) == 0) {
                      destroy_status = mrc_cache_destroy(g_cache);
                    }
                  },
                  nullptr);
              char *a = map_pages(2);
              mrc_region_t *region = nullptr;
              for (int i = 0; i < 32; ++i) {  // hot: its put parks (Cache::kPromoteAfter is 8)
                CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
                mrc_put(g_cache, region);
              }
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
              mrc_put(g_cache, region);
              mrc_put(g_cache, region);  // refused: the reference is parked already
              mrc_set_log_handler(nullptr, nullptr);
              CHILD_CHECK(errors.load() == 1);
              CHILD_CHECK(destroy_status == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

// The handler runs at the end of the call that logged, before it returns: what the handler's own
// calls leave in mrc_last_error() is undone, and the caller reads its own call's reason.
TEST(CacheReentry, LogHandlerLeavesTheCallersLastError) {
  EXPECT_EQ(
      in_child([] {
        g_cache = create_cache();
        CHILD_CHECK(g_cache != nullptr);
        static std::atomic<int> messages{0};
        mrc_set_log_level(MRC_LOG_DEBUG);
        mrc_set_log_handler(
            [](void *, mrc_log_level_t, const char *) {
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, nullptr, 0, MRC_PROT_READ, &region) == MRC_ERR_INVALID);
              ++messages;
            },
            nullptr);
        g_reg_hook = [](void *addr, size_t) {
          mrc_backend_set_error("reentry", "no registration at %p today", addr);
          return MRC_ERR_IO;
        };
        char *a = map_pages(2);
        mrc_region_t *region = nullptr;
        CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_ERR_IO);
        CHILD_CHECK(messages.load() >= 1);
        CHILD_CHECK(std::strstr(mrc_last_error(), "no registration at") != nullptr);
        mrc_set_log_handler(nullptr, nullptr);
        CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
        return 0;
      }),
      0);
}

// ---- invalidate callbacks ----------------------------------------------------------------

std::atomic<int> g_done_calls{0};
mrc_status_t g_status_in_callback = MRC_OK;

TEST(CacheReentry, DestroyFromDoneCallbackIsRefused) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              char *a = map_pages(2);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
              CHILD_CHECK(mrc_invalidate(
                              g_cache, region,
                              [](void *) {
                                ++g_done_calls;
                                g_status_in_callback = mrc_cache_destroy(g_cache);
                              },
                              nullptr) == MRC_OK);
              mrc_put(g_cache, region);  // the last reference: the callback runs here
              CHILD_CHECK(g_done_calls.load() == 1);
              CHILD_CHECK(g_status_in_callback == MRC_ERR_BUSY);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

// The 0.1 mrc_cache_destroy (void) cannot say "busy": from a callback it logs an error and
// leaves the cache alone (it used to recurse until the stack ran out). The tests link the static
// library, where the implementation behind mrc_cache_destroy@MRCACHE_0 has its own name.
TEST(CacheReentry, DestroyV01FromDoneCallbackLogsAndLeavesTheCache) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              static std::atomic<int> errors{0};
              mrc_set_log_handler(
                  [](void *, mrc_log_level_t level, const char *) {
                    if (level == MRC_LOG_ERROR) ++errors;
                  },
                  nullptr);
              char *a = map_pages(2);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
              CHILD_CHECK(mrc_invalidate(
                              g_cache, region,
                              [](void *) {
                                ++g_done_calls;
                                mrc_cache_destroy_v0(g_cache);
                              },
                              nullptr) == MRC_OK);
              mrc_put(g_cache, region);
              CHILD_CHECK(g_done_calls.load() == 1);
              CHILD_CHECK(errors.load() == 1);
              mrc_set_log_handler(nullptr, nullptr);
              mrc_stats_t stats;  // still alive
              CHILD_CHECK(mrc_cache_stats(g_cache, &stats) == MRC_OK);
              mrc_cache_destroy_v0(g_cache);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

// A callback that destroy runs (a deregistration batched by max_unreleased) cannot start a
// registration destroy would never end.
TEST(CacheReentry, GetFromDoneCallbackDuringDestroyIsRefused) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache(/*max_unreleased=*/64 * kPage);
              CHILD_CHECK(g_cache != nullptr);
              static char *memory = map_pages(4);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_get(g_cache, memory, kPage, MRC_PROT_READ, &region) == MRC_OK);
              CHILD_CHECK(mrc_invalidate(
                              g_cache, region,
                              [](void *) {
                                ++g_done_calls;
                                mrc_region_t *again = nullptr;
                                g_status_in_callback = mrc_get(g_cache, memory + 2 * kPage, kPage,
                                                               MRC_PROT_READ, &again);
                              },
                              nullptr) == MRC_OK);
              mrc_put(g_cache, region);  // batched: deregistered (and called back) by destroy
              CHILD_CHECK(g_done_calls.load() == 0);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              CHILD_CHECK(g_done_calls.load() == 1);
              CHILD_CHECK(g_status_in_callback == MRC_ERR_BUSY);
              CHILD_CHECK(g_live.load() == 0);
              return 0;
            }),
            0);
}

TEST(CacheReentry, InvalidateFromOwnDoneCallbackIsRefused) {
  EXPECT_EQ(in_child([] {
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              static mrc_region_t *region = nullptr;
              static std::atomic<int> second_calls{0};
              char *a = map_pages(2);
              CHILD_CHECK(mrc_get(g_cache, a, kPage, MRC_PROT_READ, &region) == MRC_OK);
              CHILD_CHECK(mrc_invalidate(
                              g_cache, region,
                              [](void *) {
                                ++g_done_calls;
                                // The region has ended: refused, not a callback that never runs.
                                g_status_in_callback = mrc_invalidate(
                                    g_cache, region, [](void *) { ++second_calls; }, nullptr);
                              },
                              nullptr) == MRC_OK);
              mrc_put(g_cache, region);
              CHILD_CHECK(g_done_calls.load() == 1);
              CHILD_CHECK(g_status_in_callback == MRC_ERR_INVALID);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              CHILD_CHECK(second_calls.load() == 0);
              return 0;
            }),
            0);
}

// ---- destroy while regions are held ------------------------------------------------------

TEST(CacheReentry, DestroyRefusedWhileARegionIsHeld) {
  mrc_cache_t *cache = create_cache();
  ASSERT_NE(cache, nullptr);
  char *a = map_pages(4);
  ASSERT_NE(a, nullptr);
  mrc_region_t *held = nullptr;
  mrc_region_t *cached = nullptr;
  ASSERT_EQ(mrc_get(cache, a, kPage, MRC_PROT_READ, &held), MRC_OK);
  ASSERT_EQ(mrc_get(cache, a + 2 * kPage, kPage, MRC_PROT_READ, &cached), MRC_OK);
  for (int i = 0; i < 20; ++i) {  // hits park references: those are the cache's, not held
    mrc_put(cache, cached);
    ASSERT_EQ(mrc_get(cache, a + 2 * kPage, kPage, MRC_PROT_READ, &cached), MRC_OK);
  }
  mrc_put(cache, cached);
  const int live = g_live.load();
  EXPECT_EQ(mrc_cache_destroy(cache), MRC_ERR_BUSY);
  EXPECT_NE(std::strstr(mrc_last_error(), "still holds a region"), nullptr) << mrc_last_error();
  EXPECT_EQ(g_live.load(), live) << "a refused destroy changed something";
  // The cache still works, and so does the held region.
  EXPECT_EQ(mrc_region_start(held), a);
  mrc_region_t *again = nullptr;
  ASSERT_EQ(mrc_get(cache, a, kPage, MRC_PROT_READ, &again), MRC_OK);
  mrc_put(cache, again);
  // An invalidated region still held counts too.
  ASSERT_EQ(mrc_invalidate(cache, held, nullptr, nullptr), MRC_OK);
  EXPECT_EQ(mrc_cache_destroy(cache), MRC_ERR_BUSY);
  mrc_put(cache, held);
  EXPECT_EQ(mrc_cache_destroy(cache), MRC_OK);
  EXPECT_EQ(g_live.load(), 0);
  munmap(a, 4 * kPage);
}

// The C++ owner keeps a cache destroy refused: the regions' owners outlive it safely.
TEST(CacheReentry, CppOwnerKeepsARefusedCache) {
  char *a = map_pages(2);
  ASSERT_NE(a, nullptr);
  mrcache::RegionRef ref;
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = &kHookOps;
  {
    mrcache::Cache cache;
    ASSERT_EQ(cache.open(&params), MRC_OK);
    ASSERT_EQ(cache.get(a, kPage, MRC_PROT_READ, &ref), MRC_OK);
    EXPECT_EQ(cache.reset(), MRC_ERR_BUSY);
    EXPECT_TRUE(cache);  // still owned: reset may be tried again
    mrc_cache_t *raw = cache.get();
    // Leaving the scope with the region held: the cache is left alive (released), not
    // destroyed under the reference.
    g_cache = raw;
  }
  EXPECT_EQ(mrc_region_start(ref.get()), a);
  ref.reset();  // the cache is still there to take the put
  EXPECT_EQ(mrc_cache_destroy(g_cache), MRC_OK);
  EXPECT_EQ(g_live.load(), 0);
  munmap(a, 2 * kPage);
}

// A registered segment holds its region: the cache cannot be destroyed under it.
TEST(CacheReentry, DestroyRefusedWhileASegmentIsRegistered) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan misreads the process-shared robust mutexes of a segment domain";
#endif
  EXPECT_EQ(in_child([] {
              char prefix[64];
              std::snprintf(prefix, sizeof prefix, "mrc-reentry-%d", static_cast<int>(getpid()));
              mrc_seg_domain_params_t dparams;
              mrc_seg_domain_params_init(&dparams);
              dparams.prefix = prefix;
              dparams.size = 1ULL << 30;
              mrc_seg_domain_t *domain = nullptr;
              CHILD_CHECK(mrc_seg_domain_open(&dparams, &domain) == MRC_OK);
              mrc_seg_t *seg = nullptr;
              CHILD_CHECK(mrc_seg_open(domain, "seg", 1 << 20, MRC_SEG_HEAP, &seg) == MRC_OK);
              g_cache = create_cache();
              CHILD_CHECK(g_cache != nullptr);
              mrc_region_t *region = nullptr;
              CHILD_CHECK(mrc_seg_register(seg, g_cache, &region) == MRC_OK);
              mrc_put(g_cache, region);  // the segment keeps a reference of its own
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_ERR_BUSY);
              CHILD_CHECK(mrc_seg_close(seg) == MRC_OK);
              CHILD_CHECK(mrc_cache_destroy(g_cache) == MRC_OK);
              CHILD_CHECK(g_live.load() == 0);
              CHILD_CHECK(mrc_seg_domain_close(domain) == MRC_OK);
              CHILD_CHECK(mrc_seg_domain_remove(&dparams, nullptr) == MRC_OK);
              return 0;
            }),
            0);
}

}  // namespace
