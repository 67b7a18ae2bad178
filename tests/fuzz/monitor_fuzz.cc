// SPDX-License-Identifier: BSD-3-Clause
// Fuzz target "monitor": a program of public monitor calls (include/mrcache/monitor.h) read from
// the input. Each input opens a monitor (one-shot or not), maps a few areas, then runs
// operations chosen by the input: subscribe and unsubscribe of fuzzed ranges (inside the areas,
// across their edges, empty, wrapping, NULL monitor), valid, deliver, statistics with fuzzed
// sizes, and munmap / mmap / madvise / mremap of the areas under the monitor. notify calls back
// into the monitor on fuzzed bytes (subscribe, unsubscribe, valid, and deliver and close, which
// must answer MRC_ERR_BUSY).
//
// The harness models what it subscribed. Checked after every operation: every status is an
// mrc_status_t; an unsubscribe succeeds exactly when the model holds the range (not one-shot);
// a range the model holds twice needs two unsubscribes. Checked after every delivery: every area
// the harness unmapped, moved or dropped pages of while one of its ranges was subscribed has been
// notified, and no notify came from an area nothing was subscribed in. At the end the monitor is
// closed with everything still subscribed: LeakSanitizer sees anything it forgot.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <utility>

#include "mrcache/monitor.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

constexpr int kAreas = 3;
constexpr size_t kAreaPages = 8;

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

struct Area {
  char *addr = nullptr;  // nullptr: not mapped now
  // The first change there under a subscription that awaits its notify (empty: none).
  uintptr_t owed_start = 0;
  uintptr_t owed_end = 0;
};

// The model of one subscribed range: how many subscriptions, and how many of them were made
// since the memory under it was last replaced (those watch what is there now).
struct Subscribed {
  unsigned count = 0;
  unsigned fresh = 0;
};
using Range = std::pair<uintptr_t, uintptr_t>;

struct State {
  fuzz::Input *in = nullptr;
  mrc_monitor_t *monitor = nullptr;
  bool one_shot = false;
  Area areas[kAreas];
  std::map<Range, Subscribed> subscribed;
  int depth = 0;
};

bool is_status(int status) { return status <= 0 && status >= MRC_ERR_IO; }

void check_status(int status, const char *call) {
  if (!is_status(status)) fuzz::fail("%s returned %d, not an mrc_status_t", call, status);
}

size_t area_bytes() { return kAreaPages * page_size(); }

bool overlaps(const Range &range, uintptr_t start, uintptr_t end) {
  return range.first < end && start < range.second;
}

void map_area(Area *area) {
  void *p = mmap(nullptr, area_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  area->addr = p == MAP_FAILED ? nullptr : static_cast<char *>(p);
}

// Whether a subscription that watches the memory there now overlaps [start, end).
bool watched_now(const State &s, uintptr_t start, uintptr_t end) {
  for (const auto &[range, model] : s.subscribed) {
    if (model.fresh != 0 && overlaps(range, start, end)) return true;
  }
  return false;
}

// The memory in [start, end) was replaced: no subscription made before watches it any more.
void replaced(State *s, uintptr_t start, uintptr_t end) {
  for (auto &[range, model] : s->subscribed) {
    if (overlaps(range, start, end)) model.fresh = 0;
  }
}

void subscribe(State *s) {
  Area &area = s->areas[s->in->small_below(kAreas)];
  const uint8_t shape = s->in->byte();
  char *base = area.addr != nullptr ? area.addr : reinterpret_cast<char *>(page_size());
  const size_t offset = (shape & 7) * page_size() + ((shape & 8) != 0 ? 17 : 0);
  size_t length = (1 + s->in->small_below(kAreaPages)) * page_size();
  const bool bad = (shape & 0x30) == 0x30 || (shape & 0x30) == 0x20;
  if ((shape & 0x30) == 0x30) length = 0;
  if ((shape & 0x30) == 0x20) length = SIZE_MAX - 5;  // wraps
  const int status = mrc_monitor_subscribe(s->monitor, base + offset, length);
  check_status(status, "mrc_monitor_subscribe");
  if (bad) {
    if (status != MRC_ERR_INVALID) fuzz::fail("a bad range was subscribed: %d", status);
    return;
  }
  if (status == MRC_OK) {
    const auto start = reinterpret_cast<uintptr_t>(base + offset);
    Subscribed &model = s->subscribed[{start, start + length}];
    ++model.count;
    ++model.fresh;
  }
}

void unsubscribe(State *s) {
  if (s->subscribed.empty()) {
    if (mrc_monitor_unsubscribe(s->monitor, nullptr, 0) != MRC_ERR_INVALID) {
      fuzz::fail("an empty range was unsubscribed");
    }
    return;
  }
  auto it = s->subscribed.begin();
  std::advance(it, s->in->below(static_cast<uint32_t>(s->subscribed.size())));
  const auto [start, end] = it->first;
  const int status =
      mrc_monitor_unsubscribe(s->monitor, reinterpret_cast<void *>(start), end - start);
  if (status != MRC_OK) fuzz::fail("unsubscribe of a subscribed range: %d", status);
  Subscribed &model = it->second;
  --model.count;
  if (model.fresh > model.count) model.fresh = model.count;
  if (model.count == 0) s->subscribed.erase(it);
}

// A change is owed to the runtime while a subscription overlaps it: one that the runtime
// unsubscribed, or that an earlier record of the same delivery ended (one-shot), is no longer
// its business.
void forgive_unsubscribed(State *s) {
  for (Area &area : s->areas) {
    bool subscribed = false;
    for (const auto &entry : s->subscribed) {
      subscribed = subscribed || overlaps(entry.first, area.owed_start, area.owed_end);
    }
    if (!subscribed) area.owed_start = area.owed_end = 0;
  }
}

void notify(void *arg, void *addr, size_t len) {
  auto *s = static_cast<State *>(arg);
  const auto start = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t end = len == SIZE_MAX ? UINTPTR_MAX : start + len;
  for (Area &area : s->areas) {
    if (overlaps({area.owed_start, area.owed_end}, start, end)) area.owed_start = area.owed_end = 0;
  }
  if (s->one_shot) {  // the delivery ended every subscription it overlaps, before this notify
    for (auto it = s->subscribed.begin(); it != s->subscribed.end();) {
      it = overlaps(it->first, start, end) ? s->subscribed.erase(it) : std::next(it);
    }
    forgive_unsubscribed(s);
  }
  if (s->depth > 0) return;
  ++s->depth;
  switch (s->in->small_below(6)) {
    case 0:
      if (mrc_monitor_deliver(s->monitor, nullptr) != MRC_ERR_BUSY) {
        fuzz::fail("deliver from notify was not refused");
      }
      break;
    case 1:
      if (mrc_monitor_close(s->monitor) != MRC_ERR_BUSY) fuzz::fail("close from notify");
      break;
    case 2: subscribe(s); break;
    case 3: (void)mrc_monitor_valid(s->monitor, addr, len == SIZE_MAX ? 1 : len); break;
    default: break;
  }
  --s->depth;
}

void deliver(State *s) {
  forgive_unsubscribed(s);
  size_t delivered = 0;
  check_status(mrc_monitor_deliver(s->monitor, &delivered), "mrc_monitor_deliver");
  for (int i = 0; i < kAreas; ++i) {
    if (s->areas[i].owed_end != 0) {
      fuzz::fail("area %d changed under a subscription and was not notified", i);
    }
  }
}

// Unmaps, moves or drops pages of an area under the monitor (or maps it again).
void change(State *s) {
  Area &area = s->areas[s->in->small_below(kAreas)];
  if (area.addr == nullptr) {
    map_area(&area);
    return;
  }
  const auto start = reinterpret_cast<uintptr_t>(area.addr);
  uintptr_t end = start + area_bytes();
  switch (s->in->small_below(3)) {
    case 0:
      if (munmap(area.addr, area_bytes()) != 0) return;
      break;
    case 1:
      end = start + page_size();
      if (madvise(area.addr, page_size(), MADV_DONTNEED) != 0) return;
      break;
    default: {
      void *target = mmap(nullptr, area_bytes(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (target == MAP_FAILED) return;
      void *moved =
          mremap(area.addr, area_bytes(), area_bytes(), MREMAP_MAYMOVE | MREMAP_FIXED, target);
      munmap(moved == MAP_FAILED ? target : moved, area_bytes());
      if (moved == MAP_FAILED) return;
      break;
    }
  }
  // Owed only when a subscription watched that memory; a change already owed there stays owed.
  if (area.owed_end == 0 && watched_now(*s, start, end)) {
    area.owed_start = start;
    area.owed_end = end;
  }
  if (end == start + area_bytes()) {  // unmapped or moved away: the watches went with it
    replaced(s, start, end);
    area.addr = nullptr;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::Input in(data, size);
  State state;
  state.in = &in;
  for (Area &area : state.areas) map_area(&area);

  mrc_monitor_params_t params;
  mrc_monitor_params_init(&params);
  params.notify = notify;
  params.notify_arg = &state;
  state.one_shot = in.flag();
  params.flags = state.one_shot ? MRC_MONITOR_ONE_SHOT : 0;
  const int opened = mrc_monitor_open(&params, &state.monitor);
  check_status(opened, "mrc_monitor_open");
  if (opened == MRC_ERR_UNSUPPORTED) return 0;  // no userfaultfd here: nothing to fuzz
  if (opened != MRC_OK) fuzz::fail("mrc_monitor_open: %d", opened);

  while (!in.done()) {
    switch (in.small_below(7)) {
      case 0: subscribe(&state); break;
      case 1: unsubscribe(&state); break;
      case 2: {
        const Area &area = state.areas[in.small_below(kAreas)];
        const int answer = mrc_monitor_valid(state.monitor, area.addr, in.below(3) * page_size());
        if (answer != 0 && answer != 1) fuzz::fail("mrc_monitor_valid returned %d", answer);
        break;
      }
      case 3: deliver(&state); break;
      case 4: change(&state); break;
      case 5: {
        // Room for a larger (later) layout too: its unknown tail is zeroed.
        union {
          mrc_monitor_stats_t stats;
          unsigned char bytes[sizeof(mrc_monitor_stats_t) + 8];
        } out{};
        const size_t sizes[] = {sizeof out.stats, 0, 8, sizeof out.bytes, 1u << 16};
        check_status(mrc_monitor_stats_sized(state.monitor, &out.stats, sizes[in.small_below(5)]),
                     "mrc_monitor_stats_sized");
        break;
      }
      default:
        check_status(mrc_monitor_subscribe(nullptr, state.areas[0].addr, page_size()),
                     "mrc_monitor_subscribe");
        break;
    }
  }
  deliver(&state);
  check_status(mrc_monitor_close(state.monitor), "mrc_monitor_close");
  for (Area &area : state.areas) {
    if (area.addr != nullptr) munmap(area.addr, area_bytes());
  }
  return 0;
}
