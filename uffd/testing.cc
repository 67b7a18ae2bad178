// SPDX-License-Identifier: BSD-3-Clause
// Test-only controls of the monitor (see testing.h).
//
// SYNCHRONIZATION: see internal/monitor_state.h (the registry mutex, the test control fields).
#include "uffd/testing.h"

#include <atomic>

#include "base/mutex.h"
#include "uffd/internal/monitor_state.h"
#include "uffd/internal/watch_table.h"

namespace mrc::uffd::testing {

using detail::g_monitor;
using detail::g_paused;

void set_queue_capacity(size_t records) {
  g_monitor.queue_capacity.store(records, std::memory_order_relaxed);
}
void set_vma_budget(uint64_t vmas) { g_monitor.vma_budget.store(vmas, std::memory_order_relaxed); }
void set_idle_vmas(int64_t vmas) { g_monitor.idle_vmas.store(vmas, std::memory_order_relaxed); }
void force_poll_loop(bool on) { g_monitor.force_poll.store(on, std::memory_order_relaxed); }
void set_drop_events(bool (*wanted)()) {
  detail::g_drop_events.store(wanted, std::memory_order_relaxed);
}
void set_round_trip_ticks(uint64_t ticks) {
  g_monitor.round_trip_override.store(ticks, std::memory_order_relaxed);
}
void pause_monitor(bool on) { g_paused.store(on, std::memory_order_relaxed); }
void wait_until_idle() { g_monitor.queue.wait_until_idle(); }
void fail_monitor_thread_start(int error) {
  g_monitor.thread_start_error.store(error, std::memory_order_relaxed);
}
uint64_t registrations() { return detail::g_registrations.load(std::memory_order_relaxed); }
uint64_t snapshots() { return detail::g_snapshots.load(std::memory_order_relaxed); }
void set_before_register_hook(void (*hook)(uintptr_t start, uintptr_t end)) {
  detail::g_before_register.store(hook, std::memory_order_relaxed);
}
void with_registry_locked(void (*fn)(void *arg), void *arg) {
  MutexLock hold(g_monitor.mutex);
  fn(arg);
}
int monitor_fd() {
  MutexLock hold(g_monitor.mutex);
  return g_monitor.running ? g_monitor.uffd : -1;
}
const char *monitor_loop() {
  MutexLock hold(g_monitor.mutex);
  if (!g_monitor.running) return "none";
  switch (static_cast<detail::LoopKind>(g_monitor.run.loop.load(std::memory_order_relaxed))) {
    case detail::LoopKind::NotStarted: return "not started";
    case detail::LoopKind::UringDeferred: return "io_uring+defer";
    case detail::LoopKind::Uring: return "io_uring";
    case detail::LoopKind::Poll: return "poll";
  }
  return "?";
}

}  // namespace mrc::uffd::testing
