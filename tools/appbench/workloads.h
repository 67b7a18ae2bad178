// SPDX-License-Identifier: BSD-3-Clause
// The application workloads: what a runtime's user does between registrations (allocate, touch,
// pack, free), with the registration path the trial chose in the middle of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/appbench/paths.h"

namespace appbench {

struct TimingConfig {
  double min_seconds = 0.25;  // timed part of a trial (after a warm-up of a tenth of it)
  uint64_t min_ops = 8;
  uint64_t seed = 1;
};

struct Timing {
  uint64_t ops = 0;
  double seconds = 0;
  double ns_per_op() const { return ops == 0 ? 0 : seconds * 1e9 / static_cast<double>(ops); }
};

// Where the workload's buffers come from.
enum class Allocation {
  kMalloc,          // glibc's malloc with its defaults: large buffers start as mappings, then
                    // come from the heap once a free has moved the mmap threshold up
  kMallocOneArena,  // the same with M_ARENA_MAX 1: every thread allocates from the main arena
  kMappings,        // every buffer a new mapping (mmap/munmap, what glibc does above its mmap
                    // threshold, and for every buffer above 32 MiB); not malloc with a fixed
                    // M_MMAP_THRESHOLD, which still serves from the heap's free top when it can,
                    // so whether a buffer is a new mapping would depend on each path's own use
                    // of the heap
};

struct Workload {
  std::string name;   // e.g. "fresh-mmap/1M"
  std::string about;  // one line for --list and the report
  Allocation allocation = Allocation::kMalloc;
  // Runs the workload on `path` (created after configure_allocator) for the configured time and
  // returns the timed messages (or steps).
  Timing (*run)(const Workload &, Path &, const TimingConfig &) = nullptr;
  size_t size = 0;     // buffer bytes
  size_t count = 0;    // pool buffers, halo faces
  unsigned every = 0;  // halo: re-allocate the faces every `every` steps
};

const std::vector<Workload> &workloads();
const Workload *find_workload(const std::string &name);
// The allocator set-up the workload needs, done first, as an application's main() does.
void configure_allocator(Allocation allocation);

}  // namespace appbench
