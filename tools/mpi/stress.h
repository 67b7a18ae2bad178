// SPDX-License-Identifier: BSD-3-Clause
// mrcache-mpi stress: every rank changes the memory under its own buffers (free and allocate
// again, mmap MAP_FIXED over them, madvise, mremap, fork) and exposes them through the cache;
// a peer on another rank (another node, or its own) then RDMA READs them, checking the stamps
// the owner wrote, and RDMA WRITEs its own stamps, which the owner checks in its memory. A
// registration that no longer maps the owner's memory shows up as a wrong stamp on one side or
// the other. Now and then a peer also tries keys the owner has deregistered: each must fail.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace mrc_mpi {

struct StressOptions {
  std::string path = "exact";  // exact, fast, ucx, none, stale (paths.h)
  std::string device;          // "" = the first RDMA device
  int gid_index = -1;          // < 0: the port's default (fabric.h)
  uint64_t rounds = 0;         // 0 = until `seconds`
  double seconds = 30;
  unsigned slots = 8;        // buffers per rank
  double mutate = 0.35;      // probability that a slot's memory changes in a round
  unsigned probe_every = 8;  // rounds between dead-key probes (0 = only at the end)
  unsigned probes = 4;       // keys per probe (0 = none)
  unsigned mutations = ~0U;  // a bit per kind of mutation, in parse_mutations' order
  uint64_t seed = 1;
};

// "all", or kinds of mutation separated by commas: replace, map-fixed, madvise, remap, shrink,
// fork. False for an unknown kind or an empty list.
bool parse_mutations(const std::string &list, unsigned *mask);

// Collective over comm. Rank 0 prints the report. Returns the exit status: 0 when no stale
// read or write, error, leak or key valid after its deregistration was seen on any rank.
int run_stress(const StressOptions &options, MPI_Comm comm);

}  // namespace mrc_mpi
