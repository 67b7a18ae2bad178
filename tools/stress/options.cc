// SPDX-License-Identifier: BSD-3-Clause
#include "tools/stress/options.h"

#include "tools/common/cli_numbers.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

namespace stress {

using mrc_tools::byte_size;
using mrc_tools::finite_range;
using mrc_tools::unsigned_range;

namespace {

constexpr const char *kMutationNames[] = {"remap",    "move", "shrink", "grow",  "unmap-tail",
                                          "dontneed", "free", "fixed",  "purge", "fork"};
static_assert(sizeof kMutationNames / sizeof kMutationNames[0] == kMutationKinds);

constexpr const char *kDefaultMix =
    "remap=4,move=2,shrink=2,grow=2,unmap-tail=1,dontneed=3,"
    "free=2,fixed=2,purge=0.05";

constexpr const char *kDescription =
    "mrcache-stress: proves that the registration cache never hands out a stale registration.\n"
    "\n"
    "Worker threads get and put random ranges (a page to --max-size) of a pool of mappings\n"
    "while mutator threads munmap+mmap, mremap (move, shrink, grow), madvise (DONTNEED, FREE),\n"
    "MAP_FIXED-replace those mappings and now and then fork (the child runs a cache of its\n"
    "own, with brk mutations, and exits with a status the parent checks), churn threads\n"
    "map, use and unmap fresh mappings of their own, so that the kernel hands the address one\n"
    "of them is still unmapping to another's mmap, and hot threads use the first page of six\n"
    "mappings ten times in a row each, so that those regions park in their lines while the\n"
    "mutators change them. Every region the cache hands out is checked by an oracle before use:\n"
    "  iouring  a fresh stamp is written into the memory and IORING_OP_WRITE_FIXED through the\n"
    "           region's buffer index must write exactly that stamp into a file (a stale\n"
    "           registration pins the old pages and writes old bytes);\n"
    "  pfn      (--backend null, root) the page frames recorded at registration must be the\n"
    "           frames mapped now (/proc/self/pagemap);\n"
    "  rdma     (--backend verbs) an RDMA READ through a loopback RC QP must return the bytes\n"
    "           in memory now.\n"
    "At the end every registration must be deregistered, and pinned/locked memory, open files\n"
    "and threads must be back to where they started.\n"
    "\n"
    "Modes: exact (the default) runs the caches as mrcache ships them, and a stale hit counts\n"
    "whenever it happened, also while another thread's unmap of the address was in flight\n"
    "(such hits are reported as in-window too). --fast runs them with MRC_FLAG_ORDERED_UNMAPS,\n"
    "which promises exactness only for unmaps that happen-before the get: in-window hits are\n"
    "then reported and not counted (--strict-unmap-window counts them).\n"
    "\n"
    "Exit status: 0 = no stale use, no leak, no error (failures injected by --fail-rate are\n"
    "expected and do not count as errors); 1 = the run failed; 2 = bad usage or set-up\n"
    "(standard output that cannot be written included).\n";

constexpr const char *kFooter =
    "\nExamples:\n"
    "  mrcache-stress                          30 s with the defaults (io_uring oracle)\n"
    "  mrcache-stress -d 10m --json run.json   ten minutes, summary written as JSON\n"
    "  mrcache-stress --fail-rate 0.1          10% of registrations fail: counted, not fatal\n"
    "  mrcache-stress --fast -d 20             fast mode: how often its window shows here\n"
    "  mrcache-stress --backend null           PFN oracle (needs root for /proc/self/pagemap)\n"
    "  mrcache-stress --seed 42 -t 1 -m 1      replay a seed (one worker, one mutator: the\n"
    "                                          closest to a repeatable schedule)\n"
    "\nThe cache also reads its MRC_* environment variables (see mrcache-info); the options\n"
    "--max-regions, --max-bytes, --max-unreleased, --fast and --exact override them.\n";

// The largest range or mapping --min-size and --max-size take (a syntax limit: whether the
// machine can map that much is found at set-up, which fails with exit 2 and the reason).
constexpr uint64_t kMaxRangeBytes = uint64_t{16} << 30;
// io_uring refuses a fixed buffer above 1 GiB (the kernel's limit): every get of a longer range
// would fail, and the run with it.
constexpr uint64_t kMaxIouringBytes = uint64_t{1} << 30;
// Cache limits: beyond these they are as good as unlimited.
constexpr uint64_t kMaxLimitBytes = uint64_t{1} << 50;
constexpr uint64_t kMaxRegionsLimit = uint64_t{1} << 40;
// A weight of --mix: bounded so that the weights' sum stays finite and exact enough.
constexpr double kMaxMixWeight = 1e6;

}  // namespace

const char *mutation_name(MutationKind kind) {
  const int index = static_cast<int>(kind);
  return index >= 0 && index < kMutationKinds ? kMutationNames[index] : "?";
}

const char *backend_name(Backend backend) {
  switch (backend) {
    case Backend::kIouring: return "iouring";
    case Backend::kNull: return "null";
    case Backend::kVerbs: return "verbs";
  }
  return "?";
}

const char *oracle_name(OracleKind oracle) {
  switch (oracle) {
    case OracleKind::kAuto: return "auto";
    case OracleKind::kIouring: return "iouring";
    case OracleKind::kPfn: return "pfn";
    case OracleKind::kRdma: return "rdma";
    case OracleKind::kNone: return "none";
  }
  return "?";
}

void parse_mix(const std::string &text, std::array<double, kMutationKinds> *mix) {
  mix->fill(0);
  // An empty list, or an empty item ("remap=1,,move=2", a trailing comma), is a typing slip: it
  // used to leave those weights 0 and the run went on without the mutations meant.
  if (text.empty()) {
    throw std::invalid_argument("the list is empty (want name=weight,...; see --help)");
  }
  if (text.front() == ',' || text.back() == ',' || text.find(",,") != std::string::npos) {
    throw std::invalid_argument("empty item in '" + text + "'");
  }
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const auto eq = item.find('=');
    const std::string name = item.substr(0, eq);
    double weight = 1;
    if (eq != std::string::npos) {
      try {
        size_t used = 0;
        weight = std::stod(item.substr(eq + 1), &used);
        if (used != item.size() - eq - 1) throw std::invalid_argument("trailing characters");
      } catch (const std::exception &) {
        throw std::invalid_argument("bad weight in '" + item + "'");
      }
    }
    // NaN and infinities too: an infinite weight made every other mutation's share 0 (and its
    // own NaN), so the run silently did none of them.
    if (!std::isfinite(weight) || weight < 0 || weight > kMaxMixWeight) {
      throw std::invalid_argument("weight in '" + item + "' is not a finite number in [0, 1e6]");
    }
    int found = -1;
    for (int i = 0; i < kMutationKinds; ++i) {
      if (name == kMutationNames[i]) found = i;
    }
    if (found < 0 || found == static_cast<int>(MutationKind::kFork)) {
      throw std::invalid_argument("unknown mutation '" + name +
                                  "' (known: remap, move, shrink, grow, unmap-tail, dontneed, "
                                  "free, fixed, purge; fork has --fork-rate)");
    }
    (*mix)[static_cast<size_t>(found)] = weight;
  }
}

namespace {

// The command line as CLI11 sees it: the app, the values that become Options only after the
// parse, and the options whose presence (not only their value) matters.
struct CommandLine {
  CLI::App app{kDescription, "mrcache-stress"};
  std::string backend = "iouring", oracle = "auto";
  uint64_t max_regions = 0, max_bytes = 0, max_unreleased = 0;
  bool fast = false, exact = false;
  CLI::Option *max_size = nullptr;
  CLI::Option *seed = nullptr;
  CLI::Option *max_regions_option = nullptr;
  CLI::Option *max_bytes_option = nullptr;
  CLI::Option *max_unreleased_option = nullptr;
  CLI::Option *fast_option = nullptr;
  CLI::Option *exact_option = nullptr;
};

// The declare_* phases add the options in the order --help lists them.

void declare_threads_and_duration(CommandLine &cl, Options *o) {
  CLI::App &app = cl.app;
  const std::map<std::string, double> time_units{{"s", 1.0}, {"m", 60.0}, {"h", 3600.0}};
  app.add_option("-t,--threads", o->threads, "Worker threads (get, check, put)")
      ->capture_default_str()
      ->check(unsigned_range(1, 128));
  app.add_option("-m,--mutators", o->mutators, "Mutator threads (munmap, mremap, madvise, ...)")
      ->capture_default_str()
      ->check(unsigned_range(0, 64));
  app.add_option("--churn", o->churn,
                 "Churn threads: each maps a fresh mapping of --churn-size, gets, checks and puts "
                 "it, and unmaps it, over and over (the unmap window: another thread's mmap "
                 "gets the address while the unmap is in flight)")
      ->capture_default_str()
      ->check(unsigned_range(0, 16));
  app.add_option("--hot-threads", o->hot_threads,
                 "Hot threads: each cycles through the first 6 mappings, getting and putting "
                 "each one's first page 10 times in a row (parked references: shared by the hot "
                 "threads, a line's worth replaced at every switch, taken back by the mutators' "
                 "changes) and checking the last get")
      ->capture_default_str()
      ->check(unsigned_range(0, 16));
  app.add_option("--churn-size", o->churn_size,
                 "Length of each churn mapping (one length for all: the kernel reuses a freed "
                 "range exactly)")
      ->capture_default_str()
      ->transform(byte_size(0, kMaxRangeBytes));
  app.add_option("-d,--duration", o->duration_s, "How long to run: 30, 30s, 10m, 1h")
      ->capture_default_str()
      ->transform(CLI::AsNumberWithUnit(time_units, CLI::AsNumberWithUnit::CASE_SENSITIVE))
      ->check(finite_range(1e-3, 1e8));
}

void declare_backend_and_oracle(CommandLine &cl) {
  cl.app
      .add_option("-b,--backend", cl.backend,
                  "Registration engine: iouring (pins memory; the default), null (registers "
                  "nothing), verbs (first RDMA device, e.g. rxe)")
      ->capture_default_str()
      ->check(CLI::IsMember({"iouring", "null", "verbs"}));
  cl.app
      .add_option("--oracle", cl.oracle,
                  "How a region is checked: auto (by backend), iouring, pfn, rdma, none")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "iouring", "pfn", "rdma", "none"}));
}

void declare_workload(CommandLine &cl, Options *o) {
  CLI::App &app = cl.app;
  app.add_option("--min-size", o->min_size, "Smallest range a worker asks for (4k, 1m, ...)")
      ->capture_default_str()
      ->transform(byte_size(1, kMaxRangeBytes));
  cl.max_size =
      app.add_option("--max-size", o->max_size,
                     "Largest mapping and range (default 16m; less when RLIMIT_MEMLOCK is small)")
          ->transform(byte_size(1, kMaxRangeBytes));
  app.add_option("--slots", o->slots, "Mappings in the pool")
      ->capture_default_str()
      ->check(unsigned_range(1, 4096));
  app.add_option("--shared-fraction", o->shared_fraction,
                 "Fraction of the mappings that are MAP_SHARED (shmem) instead of private")
      ->capture_default_str()
      ->check(finite_range(0, 1));
  app.add_option("--mix", o->mix_text,
                 "Mutation weights, name=weight,...; names: remap move shrink grow unmap-tail "
                 "dontneed free fixed purge")
      ->capture_default_str();
  app.add_option("--fork-rate", o->fork_rate, "Forks per second (all mutators together); 0 = none")
      ->capture_default_str()
      ->check(finite_range(0, 1000));
  app.add_option("--invalidate-rate", o->invalidate_rate,
                 "Fraction of gets followed by mrc_invalidate of the region")
      ->capture_default_str()
      ->check(finite_range(0, 1));
  app.add_option("--nest-rate", o->nest_rate,
                 "Fraction of operations that hold 2-4 regions of one mapping at once")
      ->capture_default_str()
      ->check(finite_range(0, 1));
  app.add_option("--hot-rate", o->hot_rate,
                 "Fraction of single-range operations that get and put their range 16 more "
                 "times before the check (hot regions park their references)")
      ->capture_default_str()
      ->check(finite_range(0, 1));
  app.add_option("--check-pages", o->check_pages,
                 "Pages the oracle checks per get (first, last and random ones)")
      ->capture_default_str()
      ->check(unsigned_range(1, 1u << 20));
  app.add_option("--mutate-pause", o->mutate_pause_us,
                 "Microseconds each mutator sleeps between mutations (lets hits happen)")
      ->capture_default_str()
      ->check(unsigned_range(0, 1000000));
  cl.seed =
      app.add_option("-s,--seed", o->seed, "Seed of every random choice (default: random, printed)")
          ->check(unsigned_range(0, std::numeric_limits<uint64_t>::max()));
}

void declare_limits_and_failures(CommandLine &cl, Options *o) {
  CLI::App &app = cl.app;
  cl.max_regions_option = app.add_option("--max-regions", cl.max_regions,
                                         "Cache limit: regions (0 = unlimited; default "
                                         "MRC_MAX_REGIONS or unlimited)")
                              ->check(unsigned_range(0, kMaxRegionsLimit));
  cl.max_bytes_option =
      app.add_option("--max-bytes", cl.max_bytes,
                     "Cache limit: registered bytes (0 = unlimited; default MRC_MAX_BYTES, or "
                     "half of RLIMIT_MEMLOCK when pinning is limited)")
          ->transform(byte_size(0, kMaxLimitBytes));
  cl.max_unreleased_option =
      app.add_option("--max-unreleased", cl.max_unreleased,
                     "Cache limit: invalidated bytes still in use (default MRC_MAX_UNRELEASED)")
          ->transform(byte_size(0, kMaxLimitBytes));
  app.add_option("--fail-rate", o->fail_rate,
                 "Probability that a registration fails (injected; null: the backend's own "
                 "injection, others: a wrapper in front of the backend)")
      ->capture_default_str()
      ->check(finite_range(0, 1));
}

void declare_output_and_mode(CommandLine &cl, Options *o) {
  CLI::App &app = cl.app;
  app.add_option("--json", o->json_path, "Write the summary as JSON to FILE")
      ->check([](const std::string &path) {
        // An empty FILE used to mean no summary at all, silently.
        return path.empty() ? std::string("FILE is empty") : std::string();
      });
  app.add_flag("-q,--quiet", o->quiet, "No progress line; one result line and any failure");
  app.add_flag("--keep-going", o->keep_going,
               "Do not stop at the first stale registration (report up to 10)");
  cl.fast_option =
      app.add_flag("--fast,--ordered-unmaps", cl.fast,
                   "Fast mode: every cache gets MRC_FLAG_ORDERED_UNMAPS (no unmap probe per get; "
                   "exact only for unmaps that happen-before the get). In-window stale hits are "
                   "reported, not counted");
  cl.exact_option = app.add_flag("--exact", cl.exact,
                                 "Exact mode (the default) even when MRC_ORDERED_UNMAPS=1 is "
                                 "set: every stale hit counts, in the unmap window too");
  cl.fast_option->excludes(cl.exact_option);
  app.add_flag("--strict-unmap-window", o->strict_unmap_window,
               "Fast mode: count in-window stale hits (on addresses another thread was still "
               "unmapping when the get began) as stale too, which fails the run whenever the "
               "window shows. Exact mode always counts them");
  app.add_flag("--verify-mappings", o->verify_mappings,
               "After every mutation, check in /proc/self/maps that the harness's idea of the "
               "mapping is right (debugging the harness; slow)");
  app.add_option("--progress-interval", o->progress_interval_s,
                 "Seconds between progress lines (default 0.5 on a terminal, 10 otherwise)")
      ->check(finite_range(0, 86400));
}

void declare_rdma(CommandLine &cl, Options *o) {
  cl.app.add_option("--rdma-device", o->rdma_device, "verbs: device name (default: the first)");
  // Before the option: --help shows the default the environment gives.
  o->gid_index = 0;
  if (const char *gid = std::getenv("RXE_GID0")) o->gid_index = std::atoi(gid);
  cl.app
      .add_option("--gid-index", o->gid_index, "verbs: GID index of the loopback QP (env RXE_GID0)")
      ->capture_default_str()
      ->check(unsigned_range(0, 255));
}

// Parses argv and the --mix list. On --help or an error: what it printed's exit code.
std::optional<int> parse(CommandLine &cl, int argc, char **argv, Options *o) {
  try {
    cl.app.parse(argc, argv);
    parse_mix(o->mix_text, &o->mix);
  } catch (const CLI::ParseError &e) {
    return cl.app.exit(e) == 0 ? 0 : 2;
  } catch (const std::invalid_argument &e) {
    std::fprintf(stderr, "mrcache-stress: --mix: %s\n", e.what());
    return 2;
  }
  return std::nullopt;
}

// Moves into *o what the parse left in the command line: the engine and oracle, the mode, and
// which options were given.
void take_parsed(const CommandLine &cl, Options *o) {
  o->backend = cl.backend == "null"    ? Backend::kNull
               : cl.backend == "verbs" ? Backend::kVerbs
                                       : Backend::kIouring;
  o->oracle = cl.oracle == "iouring" ? OracleKind::kIouring
              : cl.oracle == "pfn"   ? OracleKind::kPfn
              : cl.oracle == "rdma"  ? OracleKind::kRdma
              : cl.oracle == "none"  ? OracleKind::kNone
                                     : OracleKind::kAuto;
  if (cl.fast_option->count() != 0) o->fast = cl.fast;
  if (cl.exact_option->count() != 0) o->fast = !cl.exact;
  o->seed_given = cl.seed->count() != 0;
  o->max_size_given = cl.max_size->count() != 0;
  if (cl.max_regions_option->count() != 0) o->max_regions = cl.max_regions;
  if (cl.max_bytes_option->count() != 0) o->max_bytes = cl.max_bytes;
  if (cl.max_unreleased_option->count() != 0) o->max_unreleased = cl.max_unreleased;
}

// Combinations that no single option's check catches; 2 (after saying why) when one is wrong.
std::optional<int> check_combinations(const Options &o) {
  const bool no_weight =
      std::all_of(o.mix.begin(), o.mix.end(), [](double weight) { return weight == 0; });
  if (o.mutators != 0 && o.fork_rate == 0 && no_weight) {
    std::fprintf(stderr,
                 "mrcache-stress: --mix: every weight is 0 and --fork-rate is 0, so the mutators "
                 "would change nothing (-m 0 runs without them)\n");
    return 2;
  }
  if (o.churn != 0 && o.churn_size == 0) {
    std::fprintf(stderr, "mrcache-stress: --churn-size must be positive\n");
    return 2;
  }
  if (o.backend == Backend::kIouring && o.max_size_given && o.max_size > kMaxIouringBytes) {
    std::fprintf(stderr,
                 "mrcache-stress: --max-size: io_uring registers at most 1 GiB per buffer (the "
                 "kernel's limit); use --backend null for longer ranges\n");
    return 2;
  }
  if (o.min_size == 0 || (o.max_size_given && o.max_size < o.min_size)) {
    std::fprintf(stderr, "mrcache-stress: need 0 < --min-size <= --max-size\n");
    return 2;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> parse_options(int argc, char **argv, Options *o) {
  CommandLine cl;
  cl.app.footer(kFooter);
  cl.app.get_formatter()->column_width(34);
  // A later option wins (scripts/stress.sh passes --duration 30 before the user's arguments).
  cl.app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  o->mix_text = kDefaultMix;

  declare_threads_and_duration(cl, o);
  declare_backend_and_oracle(cl);
  declare_workload(cl, o);
  declare_limits_and_failures(cl, o);
  declare_output_and_mode(cl, o);
  declare_rdma(cl, o);
  if (std::optional<int> code = parse(cl, argc, argv, o)) return code;
  take_parsed(cl, o);
  return check_combinations(*o);
}

}  // namespace stress
