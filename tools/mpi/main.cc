// SPDX-License-Identifier: BSD-3-Clause
// mrcache-mpi: the cache across nodes, with remote peers as the oracle.
//
//   mpirun -np N [--host a,b] mrcache-mpi stress [--path exact|fast] [--seconds S] ...
//       every rank mutates its own buffers and exposes them through the cache; peers RDMA READ
//       and WRITE them and check stamps (stress.h)
//   mpirun -np N mrcache-mpi bench [--path exact|fast|ucx|none] [--sizes ...] [--k ...]
//       a rendezvous transfer between rank pairs, the sender (re)allocating its buffer every k
//       messages (bench.h)
//   mrcache-mpi report FILE...   medians and ratios of bench runs (no MPI)
//
// Exit status: 0 = passed; 1 = a check failed or an error (the report names it; standard output
// that could not be written too); 2 = usage.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "tools/common/cli_numbers.h"
#include "tools/common/stdout_check.h"
#include "tools/mpi/bench.h"
#include "tools/mpi/stress.h"

namespace {

int default_gid_index() {
  // scripts/rxe/vm.sh's pair mode exports the IPv4 RoCE v2 GID's index.
  const char *env = getenv("RXE_GID");
  uint64_t index = 0;
  return env != nullptr && mrc_tools::parse_unsigned(env, &index) && index < 256
             ? static_cast<int>(index)
             : -1;
}

// Runs body between MPI_Init and MPI_Finalize; an exception on any rank ends the whole job.
template <typename Body>
int with_mpi(int argc, char **argv, Body body) {
  MPI_Init(&argc, &argv);
  int status = 1;
  try {
    status = body(MPI_COMM_WORLD);
  } catch (const std::exception &e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "mrcache-mpi: rank %d: %s\n", rank, e.what());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}

// Calls take(item) for each item of a comma-separated list; an empty list leaves *out as it
// is (the defaults), else *out holds what take added. False when take refuses an item.
template <typename Take, typename Out>
bool for_each_item(const std::string &list, Take take, Out *out) {
  if (list.empty()) return true;
  out->clear();
  for (size_t start = 0; start <= list.size();) {
    const size_t end = std::min(list.find(',', start), list.size());
    if (!take(list.substr(start, end - start))) return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

int main(int argc, char **argv) {
  mrc_tools::check_stdout_at_exit("mrcache-mpi");
  CLI::App app{"mrcache-mpi: the registration cache across nodes, remote peers as the oracle"};
  app.require_subcommand(1);

  mrc_mpi::StressOptions stress;
  stress.gid_index = default_gid_index();
  CLI::App *s = app.add_subcommand("stress", "mutate buffers under the cache; peers check them");
  s->add_option("--path", stress.path,
                "exact (default), fast, ucx, none, or stale (a cache that never invalidates: the "
                "oracle's control, which must fail)")
      ->check(CLI::IsMember({"exact", "fast", "ucx", "none", "stale"}));
  s->add_option("--seconds", stress.seconds, "run this long (when --rounds is 0)")
      ->check(mrc_tools::finite_range(0, 1e6))
      ->capture_default_str();
  s->add_option("--rounds", stress.rounds, "run this many rounds (0 = by --seconds)")
      ->check(mrc_tools::unsigned_range(0, uint64_t{1} << 40));
  s->add_option("--slots", stress.slots, "buffers per rank")
      ->check(mrc_tools::unsigned_range(1, 60))
      ->capture_default_str();
  s->add_option("--mutate", stress.mutate, "probability that a buffer's memory changes per round")
      ->check(mrc_tools::finite_range(0, 1))
      ->capture_default_str();
  s->add_option("--probe-every", stress.probe_every,
                "rounds between dead-key probes (0: at the end only)")
      ->check(mrc_tools::unsigned_range(0, 1000000))
      ->capture_default_str();
  s->add_option("--probes", stress.probes,
                "deregistered keys tried per probe (0: none; each try ends in a remote access "
                "error)")
      ->check(mrc_tools::unsigned_range(0, 8))
      ->capture_default_str();
  std::string mutations = "all";
  s->add_option("--mutations", mutations,
                "kinds of mutation, comma-separated: replace, map-fixed, madvise, remap, shrink, "
                "fork (default all)");
  s->add_option("--seed", stress.seed, "random seed")
      ->check(mrc_tools::unsigned_range(0, UINT64_MAX));
  s->add_option("--device", stress.device, "RDMA device (default: the first)");
  s->add_option("--gid-index", stress.gid_index, "GID index (default: $RXE_GID, else the port's)")
      ->check(CLI::Range(0, 255));

  mrc_mpi::BenchOptions bench;
  bench.gid_index = default_gid_index();
  std::string ks;
  CLI::App *b = app.add_subcommand("bench", "rendezvous transfers through one registration path");
  b->add_option("--path", bench.path, "exact (default), fast, ucx or none")
      ->check(CLI::IsMember({"exact", "fast", "ucx", "none"}));
  std::string sizes;
  b->add_option("--sizes", sizes, "message sizes, comma-separated (bytes; k, m, g suffixes)")
      ->default_str("4k,64k,1m,4m");
  b->add_option("--k", ks, "reallocate the buffer every k messages, comma-separated; inf = never")
      ->default_str("1,16,inf");
  b->add_option("--messages", bench.messages, "messages per size and k, at most")
      ->check(mrc_tools::unsigned_range(8, 1000000))
      ->capture_default_str();
  b->add_option("--max-bytes", bench.max_bytes, "bytes per size and k, at most")
      ->transform(mrc_tools::byte_size(1, uint64_t{1} << 40));
  b->add_option("--rep", bench.repetition, "repetition number, recorded with the results")
      ->check(mrc_tools::unsigned_range(0, 1000000));
  b->add_option("--json", bench.json, "append the results as JSON lines to this file");
  b->add_option("--device", bench.device, "RDMA device (default: the first)");
  b->add_option("--gid-index", bench.gid_index, "GID index (default: $RXE_GID, else the port's)")
      ->check(CLI::Range(0, 255));

  std::vector<std::string> files;
  CLI::App *r = app.add_subcommand("report", "medians and ratios of bench output (no MPI)");
  r->add_option("files", files, "bench output or --json files")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!mrc_mpi::parse_mutations(mutations, &stress.mutations)) {
    fprintf(stderr,
            "mrcache-mpi stress: --mutations: want all, or some of replace, map-fixed, "
            "madvise, remap, shrink, fork\n");
    return 2;
  }
  if (!for_each_item(
          sizes,
          [&](const std::string &item) {
            std::string bytes = item;
            if (!mrc_tools::byte_size(8, uint64_t{16} << 20)(bytes).empty()) return false;
            bench.sizes.push_back(std::stoull(bytes));
            return true;
          },
          &bench.sizes)) {
    fprintf(stderr, "mrcache-mpi bench: --sizes: want byte counts from 8 to 16m, e.g. 4k,1m\n");
    return 2;
  }
  if (!for_each_item(
          ks,
          [&](const std::string &item) {
            uint64_t every = 0;
            if (item != "inf" && (!mrc_tools::parse_unsigned(item, &every) || every == 0))
              return false;
            bench.reallocate_every.push_back(every);
            return true;
          },
          &bench.reallocate_every)) {
    fprintf(stderr, "mrcache-mpi bench: --k: want counts >= 1 or inf, e.g. 1,16,inf\n");
    return 2;
  }
  if (r->parsed()) return mrc_mpi::run_report(files);
  if (s->parsed())
    return with_mpi(argc, argv, [&](MPI_Comm c) { return mrc_mpi::run_stress(stress, c); });
  return with_mpi(argc, argv, [&](MPI_Comm c) { return mrc_mpi::run_bench(bench, c); });
}
