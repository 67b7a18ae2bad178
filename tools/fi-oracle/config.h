// SPDX-License-Identifier: BSD-3-Clause
// What the driver and its two processes (sender, receiver) share: the run's configuration, the
// names of the scenarios and operations, and the message numbering both sides derive from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fi_oracle {

// How the sender changes the memory under its send buffer before a message.
enum class Scenario : uint8_t {
  kNone,      // unchanged, only stamped again: the control (must never be stale)
  kFree,      // free + malloc above the mmap threshold
  kMunmap,    // libc munmap + mmap at the same address
  kRaw,       // syscall(SYS_munmap) + syscall(SYS_mmap) at the same address
  kFixed,     // mmap(MAP_FIXED) over the live buffer
  kDontneed,  // madvise(MADV_DONTNEED): the pages are dropped, stamping faults in new ones
  kMremap,    // mremap to another place, fresh mmap at the old address
  kRace,      // one thread munmaps while the sending thread maps the address and sends at once
};
inline constexpr size_t kScenarioCount = 8;
inline constexpr const char *kScenarioNames[kScenarioCount] = {
    "none", "free", "munmap", "raw", "fixed", "dontneed", "mremap", "race"};

// How the bytes travel: a tagged send above the rendezvous threshold (the receiver RDMA-reads
// the sender's buffer through the sender's registration), an RMA write from the sender's buffer
// into a buffer the receiver registered, or an RMA read from that buffer into the sender's (the
// receiver stamps it, the sender checks what arrived).
enum class Op : uint8_t { kSend, kWrite, kRead };
inline constexpr size_t kOpCount = 3;
inline constexpr const char *kOpNames[kOpCount] = {"send", "write", "read"};

struct Config {
  std::vector<Op> ops;
  std::vector<Scenario> scenarios;
  uint64_t messages = 0;       // per (op, scenario), after one warm-up message
  uint64_t race_messages = 0;  // for Scenario::kRace, which loses its race most of the time
  size_t size = 0;             // bytes per message, a multiple of 8
  std::string send_domain, recv_domain;
  bool isolate = false;   // each scenario in its own pair of processes
  double op_timeout = 0;  // seconds, for every completion a process waits for
  uint32_t nonce = 0;     // per run, mixed into every stamp
  bool verbose = false;
};

// One message of the run: its number (from 1), operation, scenario and whether it is the
// warm-up message of its (op, scenario) block.
struct Step {
  uint64_t msg;
  Op op;
  Scenario scenario;
  bool warmup;
};

// The run's messages in order: for each scenario, for each op, a warm-up then `messages`
// (`race_messages` for kRace).
std::vector<Step> plan(const Config &config);

// Thrown for a failure that ends a process's run; `timeout` marks a wait that ran out.
struct RunError {
  std::string what;
  bool timeout = false;
};

}  // namespace fi_oracle
