// SPDX-License-Identifier: BSD-3-Clause
// mrcache-stress's command line.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace stress {

// What a mutator thread does to a mapping of the pool (or to the cache, or the process).
enum class MutationKind : int {
  kRemap,      // munmap the mapping, mmap a new one (often at the same address)
  kMove,       // mremap to another address (MREMAP_FIXED onto a reservation)
  kShrink,     // mremap to fewer pages, in place
  kGrow,       // mremap to more pages (MREMAP_MAYMOVE); private mappings only
  kUnmapTail,  // munmap the last pages
  kDontneed,   // madvise(MADV_DONTNEED) over part of it
  kFree,       // madvise(MADV_FREE) (private) or MADV_REMOVE (shared) over part of it
  kFixed,      // mmap(MAP_FIXED) a fresh anonymous mapping over part of it
  kPurge,      // mrc_cache_purge
  kFork,       // fork: the child runs its own cache (with brk mutations) and exits
  kCount
};
constexpr int kMutationKinds = static_cast<int>(MutationKind::kCount);
const char *mutation_name(MutationKind kind);

enum class Backend { kIouring, kNull, kVerbs };
enum class OracleKind { kAuto, kIouring, kPfn, kRdma, kNone };
const char *backend_name(Backend backend);
const char *oracle_name(OracleKind oracle);

struct Options {
  unsigned threads = 4;
  unsigned mutators = 2;
  // Threads that each map a fresh mapping, get/check/put it and unmap it, over and over: the
  // kernel hands one's freed address to another's mmap while the unmap is still in flight.
  unsigned churn = 2;
  unsigned hot_threads = 2;
  uint64_t churn_size = 64u << 10;
  double duration_s = 30;
  Backend backend = Backend::kIouring;
  OracleKind oracle = OracleKind::kAuto;
  uint64_t min_size = 4096;
  uint64_t max_size = 16u << 20;
  bool max_size_given = false;
  unsigned slots = 32;
  double shared_fraction = 0.25;
  // Relative weights of the mutations (kFork is driven by fork_rate instead).
  std::array<double, kMutationKinds> mix{};
  std::string mix_text;
  double fork_rate = 0.5;  // forks per second, all mutators together
  double invalidate_rate = 0.01;
  double nest_rate = 0.2;
  double hot_rate = 0.1;
  unsigned check_pages = 4;
  unsigned mutate_pause_us = 200;
  uint64_t seed = 0;
  bool seed_given = false;
  std::optional<uint64_t> max_regions, max_bytes, max_unreleased;
  double fail_rate = 0;
  std::string json_path;
  bool quiet = false;
  bool keep_going = false;
  bool verify_mappings = false;
  // Fast mode (MRC_FLAG_ORDERED_UNMAPS) on every cache the run creates; nullopt: as the
  // environment says (MRC_ORDERED_UNMAPS), which by default is exact mode.
  std::optional<bool> fast;
  bool strict_unmap_window = false;  // fast mode: count in-window hits as stale too
  double progress_interval_s = 0;    // 0 = 0.5 s on a terminal, 10 s otherwise
  std::string rdma_device;
  int gid_index = 0;
};

// Parses argv. On --help or a usage error it prints and returns the exit code to use
// (0 for --help, 2 for errors); otherwise returns nullopt and fills *options.
std::optional<int> parse_options(int argc, char **argv, Options *options);

// "remap=4,move=2": the mutation weights; throws std::invalid_argument on a bad list.
void parse_mix(const std::string &text, std::array<double, kMutationKinds> *mix);

}  // namespace stress
