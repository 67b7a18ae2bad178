// SPDX-License-Identifier: BSD-3-Clause
// mrcache-mpi bench: what a runtime's rendezvous protocol does for every large message. The
// sender (even ranks) (re)allocates its buffer every k messages, fills it, registers it
// through one path, and sends its address and key; the receiver (the next rank) RDMA READs it
// into a buffer registered once, checks it, and answers; the sender then releases the
// registration. Time per message, split into registration (get + put) and transfer.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mrc_mpi {

struct BenchOptions {
  std::string path = "exact";  // exact, fast, ucx, none (paths.h)
  std::string device;
  int gid_index = -1;
  std::vector<uint64_t> sizes = {4096, 65536, 1 << 20, 4 << 20};
  std::vector<uint64_t> reallocate_every = {1, 16, 0};  // k; 0 = never
  uint64_t messages = 64;                               // per size and k, at most
  uint64_t max_bytes = 64ULL << 20;                     // per size and k, at most
  unsigned repetition = 0;                              // recorded with the results
  std::string json;                                     // append JSON lines here too
};

// Collective over comm (an even number of ranks). Rank 0 prints one line per size and k and
// `MRCMPI-BENCH {json}` lines. Returns the exit status (non-zero on a failed check).
int run_bench(const BenchOptions &options, MPI_Comm comm);

// mrcache-mpi report: the medians of the MRCMPI-BENCH lines in `files` (bench output or its
// --json files), one row per size and k, a column per path and the ratios. Exit status.
int run_report(const std::vector<std::string> &files);

}  // namespace mrc_mpi
