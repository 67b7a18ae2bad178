// SPDX-License-Identifier: BSD-3-Clause
// Test-only controls of the monitor (tests and tools/bench; the library never includes this,
// only uffd/ defines it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mrc::uffd::testing {

// Capacity (power of two) of the queue allocated by the next start; 0 = the default (32768).
void set_queue_capacity(size_t records);
// Ceiling on VMAs added by watching; 0 = the default (vm.max_map_count / 4).
void set_vma_budget(uint64_t vmas);
// Idle watched mappings kept registered, from the next start; negative = the default (32).
void set_idle_vmas(int64_t vmas);
// Run the monitor loop on poll(2) instead of io_uring (the fallback when io_uring fails).
void force_poll_loop(bool on);
// What Monitor::round_trip_ticks() reports from now on, in place of the measured round trip (a
// host's load makes the measurement vary); 0 = the measurement again.
void set_round_trip_ticks(uint64_t ticks);
// While on, the monitor leaves events unread (their unmappers stay blocked in the kernel), and
// in MISSING mode faults unanswered (their threads wait); a stop ends the pause.
void pause_monitor(bool on);
// Returns once the monitor is between batches: every event it has read is published (a record
// appended after the kernel released the changing thread is then visible).
void wait_until_idle();
// From the next monitor start, creating the monitor thread fails with `error` (what
// pthread_create returns: EAGAIN when the process is out of threads); 0 = it is created.
void fail_monitor_thread_start(int error);
// From the next monitor start, `wanted()` (called then, under the registry mutex) decides
// whether the monitor reads and counts events but publishes none: a cache that misses every
// invalidation, for proving that an oracle catches one. nullptr = never (the default). Installed
// from MRC_TEST_DROP_EVENTS=1 by uffd/testing_env.cc, which only test programs and tools link.
void set_drop_events(bool (*wanted)());
// UFFDIO_REGISTER calls made by watch() since the process started.
uint64_t registrations();
// Snapshots of the watch table published for the lock-free watch path since the process started.
uint64_t snapshots();
// Called (under the registry mutex) between watch()'s lookup of a mapping and its
// UFFDIO_REGISTER of [start, end), where the application may change the mapping; nullptr = none.
void set_before_register_hook(void (*hook)(uintptr_t start, uintptr_t end));
// Runs fn(arg) on the calling thread while it holds the registry mutex: tests show which watch
// and unwatch calls never take it (they finish while fn waits for them).
void with_registry_locked(void (*fn)(void *arg), void *arg);
// The userfaultfd of the running monitor, -1 if none (benchmarks compare raw ioctls).
int monitor_fd();
// How the running monitor thread waits: "io_uring+defer" (single issuer, deferred task work),
// "io_uring" (kernels before 6.1), "poll" (io_uring unavailable or failed, or forced), "none"
// when no monitor runs. A subscription returns once the thread has chosen ("not started" never
// shows then).
const char *monitor_loop();

}  // namespace mrc::uffd::testing
