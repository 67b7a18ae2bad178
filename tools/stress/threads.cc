// SPDX-License-Identifier: BSD-3-Clause
// The threads of a run (threads.h), and the checks and reports they share.
#include "tools/stress/threads.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/stress/fork_child.h"

namespace stress {
namespace {

constexpr size_t kMaxWindowReports = 3;
constexpr int kHotRepeats = 16;  // more than the cache's kPromoteAfter hits
// Hot threads: gets of a hot page in a row (more than kPromoteAfter), and the slots they cycle
// through (more than a parking line's four).
constexpr int kHotRun = 10;
constexpr size_t kHotSlots = 6;

// REQUIRES: the slot's lock is held (its history is stable).
std::string stale_report(Run &run, unsigned worker, const Slot &slot, uintptr_t start, size_t len,
                         unsigned prot, mrc_region_t *region, const CheckResult &result) {
  const auto region_start = reinterpret_cast<uintptr_t>(mrc_region_start(region));
  const size_t region_len = mrc_region_length(region);
  char head[256];
  std::snprintf(head, sizeof head,
                "STALE REGISTRATION: worker %u at t=%.3fs, seed %llu (backend %s, oracle %s, "
                "monitor %s)\n",
                worker, run.elapsed_s(), static_cast<unsigned long long>(run.seed),
                backend_name(run.opt.backend), run.oracle->name(), run.monitor_mode.c_str());
  std::string text = head;
  text += "  request  " + range_text(start, len) + " prot " + prot_name(prot) + " in slot " +
          std::to_string(slot.index) + " (mapping " + range_text(slot.start, slot.len) +
          (slot.shared ? " shared" : " private") + ")\n";
  text += "  region   " + range_text(region_start, region_len) + " key " +
          std::to_string(mrc_region_key(region)) + " prot " + prot_name(mrc_region_prot(region)) +
          "\n";
  if (const auto info = run.backend->instrumented().lookup(mrc_region_handle(region))) {
    char made[160];
    std::snprintf(made, sizeof made, "  made     t=%.3fms by %s %d while it held slot %d\n",
                  static_cast<double>(info->time_ns) / 1e6, info->worker >= 0 ? "worker" : "thread",
                  info->worker, info->slot);
    text += made;
  }
  char address[64];
  std::snprintf(address, sizeof address,
                "  address  %#lx: ", static_cast<unsigned long>(result.address));
  text += address + result.detail + "\n";
  text += "  slot " + std::to_string(slot.index) + " history (oldest first, times since start):\n";
  for (const Mutation &m : run.pool->history(slot)) text += "    " + describe(m) + "\n";
  text += "  every recent mutation that touched the region:\n";
  for (const Mutation &m : run.pool->overlapping(region_start, region_len, 24)) {
    text += "    " + describe(m) + "\n";
  }
  text += "  replay: mrcache-stress --seed " + std::to_string(run.seed) + " --backend " +
          backend_name(run.opt.backend) +
          " (schedules differ between runs; the seed fixes "
          "every random choice)\n";
  return text;
}

// ---- workers -------------------------------------------------------------------------------

// Gets [start, start+len) and checks that the region covers it; counts the operation, its
// latency (from *began) and any error. Returns nullptr on failure (nothing held).
mrc_region_t *acquire(Run &run, ThreadCounters &c, uintptr_t start, size_t len, unsigned prot,
                      uint64_t *began) {
  mrc_region_t *region = nullptr;
  *began = now_ns();
  const mrc_status_t status =
      mrc_get(run.cache, reinterpret_cast<void *>(start), len, prot, &region);
  c.add_latency(now_ns() - *began);
  c.ops.fetch_add(1, std::memory_order_relaxed);
  if (status != MRC_OK) {
    if (status == MRC_ERR_BACKEND && run.injecting) {
      c.injected.fetch_add(1, std::memory_order_relaxed);
    } else {
      c.errors.fetch_add(1, std::memory_order_relaxed);
      add_error(run, "mrc_get(" + range_text(start, len) + ", " + prot_name(prot) + ") = " +
                         mrc_status_string(status) + " (" + mrc_backend_last_error() + ")");
    }
    return nullptr;
  }
  const auto region_start = reinterpret_cast<uintptr_t>(mrc_region_start(region));
  const size_t region_len = mrc_region_length(region);
  if (region_start > start || start + len > region_start + region_len ||
      (mrc_region_prot(region) & prot) != prot) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "mrc_get(" + range_text(start, len) + ", " + prot_name(prot) +
                       ") returned region " + range_text(region_start, region_len) + " " +
                       prot_name(mrc_region_prot(region)) + ", which does not cover it");
    mrc_put(run.cache, region);
    return nullptr;
  }
  return region;
}

// Counts what the oracle found for a region of `slot` got at t0_ns (now_ns) and reports a
// stale one. REQUIRES: the slot's lock is held shared since before the get (generation read
// then).
void judge(Run &run, ThreadCounters &c, unsigned index, const Slot &slot, uint64_t generation,
           uintptr_t start, size_t len, unsigned prot, mrc_region_t *region,
           const CheckResult &result, uint64_t t0_ns) {
  c.pages.fetch_add(result.pages, std::memory_order_relaxed);
  switch (result.kind) {
    case CheckResult::kOk: c.checked.fetch_add(1, std::memory_order_relaxed); return;
    case CheckResult::kUnchecked: c.unchecked.fetch_add(1, std::memory_order_relaxed); return;
    case CheckResult::kError:
      c.errors.fetch_add(1, std::memory_order_relaxed);
      add_error(run, "oracle: " + result.detail);
      return;
    case CheckResult::kStale: break;
  }
  if (slot.generation.load(std::memory_order_relaxed) != generation) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "harness: slot " + std::to_string(slot.index) +
                       " changed during a check (locking bug); mismatch not counted");
    return;
  }
  // Was the page being unmapped for another slot (by a mutator or a churn thread) when this get
  // began? Then the kernel had handed its addresses to this slot's mapping before the unmapping
  // thread's event reached the monitor: exact mode must have waited for that unmap, fast mode
  // need not have.
  const std::string window =
      run.pool->in_flight(page_down(result.address), page_size(), t0_ns - run.start_ns);
  const bool counted = window.empty() || run.window_counted;
  if (!window.empty()) c.stale_window.fetch_add(1, std::memory_order_relaxed);
  if (counted) c.stale.fetch_add(1, std::memory_order_relaxed);
  std::string report = stale_report(run, index, slot, start, len, prot, region, result);
  if (!window.empty()) {
    report += "  window   when this get began, " + window +
              ": that thread's unmap had not returned, yet the kernel had already given the "
              "address to this slot's new mapping (userfaultfd reports an unmap only after the "
              "address range is free). ";
    if (!run.fast) {
      report +=
          "Exact mode: the get's probe of the kernel's unmaps in flight must have made it wait "
          "for that unmap; counted as stale\n";
    } else if (counted) {
      report += "Fast mode does not promise this; counted (--strict-unmap-window)\n";
    } else {
      report +=
          "Fast mode (MRC_FLAG_ORDERED_UNMAPS) promises only unmaps that happen-before the "
          "get; not counted as stale (--strict-unmap-window counts it)\n";
    }
  }
  std::lock_guard lock(run.report_mutex);
  // Tolerated hits have their own few reports: fast mode may see many, and they must not use
  // up the room of a stale one that counts.
  std::vector<std::string> &reports = counted ? run.stale_reports : run.window_reports;
  if (reports.size() < (counted ? kMaxReports : kMaxWindowReports)) {
    reports.push_back(report);
    run.out->line(report, true);
  }
  if (!run.opt.keep_going && counted) run.stop.store(true, std::memory_order_relaxed);
}

}  // namespace

void worker(Run &run, unsigned index) {
  ThreadCounters &c = *run.counters[index];
  Rng rng(mix64(run.seed ^ (0x1000 + index)));
  std::string error;
  std::unique_ptr<OracleThread> oracle = run.oracle->thread(index, &error);
  if (oracle == nullptr) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "worker " + std::to_string(index) + ": oracle set-up failed: " + error);
    return;
  }
  static constexpr unsigned kProts[] = {MRC_PROT_READ, MRC_PROT_WRITE,
                                        MRC_PROT_READ | MRC_PROT_WRITE};
  struct Held {
    mrc_region_t *region;
  };
  while (!run.stop.load(std::memory_order_relaxed)) {
    Slot &slot = run.pool->slot(rng.below(run.pool->size()));
    // Scoped: an exception (std::bad_alloc under RLIMIT_AS, see guarded()) must not leave the
    // slot locked for the mutators.
    std::shared_lock slot_guard(slot.lock);
    Instrumented::set_thread_context(static_cast<int>(index), slot.index);
    if (slot.start == 0) continue;
    const uint64_t generation = slot.generation.load(std::memory_order_relaxed);
    const int wanted = rng.chance(run.opt.nest_rate) ? 2 + static_cast<int>(rng.below(3)) : 1;
    Held held[4];
    int count = 0;
    for (int k = 0; k < wanted; ++k) {
      const uint64_t longest = std::min<uint64_t>(run.opt.max_size, slot.len);
      size_t len = rng.log_uniform(std::min<uint64_t>(run.opt.min_size, longest), longest);
      uintptr_t offset = rng.below(slot.len - len + 1);
      if (rng.chance(0.75)) {  // mostly page-aligned, like most real buffers
        offset = page_down(offset);
        len = std::min<size_t>(page_up(len), slot.len - offset);
      }
      const uintptr_t start = slot.start + offset;
      const unsigned prot = kProts[rng.below(3)];
      uint64_t t0 = 0;
      mrc_region_t *region = acquire(run, c, start, len, prot, &t0);
      if (region != nullptr && wanted == 1 && rng.chance(run.opt.hot_rate)) {
        // A hot range: used again and again, its region parks its references in this thread
        // (core/cache/cache.h); the check below then sees a region taken back from the line.
        for (int repeat = 0; repeat < kHotRepeats && region != nullptr; ++repeat) {
          mrc_put(run.cache, region);
          region = acquire(run, c, start, len, prot, &t0);
        }
        c.hot.fetch_add(1, std::memory_order_relaxed);
      }
      if (region == nullptr) continue;
      held[count++].region = region;
      const CheckResult result = oracle->check(region, start, len, rng);
      judge(run, c, index, slot, generation, start, len, prot, region, result, t0);
    }
    if (count > 1) c.nested.fetch_add(1, std::memory_order_relaxed);
    if (count > 0 && rng.chance(run.opt.invalidate_rate)) {
      mrc_region_t *victim = held[rng.below(static_cast<uint64_t>(count))].region;
      const mrc_status_t status = mrc_invalidate(run.cache, victim, &on_invalidated, &run);
      if (status == MRC_OK) {
        c.invalidates.fetch_add(1, std::memory_order_relaxed);
      } else {
        c.errors.fetch_add(1, std::memory_order_relaxed);
        add_error(run, std::string("mrc_invalidate = ") + mrc_status_string(status));
      }
    }
    for (int k = count - 1; k >= 0; --k) mrc_put(run.cache, held[k].region);
  }
}

// ---- churn threads ---------------------------------------------------------------------------

void churner(Run &run, unsigned index) {
  const unsigned id = run.opt.threads + index;  // its oracle lane and its number in reports
  ThreadCounters &c = *run.counters[run.opt.threads + run.opt.mutators + index];
  Rng rng(mix64(run.seed ^ (0x3000 + index)));
  std::string error;
  std::unique_ptr<OracleThread> oracle = run.oracle->thread(id, &error);
  if (oracle == nullptr) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "churn thread " + std::to_string(index) + ": oracle set-up failed: " + error);
    return;
  }
  static constexpr unsigned kProts[] = {MRC_PROT_READ, MRC_PROT_WRITE,
                                        MRC_PROT_READ | MRC_PROT_WRITE};
  Slot &slot = run.pool->private_slot(index);
  while (!run.stop.load(std::memory_order_relaxed)) {
    std::unique_lock remap_guard(slot.lock);
    const Mutation m = run.pool->mutate(slot, MutationKind::kRemap, rng);
    remap_guard.unlock();
    if (m.error != 0) {
      c.refused[static_cast<size_t>(MutationKind::kRemap)].fetch_add(1, std::memory_order_relaxed);
    }
    std::shared_lock use_guard(slot.lock);
    Instrumented::set_thread_context(static_cast<int>(id), slot.index);
    if (slot.start != 0) {
      const uint64_t generation = slot.generation.load(std::memory_order_relaxed);
      const unsigned prot = kProts[rng.below(3)];
      uint64_t t0 = 0;
      if (mrc_region_t *region = acquire(run, c, slot.start, slot.len, prot, &t0)) {
        const CheckResult result = oracle->check(region, slot.start, slot.len, rng);
        judge(run, c, id, slot, generation, slot.start, slot.len, prot, region, result, t0);
        mrc_put(run.cache, region);
        c.churned.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
}

// ---- hot threads ---------------------------------------------------------------------------

void hot_thread(Run &run, unsigned index) {
  const unsigned id = run.opt.threads + run.opt.churn + index;  // oracle lane, number in reports
  ThreadCounters &c = *run.counters[run.opt.threads + run.opt.mutators + run.opt.churn + index];
  Rng rng(mix64(run.seed ^ (0x4000 + index)));
  std::string error;
  std::unique_ptr<OracleThread> oracle = run.oracle->thread(id, &error);
  if (oracle == nullptr) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    add_error(run, "hot thread " + std::to_string(index) + ": oracle set-up failed: " + error);
    return;
  }
  constexpr unsigned kProt = MRC_PROT_READ | MRC_PROT_WRITE;
  const size_t slots = std::min<size_t>(kHotSlots, run.pool->size());
  for (size_t turn = index; !run.stop.load(std::memory_order_relaxed); ++turn) {
    Slot &slot = run.pool->slot(turn % slots);
    std::shared_lock slot_guard(slot.lock);
    Instrumented::set_thread_context(static_cast<int>(id), slot.index);
    if (slot.start == 0) continue;
    const uint64_t generation = slot.generation.load(std::memory_order_relaxed);
    const size_t len = std::min<size_t>(page_size(), slot.len);
    uint64_t t0 = 0;
    mrc_region_t *region = acquire(run, c, slot.start, len, kProt, &t0);
    for (int hit = 1; hit < kHotRun && region != nullptr; ++hit) {
      mrc_put(run.cache, region);
      region = acquire(run, c, slot.start, len, kProt, &t0);
    }
    if (region == nullptr) continue;
    const CheckResult result = oracle->check(region, slot.start, len, rng);
    judge(run, c, id, slot, generation, slot.start, len, kProt, region, result, t0);
    mrc_put(run.cache, region);
    c.hot.fetch_add(1, std::memory_order_relaxed);
  }
}

// ---- mutators ------------------------------------------------------------------------------

namespace {

bool fork_due(Run &run, Rng &rng) {
  if (run.opt.fork_rate <= 0) return false;
  uint64_t next = run.next_fork_ns.load(std::memory_order_relaxed);
  const uint64_t now = now_ns();
  if (now < next) return false;
  const auto interval = static_cast<uint64_t>(1e9 / run.opt.fork_rate * (0.5 + rng.uniform()));
  return run.next_fork_ns.compare_exchange_strong(next, now + interval, std::memory_order_relaxed);
}

}  // namespace

void mutator(Run &run, unsigned index) {
  ThreadCounters &c = *run.counters[run.opt.threads + index];
  Rng rng(mix64(run.seed ^ (0x2000 + index)));
  double total = 0;
  for (double w : run.opt.mix) total += w;
  while (!run.stop.load(std::memory_order_relaxed)) {
    if (fork_due(run, rng)) {
      do_fork(run, c);
      continue;
    }
    if (total <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    double pick = rng.uniform() * total;
    int kind = 0;
    while (kind < kMutationKinds - 1 && pick >= run.opt.mix[static_cast<size_t>(kind)]) {
      pick -= run.opt.mix[static_cast<size_t>(kind)];
      ++kind;
    }
    const auto chosen = static_cast<MutationKind>(kind);
    if (chosen == MutationKind::kPurge) {
      const mrc_status_t status = mrc_cache_purge(run.cache);
      c.mutations[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
      if (status != MRC_OK) {
        c.errors.fetch_add(1, std::memory_order_relaxed);
        add_error(run, std::string("mrc_cache_purge = ") + mrc_status_string(status));
      }
    } else {
      Slot &slot = run.pool->slot(rng.below(run.pool->size()));
      std::unique_lock slot_guard(slot.lock);
      const Mutation m = run.pool->mutate(slot, chosen, rng);
      if (run.opt.verify_mappings) {
        const std::string wrong = Pool::check_mapped(slot);
        if (!wrong.empty()) {
          c.errors.fetch_add(1, std::memory_order_relaxed);
          std::string history;
          for (const Mutation &h : run.pool->history(slot)) history += "\n    " + describe(h);
          add_error(run, "harness: after " + describe(m) + ": " + wrong + history);
          run.stop.store(true, std::memory_order_relaxed);
        }
      }
      slot_guard.unlock();
      c.mutations[static_cast<size_t>(m.kind)].fetch_add(1, std::memory_order_relaxed);
      if (m.error != 0)
        c.refused[static_cast<size_t>(m.kind)].fetch_add(1, std::memory_order_relaxed);
    }
    if (run.opt.mutate_pause_us != 0) {
      const auto pause =
          static_cast<long>(run.opt.mutate_pause_us / 2 + rng.below(run.opt.mutate_pause_us + 1));
      std::this_thread::sleep_for(std::chrono::microseconds(pause));
    }
  }
}

}  // namespace stress
