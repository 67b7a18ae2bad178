// SPDX-License-Identifier: BSD-3-Clause
// The set-up phases of a run (harness.h): the options fitted to the machine, the oracle, the
// backend, the cache and the pool.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include "tools/stress/harness.h"

namespace stress {
namespace {

bool has_cap_ipc_lock() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    unsigned long long caps = 0;
    if (std::sscanf(line.c_str(), "CapEff: %llx", &caps) == 1) return (caps >> 14) & 1;  // 14
  }
  return false;
}

// Memory this process may pin (io_uring and verbs charge RLIMIT_MEMLOCK), 0 = no limit.
uint64_t pin_budget() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  if (has_cap_ipc_lock()) return 0;
  return limit.rlim_cur;
}

}  // namespace

// What the leak check compares with at the end.
void Harness::record_start() {
  summary_.version = mrc_version();
  before_ = take_baseline();
}

void Harness::choose_seed() {
  if (!opt_.seed_given) {
    opt_.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ now_ns();
  }
}

// Pinning is charged to RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK: size the run so
// that it fits, rather than failing with "no memory".
void Harness::fit_sizes() {
  const uint64_t budget = opt_.backend == Backend::kNull ? 0 : pin_budget();
  if (budget != 0) {
    const uint64_t per_range = page_down(budget / (4 * (opt_.threads + 4)));
    if (!opt_.max_size_given)
      opt_.max_size = std::max<uint64_t>(page_size(), std::min(opt_.max_size, per_range));
    if (!opt_.max_bytes && std::getenv("MRC_MAX_BYTES") == nullptr) opt_.max_bytes = budget / 2;
    if (!opt_.max_unreleased && std::getenv("MRC_MAX_UNRELEASED") == nullptr) {
      opt_.max_unreleased = budget / 8;
    }
    notes_.push_back("RLIMIT_MEMLOCK is " + format_size(budget) +
                     " and the process lacks CAP_IPC_LOCK: --max-size " +
                     format_size(opt_.max_size) + ", --max-bytes " + format_size(*opt_.max_bytes) +
                     " (raise `ulimit -l` for more)");
  }
  if (opt_.min_size > opt_.max_size) opt_.min_size = opt_.max_size;
}

// The oracle for this backend; the pfn oracle also needs the frames to be visible.
std::optional<int> Harness::choose_oracle() {
  oracle_kind_ = opt_.oracle;
  if (oracle_kind_ == OracleKind::kAuto) {
    oracle_kind_ = opt_.backend == Backend::kIouring ? OracleKind::kIouring
                   : opt_.backend == Backend::kVerbs ? OracleKind::kRdma
                                                     : OracleKind::kPfn;
  }
  const bool oracle_fits =
      oracle_kind_ == OracleKind::kNone || oracle_kind_ == OracleKind::kPfn ||
      (oracle_kind_ == OracleKind::kIouring && opt_.backend == Backend::kIouring) ||
      (oracle_kind_ == OracleKind::kRdma && opt_.backend == Backend::kVerbs);
  if (!oracle_fits) {
    std::fprintf(stderr, "mrcache-stress: --oracle %s needs --backend %s\n",
                 oracle_name(oracle_kind_),
                 oracle_kind_ == OracleKind::kIouring ? "iouring" : "verbs");
    return kExitUsage;
  }
  if (oracle_kind_ == OracleKind::kPfn) {
    std::string why;
    if (!frames_visible(&why)) {
      std::fprintf(stderr,
                   "mrcache-stress: the pfn oracle cannot work here: %s.\n"
                   "  Use the default backend (iouring: its oracle needs no privilege), run as "
                   "root, or --oracle none (no proof at all).\n",
                   why.c_str());
      return kExitUsage;
    }
    pagemap_fd_ = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    notes_.push_back(
        "pfn oracle: mappings get MADV_NOHUGEPAGE and MADV_DONTFORK (the null "
        "backend pins nothing, so THP collapse or copy-on-write would move frames); "
        "page migration by the kernel could still show as a false stale");
  }
  return std::nullopt;
}

std::optional<int> Harness::open_backend() {
  BackendSetup::Config backend_config;
  backend_config.backend = opt_.backend;
  backend_config.fail_rate = opt_.fail_rate;
  backend_config.seed = opt_.seed;
  backend_config.pagemap_fd = pagemap_fd_;
  backend_config.rdma_device = opt_.rdma_device;
  if (backend_config.rdma_device.empty() && std::getenv("RXE_DEV0") != nullptr) {
    backend_config.rdma_device = std::getenv("RXE_DEV0");
  }
  backend_config.gid_index = opt_.gid_index;
  std::string error;
  backend_ = BackendSetup::create(backend_config, &error);
  if (backend_ == nullptr) {
    std::fprintf(stderr, "mrcache-stress: backend %s: %s%s\n", backend_name(opt_.backend),
                 error.c_str(), address_space_note().c_str());
    if (pagemap_fd_ >= 0) close(pagemap_fd_);
    return kExitUsage;
  }
  return std::nullopt;
}

void Harness::make_oracle() {
  switch (oracle_kind_) {
    case OracleKind::kIouring:
      oracle_ =
          make_iouring_oracle(backend_->iouring(), &backend_->instrumented(), opt_.check_pages);
      break;
    case OracleKind::kPfn:
      oracle_ = make_pfn_oracle(&backend_->instrumented(), pagemap_fd_, opt_.check_pages);
      break;
    case OracleKind::kRdma:
      oracle_ = make_rdma_oracle(backend_->verbs(), &backend_->instrumented(), opt_.check_pages);
      break;
    default: oracle_ = make_no_oracle(); break;
  }
  if (oracle_kind_ == OracleKind::kNone) {
    notes_.push_back(
        "--oracle none: regions were not checked; this run proves nothing about "
        "staleness");
  }
}

// From here on the library's log messages count into the run.
void Harness::share_with_threads() {
  run_.opt = opt_;
  run_.seed = opt_.seed;
  run_.out = &out_;
  run_.backend = backend_.get();
  run_.oracle = oracle_.get();
  run_.injecting = opt_.fail_rate > 0;
  g_run = &run_;
  mrc_set_log_handler(&log_handler, nullptr);
}

// The cache as the environment configures it, with the mode and the limits the options
// override.
std::optional<int> Harness::create_cache() {
  char env_error[256];
  if (mrc_cache_params_init_checked(&params_, env_error, sizeof env_error) != MRC_OK) {
    std::fprintf(stderr, "mrcache-stress: %s\n", env_error);
    mrc_set_log_handler(nullptr, nullptr);
    return kExitUsage;
  }
  params_.name = "mrcache-stress";
  const bool fast_from_env = (params_.flags & MRC_FLAG_ORDERED_UNMAPS) != 0 && !opt_.fast;
  if (opt_.fast) {
    params_.flags = *opt_.fast ? params_.flags | MRC_FLAG_ORDERED_UNMAPS
                               : params_.flags & ~static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS);
  }
  run_.fast = (params_.flags & MRC_FLAG_ORDERED_UNMAPS) != 0;
  run_.window_counted = !run_.fast || opt_.strict_unmap_window;
  if (fast_from_env) {
    notes_.push_back("MRC_ORDERED_UNMAPS is set in the environment: fast mode (--exact overrides)");
  }
  if (!run_.fast && opt_.strict_unmap_window) {
    notes_.push_back("--strict-unmap-window changes nothing in exact mode: in-window hits count");
  }
  params_.backend = backend_->backend();
  params_.backend_ctx = backend_->backend_ctx();
  if (opt_.max_regions) params_.max_regions = *opt_.max_regions;
  if (opt_.max_bytes) params_.max_bytes = *opt_.max_bytes;
  if (opt_.max_unreleased) params_.max_unreleased = *opt_.max_unreleased;
  mrc_status_t status = mrc_cache_create(&params_, &cache_);
  if (status != MRC_OK) {
    std::fprintf(stderr, "mrcache-stress: mrc_cache_create: %s%s\n", mrc_status_string(status),
                 address_space_note().c_str());
    mrc_set_log_handler(nullptr, nullptr);
    return kExitUsage;
  }
  run_.cache = cache_;
  return std::nullopt;
}

void Harness::describe_monitor() {
  mrc_monitor_info_t monitor{};
  if (mrc_monitor_info(&monitor) == MRC_OK) {
    run_.monitor_mode = monitor.mode_name != nullptr ? monitor.mode_name : "?";
    summary_.monitor_reason = monitor.reason;
  } else {
    run_.monitor_mode = "unknown";
  }
  if (monitor.mode == MRC_MONITOR_UNCACHED) {
    notes_.push_back(
        "the monitor runs uncached, so nothing is cached and hits stay at 0 (the "
        "run still checks every registration); see the monitor line for why");
  }
  if (std::getenv("MRC_TEST_DROP_EVENTS") != nullptr) {
    notes_.push_back(
        "MRC_TEST_DROP_EVENTS is set: the monitor publishes no invalidation (a "
        "deliberately broken cache); the oracle should report stale use");
  }
}

// The pool's mappings; the run's clock starts here.
std::optional<int> Harness::map_pool() {
  PoolConfig pool_config;
  pool_config.slots = opt_.slots;
  pool_config.min_size = opt_.min_size;
  pool_config.max_size = opt_.max_size;
  pool_config.shared_fraction = opt_.shared_fraction;
  pool_config.stable_frames = oracle_kind_ == OracleKind::kPfn;
  pool_config.private_slots = opt_.churn;
  pool_config.private_len = opt_.churn_size;
  run_.start_ns = now_ns();
  backend_->instrumented().set_origin(run_.start_ns);
  pool_ = std::make_unique<Pool>(pool_config, mix64(opt_.seed), run_.start_ns);
  if (!pool_->setup_error().empty()) {
    // The run never started: a usage or machine problem, not a failure of the cache.
    std::fprintf(stderr,
                 "mrcache-stress: cannot map the pool's mappings (--slots %u of up to %s): %s%s\n",
                 opt_.slots, format_size(opt_.max_size).c_str(), pool_->setup_error().c_str(),
                 address_space_note().c_str());
    pool_.reset();
    mrc_cache_destroy(cache_);
    mrc_set_log_handler(nullptr, nullptr);
    g_run = nullptr;
    if (pagemap_fd_ >= 0) close(pagemap_fd_);
    return kExitUsage;
  }
  run_.pool = pool_.get();
  return std::nullopt;
}

void Harness::prepare_threads() {
  run_.next_fork_ns.store(
      opt_.fork_rate > 0 ? run_.start_ns + static_cast<uint64_t>(1e9 / opt_.fork_rate) : 0);
  for (unsigned i = 0; i < opt_.threads + opt_.mutators + opt_.churn + opt_.hot_threads; ++i) {
    run_.counters.push_back(std::make_unique<ThreadCounters>());
  }
}

}  // namespace stress
