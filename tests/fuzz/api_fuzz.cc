// SPDX-License-Identifier: BSD-3-Clause
// Fuzz target "api": a program of C API calls read from the input. Each input creates a cache
// over a plugin backend, maps a few areas (private and shared), then runs operations chosen by
// the input: mrc_get / mrc_get_aligned with fuzzed ranges, protections and alignments (valid and
// not), mrc_put, mrc_invalidate, mrc_cache_purge, the statistics, and munmap / mmap / mremap /
// madvise of the areas under the cache. The backend fails registrations on fuzzed bytes.
//
// The harness keeps its own model of the regions it holds, so it never puts a region twice
// (that is a contract violation the library may not survive: docs/DESIGN.md, "The C API contract"),
// and puts everything back at the end of each input, then destroys the cache: LeakSanitizer and the
// backend's own count of live registrations see anything the cache forgot. Checked after every
// input: every registration was deregistered exactly once, every mrc_invalidate that returned
// MRC_OK ran its done-callback exactly once, every status is an mrc_status_t.
//
// The backend's reg and dereg, the done-callbacks and the log handler also call back into the
// cache on fuzzed bytes (stats, get and put, invalidate, purge, destroy): each such call returns
// a status and never deadlocks (docs/DESIGN.md, "The C API contract": from reg, what needs the
// cache's lock is MRC_ERR_BUSY; destroy from a callback is MRC_ERR_BUSY).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <set>
#include <vector>

#include "mrcache/mrcache.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

constexpr int kAreas = 3;
constexpr size_t kAreaPages = 64;
constexpr size_t kMaxHeld = 64;

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

struct Area {
  char *addr = nullptr;  // nullptr: not mapped now
  size_t len = 0;
  bool shared = false;
};

struct Held {
  mrc_region_t *region;
};

// The state of one input. Callbacks reach it through g_state (the plugin's ctx is the state too).
struct State {
  fuzz::Input *in = nullptr;
  mrc_cache_t *cache = nullptr;
  Area areas[kAreas];
  std::vector<Held> held;
  std::set<void *> live;  // handles the backend registered and the cache has not deregistered
  uint64_t next_key = 1;
  uint64_t invalidates_ok = 0;  // mrc_invalidate calls that returned MRC_OK
  uint64_t done_calls = 0;      // done-callbacks run
  int reenter_depth = 0;
};

State *g_state = nullptr;

bool is_status(int status) { return status <= 0 && status >= MRC_ERR_IO; }

void check_status(int status, const char *call) {
  if (!is_status(status)) fuzz::fail("%s returned %d, not an mrc_status_t", call, status);
}

void reenter(State *s, const char *where);

// ---- the plugin backend ------------------------------------------------------------------

mrc_status_t plugin_reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                        uint64_t *key) {
  auto *s = static_cast<State *>(ctx);
  (void)prot;
  if (len == 0) fuzz::fail("reg of an empty range at %p", addr);
  // Fails on fuzzed bytes, with each failure the contract lets a backend return.
  switch (s->in->small_below(16)) {
    case 0:
      mrc_backend_set_error("fuzz", "injected failure of %zu bytes", len);
      return MRC_ERR_BACKEND;
    case 1: mrc_backend_set_error("fuzz", "injected no memory"); return MRC_ERR_NO_MEMORY;
    case 2: return MRC_ERR_INVALID;
    case 3: return MRC_ERR_UNSUPPORTED;
    case 4: return MRC_ERR_BUSY;
    default: break;
  }
  // A handle that is its own allocation: LeakSanitizer reports one the cache never deregisters.
  reenter(s, "reg");
  auto *h = new uint64_t(s->next_key);
  *handle = h;
  *key = s->next_key++;
  s->live.insert(h);
  return MRC_OK;
}

void plugin_dereg(void *ctx, void *handle) {
  auto *s = static_cast<State *>(ctx);
  if (s->live.erase(handle) != 1) fuzz::fail("dereg of a handle that is not live: %p", handle);
  delete static_cast<uint64_t *>(handle);
  reenter(s, "dereg");
}

int plugin_describe(void *ctx, void *handle, char *buf, size_t len) {
  (void)ctx;
  return std::snprintf(buf, len, "fuzz handle %p", handle);
}

const mrc_backend_t kPlugin = {
    .struct_size = sizeof(mrc_backend_t),
    .name = "fuzz",
    .reg = plugin_reg,
    .dereg = plugin_dereg,
    .describe = plugin_describe,
};

void on_done(void *arg) {
  auto *s = static_cast<State *>(arg);
  s->done_calls += 1;
  reenter(s, "done");
}

void on_log(void *arg, mrc_log_level_t level, const char *message) {
  (void)arg;
  (void)level;
  (void)message;
  if (g_state != nullptr && g_state->cache != nullptr) reenter(g_state, "log");
}

// ---- the operations ----------------------------------------------------------------------

Area *pick_area(State *s) { return &s->areas[s->in->small_below(kAreas)]; }

void map_area(Area *a, char *hint) {
  const size_t len = kAreaPages * page_size();
  const int flags = MAP_ANONYMOUS | (a->shared ? MAP_SHARED : MAP_PRIVATE) |
                    (hint != nullptr ? MAP_FIXED_NOREPLACE : 0);
  void *p = mmap(hint, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED && hint != nullptr) {
    p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
             MAP_ANONYMOUS | (a->shared ? MAP_SHARED : MAP_PRIVATE), -1, 0);
  }
  if (p == MAP_FAILED) fuzz::fail("mmap of an area failed");
  a->addr = static_cast<char *>(p);
  a->len = len;
  std::memset(a->addr, 0x5a, len);  // touched: the pages exist
}

void unmap_area(Area *a) {
  if (a->addr == nullptr) return;
  munmap(a->addr, a->len);
  a->addr = nullptr;
  a->len = 0;
}

// A range for a get: mostly inside an area (unaligned starts and ends included), sometimes
// straddling its end, sometimes wild (NULL, the top of the address space, a wrapping length).
void pick_range(State *s, char **addr, size_t *len) {
  fuzz::Input &in = *s->in;
  Area *a = pick_area(s);
  const uint8_t kind = in.small_below(16);
  char *base = a->addr != nullptr ? a->addr : reinterpret_cast<char *>(0x10000);
  const size_t area_len = kAreaPages * page_size();
  if (kind == 0) {
    *addr = nullptr;
    *len = in.u16();
  } else if (kind == 1) {
    *addr = reinterpret_cast<char *>(~uintptr_t{0} - in.u16());
    *len = in.u16() + 1u;
  } else if (kind == 2) {
    *addr = base + in.below(static_cast<uint32_t>(area_len));
    *len = ~size_t{0} - in.u16();
  } else if (kind == 3) {
    *addr = base + in.below(static_cast<uint32_t>(area_len));
    *len = 0;
  } else {
    const size_t offset = in.below(static_cast<uint32_t>(area_len));
    *addr = base + offset;
    // Up to a page past the area's end: straddles unmapped memory now and then.
    *len = 1 + in.below(static_cast<uint32_t>(area_len - offset + page_size()));
  }
}

unsigned pick_prot(fuzz::Input &in) {
  const uint8_t b = in.byte();
  // Mostly valid (1..3); 0 and unknown bits now and then.
  return (b & 0xe0) == 0xe0 ? b : static_cast<unsigned>(1 + b % 3);
}

size_t pick_alignment(fuzz::Input &in) {
  const uint8_t b = in.byte();
  switch (b % 8) {
    case 0: return 0;                        // the cache's alignment
    case 1: return in.u32();                 // anything: mostly not a power of two
    case 2: return size_t{1} << (b >> 3);    // powers of two below and above the page
    default: return page_size() << (b % 6);  // page .. 32 pages
  }
}

void hold(State *s, mrc_region_t *region, char *addr, size_t len) {
  if (region == nullptr) fuzz::fail("get returned MRC_OK and no region");
  // In integers: a wild range must not be pointer arithmetic (UBSan), and one that wraps the
  // address space must have been refused.
  const auto first = reinterpret_cast<uintptr_t>(addr);
  uintptr_t end = 0;
  if (__builtin_add_overflow(first, len, &end)) {
    fuzz::fail("get of [%#lx, +%#zx) wraps the address space and returned MRC_OK",
               static_cast<unsigned long>(first), len);
  }
  const auto start = reinterpret_cast<uintptr_t>(mrc_region_start(region));
  const size_t length = mrc_region_length(region);
  if (start > first || start + length < end) {
    fuzz::fail("region [%#lx, +%zu) does not cover [%#lx, +%zu)", static_cast<unsigned long>(start),
               length, static_cast<unsigned long>(first), len);
  }
  s->held.push_back(Held{region});
}

void op_get(State *s, bool aligned) {
  fuzz::Input &in = *s->in;
  char *addr = nullptr;
  size_t len = 0;
  pick_range(s, &addr, &len);
  const unsigned prot = pick_prot(in);
  mrc_region_t *region = nullptr;
  int status;
  if (aligned) {
    status = mrc_get_aligned(s->cache, addr, len, pick_alignment(in), prot, &region);
  } else {
    status = mrc_get(s->cache, addr, len, prot, &region);
  }
  check_status(status, aligned ? "mrc_get_aligned" : "mrc_get");
  if (status != MRC_OK) return;
  hold(s, region, addr, len);
  // A hot range: got and put a few more times.
  if (s->held.size() < kMaxHeld && in.small_below(4) == 0) {
    for (int i = in.small_below(4); i > 0; --i) {
      mrc_region_t *again = nullptr;
      if (mrc_get(s->cache, addr, len, prot, &again) == MRC_OK) mrc_put(s->cache, again);
    }
  }
}

void op_put(State *s) {
  if (s->held.empty()) return;
  const size_t i = s->in->below(static_cast<uint32_t>(s->held.size()));
  mrc_region_t *region = s->held[i].region;
  s->held.erase(s->held.begin() + static_cast<std::ptrdiff_t>(i));
  mrc_put(s->cache, region);
}

void op_invalidate(State *s) {
  if (s->held.empty()) return;
  const size_t i = s->in->below(static_cast<uint32_t>(s->held.size()));
  const bool with_done = s->in->flag();
  const int status = mrc_invalidate(s->cache, s->held[i].region, with_done ? on_done : nullptr, s);
  check_status(status, "mrc_invalidate");
  if (status == MRC_OK && with_done) s->invalidates_ok += 1;
}

void op_stats(State *s) {
  mrc_stats_t stats{};
  check_status(mrc_cache_stats(s->cache, &stats), "mrc_cache_stats");
  char buf[64];
  const int len = mrc_cache_stats_json(s->cache, buf, s->in->small_below(sizeof buf));
  if (len < 0) check_status(len, "mrc_cache_stats_json");
  // Sizes below the first sized layout are refused.
  check_status(mrc_cache_stats_sized(s->cache, &stats, s->in->small_below(sizeof stats)),
               "mrc_cache_stats_sized");
}

// Changes an area under the cache: what the monitor must see.
void op_mutate(State *s) {
  fuzz::Input &in = *s->in;
  Area *a = pick_area(s);
  const uint8_t kind = in.small_below(5);
  if (a->addr == nullptr) {
    map_area(a, nullptr);
    return;
  }
  const size_t pages = a->len / page_size();
  const size_t first = in.below(static_cast<uint32_t>(pages));
  const size_t count = 1 + in.below(static_cast<uint32_t>(pages - first));
  char *part = a->addr + first * page_size();
  switch (kind) {
    case 0: unmap_area(a); break;
    case 1: {  // munmap, then a fresh mapping at the same address if it is still free
      char *old = a->addr;
      unmap_area(a);
      map_area(a, old);
      break;
    }
    case 2:  // MAP_FIXED over part of it
      if (mmap(part, count * page_size(), PROT_READ | PROT_WRITE,
               MAP_FIXED | MAP_ANONYMOUS | (a->shared ? MAP_SHARED : MAP_PRIVATE), -1,
               0) == MAP_FAILED) {
        fuzz::fail("mmap MAP_FIXED over an area failed");
      }
      break;
    case 3:  // MADV_DONTNEED over part of it
      (void)madvise(part, count * page_size(), MADV_DONTNEED);
      break;
    default: {  // shrink in place (the tail is unmapped), then grow back by a fresh mapping
      if (first == 0) break;
      if (mremap(a->addr, a->len, first * page_size(), 0) == MAP_FAILED) break;
      const size_t tail = a->len - first * page_size();
      void *p =
          mmap(a->addr + first * page_size(), tail, PROT_READ | PROT_WRITE,
               MAP_FIXED_NOREPLACE | MAP_ANONYMOUS | (a->shared ? MAP_SHARED : MAP_PRIVATE), -1, 0);
      if (p == MAP_FAILED) a->len = first * page_size();  // someone took the tail
      break;
    }
  }
}

// From a callback: one call back into the cache, chosen by the input; bounded depth.
void reenter(State *s, const char *where) {
  if (s->cache == nullptr || s->reenter_depth >= 2) return;
  s->reenter_depth += 1;
  switch (s->in->small_below(8)) {
    case 0: {
      mrc_stats_t stats{};
      check_status(mrc_cache_stats(s->cache, &stats), "mrc_cache_stats (re-entered)");
      break;
    }
    case 1: {
      char *addr = nullptr;
      size_t len = 0;
      pick_range(s, &addr, &len);
      mrc_region_t *region = nullptr;
      const int status = mrc_get(s->cache, addr, len, MRC_PROT_READ, &region);
      check_status(status, "mrc_get (re-entered)");
      if (status == MRC_OK) mrc_put(s->cache, region);
      break;
    }
    case 2:
      if (!s->held.empty()) {
        const size_t i = s->in->below(static_cast<uint32_t>(s->held.size()));
        const int status = mrc_invalidate(s->cache, s->held[i].region, on_done, s);
        check_status(status, "mrc_invalidate (re-entered)");
        if (status == MRC_OK) s->invalidates_ok += 1;
      }
      break;
    case 3: check_status(mrc_cache_purge(s->cache), "mrc_cache_purge (re-entered)"); break;
    case 4: {
      // reg runs under the cache's lock, dereg and done inside one of its callbacks: destroy is
      // refused there. (A log message may come from outside any cache call: not tried there.)
      if (where[0] == 'l') break;
      const int status = mrc_cache_destroy(s->cache);
      if (status != MRC_ERR_BUSY) {
        fuzz::fail("mrc_cache_destroy from %s returned %d, not MRC_ERR_BUSY", where, status);
      }
      break;
    }
    default: break;
  }
  s->reenter_depth -= 1;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  mrc_set_log_handler(on_log, nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::Input in(data, size);
  State state;
  state.in = &in;
  g_state = &state;
  for (int i = 0; i < kAreas; ++i) {
    state.areas[i].shared = i == kAreas - 1;
    map_area(&state.areas[i], nullptr);
  }

  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = &kPlugin;
  params.backend_ctx = &state;
  // Cache-wide settings from the first bytes: limits (eviction), flags, alignment.
  const uint8_t setup = in.byte();
  params.max_regions = setup & 1 ? 1 + in.small_below(8) : 0;
  params.max_bytes = setup & 2 ? (1 + in.small_below(64)) * page_size() : 0;
  params.max_unreleased = setup & 4 ? (1 + in.small_below(64)) * page_size() : 0;
  params.flags = 0;
  if ((setup & 8) != 0) params.flags |= MRC_FLAG_ORDERED_UNMAPS;
  if ((setup & 16) != 0) params.flags |= MRC_FLAG_VERIFY_PFN;
  params.alignment = setup & 32 ? page_size() << in.small_below(4) : 0;
  const int created = mrc_cache_create(&params, &state.cache);
  check_status(created, "mrc_cache_create");
  if (created != MRC_OK)
    fuzz::fail("mrc_cache_create: %s", mrc_status_string(static_cast<mrc_status_t>(created)));

  while (!in.done()) {
    switch (in.small_below(10)) {
      case 0:
      case 1:
        if (state.held.size() < kMaxHeld) op_get(&state, false);
        break;
      case 2:
        if (state.held.size() < kMaxHeld) op_get(&state, true);
        break;
      case 3:
      case 4: op_put(&state); break;
      case 5: op_invalidate(&state); break;
      case 6: check_status(mrc_cache_purge(state.cache), "mrc_cache_purge"); break;
      case 7: op_stats(&state); break;
      default: op_mutate(&state); break;
    }
  }

  // Everything back, then the cache: every registration must have been deregistered, every
  // accepted invalidation must have run its callback once.
  while (!state.held.empty()) {
    mrc_put(state.cache, state.held.back().region);
    state.held.pop_back();
  }
  mrc_cache_t *cache = state.cache;
  state.cache = nullptr;
  check_status(mrc_cache_destroy(cache), "mrc_cache_destroy");
  if (!state.live.empty()) {
    fuzz::fail("%zu registration(s) still live after mrc_cache_destroy", state.live.size());
  }
  if (state.done_calls != state.invalidates_ok) {
    fuzz::fail("%llu done-callback(s) ran for %llu accepted mrc_invalidate call(s)",
               static_cast<unsigned long long>(state.done_calls),
               static_cast<unsigned long long>(state.invalidates_ok));
  }
  for (Area &a : state.areas) unmap_area(&a);
  g_state = nullptr;
  return 0;
}
