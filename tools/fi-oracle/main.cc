// SPDX-License-Identifier: BSD-3-Clause
// mrcache-fi-oracle: proves, through libfabric's own MR cache, whether the memory monitor in use
// lets that cache hand out registrations of memory that is gone. A plain libfabric program: it
// does not link libmrcache; the monitor is whatever the environment selects
// (FI_MR_CACHE_MONITOR, or an imported one from a provider plugin in FI_PROVIDER_PATH).
//
// A sender and a receiver process (driver.h) on verbs;ofi_rxm FI_EP_RDM endpoints. Before each
// message the sender changes the memory under its buffer (config.h, Scenario), stamps every
// 8-byte word of the new memory with the message's number (stamp.h) and sends it (rendezvous:
// the receiver RDMA-reads it through the registration ofi_rxm took from the cache) or writes it
// (fi_write from the buffer through such a registration); or it fills the new memory with the
// previous message's stamp and fi_reads the receiver's stamped buffer into it. Every word is
// checked: the current stamp is ok, an older message's stamp is STALE (the cache served a
// registration of pages that are no longer there), anything else is corrupt.
#include <rdma/fabric.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tools/common/cli_numbers.h"
#include "tools/common/stdout_check.h"
#include "tools/fi-oracle/config.h"
#include "tools/fi-oracle/driver.h"

namespace fi_oracle {
namespace {

constexpr int kExitRan = 0;
constexpr int kExitNotExact = 1;
constexpr int kExitUsage = 2;
constexpr int kExitError = 3;
constexpr int kExitHang = 4;

// ofi_rxm's eager limit (FI_OFI_RXM_BUFFER_SIZE) is 16 KiB by default, and messages up to
// FI_OFI_RXM_SAR_LIMIT (8 times that) are copied through bounce buffers (segmentation and
// reassembly), never registered. A SAR limit at or below the eager limit leaves only eager and
// rendezvous: every message above 16 KiB goes through the MR cache.
constexpr const char *kDefaultSarLimit = "16384";
constexpr size_t kMinSize = 32 * 1024;
// rxm sizes its verbs completion queues by FI_UNIVERSE_SIZE (default 256): beyond rxe's 32767
// entries, and fi_enable fails with EINVAL. Two peers need far fewer.
constexpr const char *kDefaultUniverse = "16";

// The environment that selects the monitor and shapes the cache, as the run saw it.
constexpr const char *kEnvNames[] = {
    "FI_MR_CACHE_MONITOR",    "FI_PROVIDER_PATH", "FI_MR_CACHE_MAX_COUNT",
    "FI_MR_CACHE_MAX_SIZE",   "FI_HOOK",          "FI_OFI_RXM_SAR_LIMIT",
    "FI_OFI_RXM_BUFFER_SIZE", "FI_UNIVERSE_SIZE"};

constexpr const char *kDescription =
    "mrcache-fi-oracle: does the memory monitor let libfabric's MR cache serve stale "
    "registrations?\n"
    "\n"
    "A receiver and a sender process on verbs;ofi_rxm (FI_EP_RDM) endpoints. Before each\n"
    "message the sender changes the memory under its buffer (a scenario), stamps every word of\n"
    "the new memory with the message's number, and sends it above the rendezvous threshold (the\n"
    "receiver RDMA-reads it through the registration ofi_rxm got from libfabric's MR cache) or\n"
    "writes it with fi_write into a buffer the receiver registered; or it fills the new memory\n"
    "with the previous message's stamp and reads the receiver's stamped buffer into it with\n"
    "fi_read. Every word is checked: an older message's stamp is STALE: the cache handed out a\n"
    "registration of memory that is gone, because the monitor missed (or was late with) the\n"
    "change.\n"
    "\n"
    "Scenarios: none (control: memory unchanged, must never be stale), free (free + malloc\n"
    "above the mmap threshold), munmap (libc munmap + mmap at the same address), raw\n"
    "(syscall(SYS_munmap) + syscall(SYS_mmap)), fixed (mmap MAP_FIXED over the buffer),\n"
    "dontneed (madvise MADV_DONTNEED), mremap (mremap away, fresh mmap at the old address), race\n"
    "(one thread munmaps while the sending thread maps the address and sends at once). A change\n"
    "that left the buffer at another address counts as not-reused, not as a message. Each\n"
    "scenario starts on a fresh buffer with a warm-up message per op (its own row).\n"
    "\n"
    "The monitor is what the environment selects: FI_MR_CACHE_MONITOR=memhooks|userfaultfd|\n"
    "disabled, FI_MR_CACHE_MAX_COUNT=0 (no cache), or a provider plugin in FI_PROVIDER_PATH that\n"
    "imports its own. Unless set, FI_OFI_RXM_SAR_LIMIT=16384 (so every message above 16 KiB is\n"
    "a rendezvous) and FI_UNIVERSE_SIZE=16 (rxe's completion queues are too small for rxm's\n"
    "default) are set.\n"
    "\n"
    "Exit status: 0 = the run completed (stale deliveries are its result, not an error); 1 =\n"
    "--expect-exact and a delivery was stale or corrupt; 2 = usage; 3 = set-up or communication\n"
    "error; 4 = hang (a wait ran out or the run stalled: the processes were killed, and the\n"
    "kernel function each thread was blocked in is reported). An error or a hang ends the\n"
    "scenario it happened in; the later scenarios still run, in a fresh pair of processes.";

template <typename Enum, size_t N>
std::vector<Enum> parse_list(const std::string &text, const char *const (&names)[N],
                             const char *what) {
  std::vector<Enum> out;
  if (text == "all") {
    for (size_t i = 0; i < N; ++i) out.push_back(static_cast<Enum>(i));
    return out;
  }
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t i = 0;
    while (i < N && item != names[i]) ++i;
    if (i == N) throw CLI::ValidationError(what, "unknown name '" + item + "'");
    out.push_back(static_cast<Enum>(i));
  }
  if (out.empty()) throw CLI::ValidationError(what, "empty list");
  return out;
}

std::string env_or(const char *name, const char *fallback) {
  const char *v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

nlohmann::json row_json(const Row &row) {
  return {{"op", row.op},
          {"scenario", row.scenario},
          {"messages", row.messages},
          {"stale", row.stale},
          {"corrupt", row.corrupt},
          {"errors", row.errors},
          {"not_reused", row.not_reused},
          {"registrations", row.registrations}};
}

void print_table(const Outcome &out) {
  std::printf("%-6s %-9s %9s %6s %8s %7s %11s %6s\n", "op", "scenario", "messages", "stale",
              "corrupt", "errors", "not-reused", "regs");
  auto line = [](const Row &r) {
    auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
    std::printf("%-6s %-9s %9llu %6llu %8llu %7llu %11llu %6llu\n", r.op.c_str(),
                r.scenario.c_str(), u(r.messages), u(r.stale), u(r.corrupt), u(r.errors),
                u(r.not_reused), u(r.registrations));
  };
  for (const Row &r : out.rows) line(r);
  line(out.total);
  std::printf(
      "(regs: registrations the sender made for the counted messages; fewer than the\n"
      " messages means the cache served the rest)\n");
}

int run(int argc, char **argv) {
  CLI::App app{kDescription, "mrcache-fi-oracle"};
  std::string ops_text = "all", scenarios_text = "all";
  std::string json_path;
  uint64_t messages = 6, race_messages = 0, size = 64 * 1024, seed = 0;
  double timeout = 600, op_timeout = 30, stall = 0;
  bool expect_exact = false, verbose = false;
  Config config;
  // Sender on the second rxe device, receiver on the first (the guests name them in RXE_DEV*).
  config.recv_domain = env_or("RXE_DEV0", "");
  config.send_domain = env_or("RXE_DEV1", config.recv_domain.c_str());
  app.add_option("--ops", ops_text, "Comma-separated: send, write, read, or all")
      ->capture_default_str();
  app.add_option("--scenarios", scenarios_text,
                 "Comma-separated: none, free, munmap, raw, fixed, dontneed, mremap, race, or all")
      ->capture_default_str();
  app.add_option("--messages", messages, "Messages per (op, scenario), after one warm-up")
      ->check(mrc_tools::unsigned_range(1, 100000))
      ->capture_default_str();
  app.add_option("--race-messages", race_messages,
                 "Messages of the race scenario, which the unmapping thread loses most of the "
                 "time (default: 4 times --messages)")
      ->check(mrc_tools::unsigned_range(1, 100000));
  app.add_option("--size", size, "Bytes per message (k, m suffixes), above the eager limit")
      ->transform(mrc_tools::byte_size(kMinSize, 64 * 1024 * 1024))
      ->capture_default_str();
  app.add_option("--send-domain", config.send_domain, "Sender's domain (default $RXE_DEV1)");
  app.add_option("--recv-domain", config.recv_domain, "Receiver's domain (default $RXE_DEV0)");
  app.add_option("--timeout", timeout, "Seconds the whole run may take")
      ->check(mrc_tools::finite_range(1, 86400))
      ->capture_default_str();
  app.add_option("--op-timeout", op_timeout, "Seconds a process waits for any one completion")
      ->check(mrc_tools::finite_range(0.1, 3600))
      ->capture_default_str();
  app.add_option("--stall-timeout", stall,
                 "Seconds without a completed message before the run counts as hung "
                 "(default: op timeout + 15)")
      ->check(mrc_tools::finite_range(0.1, 3600));
  app.add_option("--seed", seed, "Seed of the run's stamp nonce (default: random)")
      ->check(mrc_tools::unsigned_range(0, UINT32_MAX));
  app.add_option("--json", json_path, "Write the result as one JSON line to FILE (- = stdout)");
  app.add_flag("--expect-exact", expect_exact, "Exit 1 on any stale or corrupt delivery");
  app.add_flag("--isolate", config.isolate,
               "Run each scenario in its own pair of processes (a fresh cache each; slower)");
  app.add_flag("--verbose", verbose, "Report every stale or corrupt delivery on stderr");
  try {
    app.parse(argc, argv);
    config.ops = parse_list<Op>(ops_text, kOpNames, "--ops");
    config.scenarios = parse_list<Scenario>(scenarios_text, kScenarioNames, "--scenarios");
  } catch (const CLI::ParseError &e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  if (size % 8 != 0) {
    std::fprintf(stderr, "mrcache-fi-oracle: --size must be a multiple of 8\n");
    return kExitUsage;
  }
  config.messages = messages;
  config.race_messages = race_messages != 0 ? race_messages : 4 * messages;
  config.size = size;
  config.op_timeout = op_timeout;
  config.verbose = verbose;
  config.nonce = seed != 0 ? static_cast<uint32_t>(seed) : std::random_device{}();
  if (stall == 0) stall = op_timeout + 15;

  setenv("FI_OFI_RXM_SAR_LIMIT", kDefaultSarLimit, 0);
  setenv("FI_UNIVERSE_SIZE", kDefaultUniverse, 0);
  nlohmann::json env = nlohmann::json::object();
  std::string env_line;
  for (const char *name : kEnvNames) {
    const char *v = std::getenv(name);
    env[name] = v != nullptr ? nlohmann::json(v) : nlohmann::json(nullptr);
    if (v != nullptr) env_line += std::string(" ") + name + "=" + v;
  }
  std::printf(
      "mrcache-fi-oracle: verbs;ofi_rxm, sender %s -> receiver %s, %zu-byte messages, "
      "%llu per (op, scenario)\n  environment:%s\n",
      config.send_domain.empty() ? "(any)" : config.send_domain.c_str(),
      config.recv_domain.empty() ? "(any)" : config.recv_domain.c_str(), config.size,
      static_cast<unsigned long long>(config.messages),
      env_line.empty() ? " (nothing set)" : env_line.c_str());
  if (std::getenv("FI_PROVIDER_PATH") == nullptr) {
    std::printf("  no FI_PROVIDER_PATH: libfabric's own monitors only\n");
  }
  std::fflush(stdout);

  Outcome out = drive(config, timeout, stall);
  for (const std::string &info : out.info) std::printf("  %s\n", info.c_str());
  print_table(out);
  std::printf("status: %s%s%s (%.1f s)\n", status_name(out.status), out.detail.empty() ? "" : ": ",
              out.detail.c_str(), out.seconds);
  // Messages of the control scenario the cache served (no registration): zero means the cache
  // was not in use, and no stale delivery anywhere would prove anything.
  uint64_t cache_hits = 0;
  for (const Row &row : out.rows) {
    if (row.scenario == "none" && row.registrations < row.messages) {
      cache_hits += row.messages - row.registrations;
    }
  }
  // One line for scripts (scripts/rxe/fi-oracle-matrix.sh).
  std::printf(
      "fi-oracle-summary: status=%s messages=%llu stale=%llu corrupt=%llu errors=%llu "
      "not_reused=%llu cache_hits=%llu\n",
      status_name(out.status), static_cast<unsigned long long>(out.total.messages),
      static_cast<unsigned long long>(out.total.stale),
      static_cast<unsigned long long>(out.total.corrupt),
      static_cast<unsigned long long>(out.total.errors),
      static_cast<unsigned long long>(out.total.not_reused),
      static_cast<unsigned long long>(cache_hits));

  uint32_t api = fi_version();
  nlohmann::json result = {
      {"program", "mrcache-fi-oracle"},
      {"libfabric", std::to_string(FI_MAJOR(api)) + "." + std::to_string(FI_MINOR(api))},
      {"provider", "verbs;ofi_rxm"},
      {"send_domain", config.send_domain},
      {"recv_domain", config.recv_domain},
      {"size", config.size},
      {"messages_per_scenario", config.messages},
      {"race_messages", config.race_messages},
      {"env", env},
      {"status", status_name(out.status)},
      {"detail", out.detail},
      {"seconds", out.seconds},
      {"total", row_json(out.total)},
      {"cache_hits", cache_hits},
      {"rows", nlohmann::json::array()},
  };
  for (const Row &row : out.rows) result["rows"].push_back(row_json(row));
  if (json_path == "-") {
    std::printf("%s\n", result.dump().c_str());
  } else if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << result.dump() << "\n";
    if (!file.flush()) {
      std::fprintf(stderr, "mrcache-fi-oracle: cannot write %s\n", json_path.c_str());
      return kExitError;
    }
  }

  if (out.status == Status::kHang) return kExitHang;
  if (out.status == Status::kError) return kExitError;
  if (expect_exact && out.total.stale + out.total.corrupt > 0) {
    std::printf("not exact: %llu stale and %llu corrupt deliveries\n",
                static_cast<unsigned long long>(out.total.stale),
                static_cast<unsigned long long>(out.total.corrupt));
    return kExitNotExact;
  }
  return kExitRan;
}

}  // namespace
}  // namespace fi_oracle

int main(int argc, char **argv) {
  mrc_tools::check_stdout_at_exit("mrcache-fi-oracle", 3);
  return fi_oracle::run(argc, argv);
}
