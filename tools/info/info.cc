// SPDX-License-Identifier: BSD-3-Clause
// mrcache-info: what mrcache would do on this machine, and why. The version, the effective
// configuration (every MRC_* variable with its value and unit), the monitor mode and what a
// better one would need, the registration engines available, the kernel limits that matter.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/common/stdout_check.h"

#if MRC_INFO_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

namespace {

using nlohmann::json;

std::string read_first_line(const char *path) {
  std::ifstream file(path);
  std::string line;
  if (!std::getline(file, line)) return "";
  return line;
}

std::string size_text(size_t bytes, const char *zero_means) {
  if (bytes == 0) return zero_means;
  if (bytes == SIZE_MAX) return "unlimited";
  static const char *const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4 && static_cast<uint64_t>(value) % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.0f %s", value, kUnits[unit]);
  return buf;
}

bool parse_bool(const std::string &text, bool *out) {
  for (const char *t : {"1", "yes", "true", "on", "y"}) {
    if (strcasecmp(text.c_str(), t) == 0) return (*out = true);
  }
  for (const char *f : {"0", "no", "false", "off", "n"}) {
    if (strcasecmp(text.c_str(), f) == 0) {
      *out = false;
      return true;
    }
  }
  return false;
}

struct Variable {
  std::string name;
  std::string raw;  // "" = unset
  std::string effective;
  std::string meaning;
};

std::string env(const char *name) {
  const char *value = std::getenv(name);
  return value != nullptr ? value : "";
}

// The configuration as a cache created now would see it.
std::vector<Variable> configuration(std::string *problem) {
  mrc_cache_params_t params;
  char error[512] = "";
  if (mrc_cache_params_init_checked(&params, error, sizeof error) != MRC_OK) *problem = error;
  std::vector<Variable> vars;
  vars.push_back(
      {"MRC_MAX_REGIONS", env("MRC_MAX_REGIONS"),
       params.max_regions == 0 ? "unlimited" : std::to_string(params.max_regions) + " regions",
       "cached regions kept; past it, CLOCK (second chance) evicts unused ones"});
  vars.push_back({"MRC_MAX_BYTES", env("MRC_MAX_BYTES"), size_text(params.max_bytes, "unlimited"),
                  "registered bytes the cache keeps (sizes: 4096, 64k, 1g, inf)"});
  vars.push_back(
      {"MRC_MAX_UNRELEASED", env("MRC_MAX_UNRELEASED"),
       size_text(params.max_unreleased, "0: deregister at the last put"),
       "invalidated bytes whose deregistration may wait, batched, after their last put"});
  vars.push_back({"MRC_PURGE_ON_FORK", env("MRC_PURGE_ON_FORK"),
                  (params.flags & MRC_FLAG_PURGE_ON_FORK) != 0 ? "on" : "off",
                  "deregister unused regions before fork (fewer pinned pages copied)"});
  vars.push_back({"MRC_ORDERED_UNMAPS", env("MRC_ORDERED_UNMAPS"),
                  (params.flags & MRC_FLAG_ORDERED_UNMAPS) != 0
                      ? "fast mode: exact only for unmaps that happen-before the get"
                      : "exact mode: every get probes for unmaps in flight (one ioctl)",
                  "1 skips the probe on hits: only for processes where no thread maps memory while "
                  "another unmaps it"});
  vars.push_back({"MRC_CACHE_CHURN", env("MRC_CACHE_CHURN"),
                  (params.flags & MRC_FLAG_CACHE_CHURN) != 0
                      ? "on: every registration cached"
                      : "off: ranges that churn register uncached (their munmap waits for no one)",
                  "1 caches even ranges whose registrations keep ending unused by an unmap"});
  // A malformed value is never shown as if it took effect: the library refuses it (the ERROR
  // line below gives mrc_cache_params_init_checked's text).
  const char *const kRefused = "malformed: mrc_cache_create refuses it";
  std::string monitor = env("MRC_MONITOR");
  std::string monitor_effective = monitor.empty() ? "auto" : monitor;
  if (!monitor.empty()) {
    bool known = false;
    for (const char *mode : {"auto", "bpf", "wp-async", "wp", "missing", "off"}) {
      known = known || monitor == mode;
    }
    if (!known) monitor_effective = kRefused;
  }
  vars.push_back({"MRC_MONITOR", monitor, monitor_effective,
                  "auto, bpf, wp-async, wp, missing or off (the mode chosen is below)"});
  vars.push_back({"MRC_VERIFY_PFN", env("MRC_VERIFY_PFN"),
                  (params.flags & MRC_FLAG_VERIFY_PFN) != 0
                      ? std::to_string(params.verify_pfn_pages != 0 ? params.verify_pfn_pages : 1) +
                            " page(s) checked per hit"
                      : "off",
                  "compare page frames on every hit (needs CAP_SYS_ADMIN for /proc/self/pagemap)"});
  std::string level = env("MRC_LOG_LEVEL");
  std::string level_effective = "warn";
  if (!level.empty()) {
    static const char *const kLevels[] = {"error", "warn", "info", "debug", "trace"};
    level_effective = kRefused;
    for (int i = 0; i < 5; ++i) {
      if (strcasecmp(level.c_str(), kLevels[i]) == 0 || level == std::to_string(i)) {
        level_effective = kLevels[i];
      }
    }
  }
  vars.push_back({"MRC_LOG_LEVEL", level, level_effective, "error, warn, info, debug, trace"});
  std::string stats = env("MRC_STATS");
  bool stats_on = false;
  const bool stats_ok = stats.empty() || parse_bool(stats, &stats_on);
  vars.push_back({"MRC_STATS", stats, stats_ok ? (stats_on ? "on" : "off") : kRefused,
                  "print each cache's statistics when it is destroyed"});
  return vars;
}

// MRC_* variables set in the environment that mrcache does not know.
std::vector<std::string> unknown_variables(const std::vector<Variable> &known) {
  static const char *const kOthers[] = {"MRC_NULL_FAIL_RATE", "MRC_NULL_FAIL_EVERY",
                                        "MRC_NULL_FAIL_SEED", "MRC_TEST_DROP_EVENTS"};
  std::vector<std::string> out;
  for (char **e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "MRC_", 4) != 0) continue;
    const std::string name(*e, std::strcspn(*e, "="));
    bool found = false;
    for (const Variable &v : known) found = found || v.name == name;
    for (const char *other : kOthers) found = found || name == other;
    if (!found) out.push_back(name);
  }
  return out;
}

// Whether a cache created now gets exactly under concurrent unmaps (mrcache.h, the cache flags).
std::string gets_mode(mrc_monitor_mode_t mode) {
  if (mode == MRC_MONITOR_UNCACHED) return "uncached: every get registers, so every get is exact";
  if (mode == MRC_MONITOR_BPF) {
    return "exact: each get compares the eBPF ring's positions (plain loads, no system call)";
  }
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  if ((params.flags & MRC_FLAG_ORDERED_UNMAPS) != 0) {
    return "fast mode (MRC_ORDERED_UNMAPS): exact only for unmaps that happen-before the get";
  }
  return "exact: each get probes the kernel for unmaps in flight (one ioctl) and waits for them";
}

std::string better_mode(mrc_monitor_mode_t mode) {
  switch (mode) {
    case MRC_MONITOR_BPF: return "none: bpf is the best mode";
    case MRC_MONITOR_WP_ASYNC:
      return "bpf (MRC_MONITOR=bpf) needs root and a kernel that runs eBPF trampoline programs "
             "(fentry; not under lockdown); among userfaultfd modes, wp-async is the best";
    case MRC_MONITOR_WP:
      return "wp-async needs Linux 6.7+ (UFFD_FEATURE_WP_ASYNC); it also watches file-backed "
             "and SysV shm mappings";
    case MRC_MONITOR_MISSING:
      return "wp needs Linux 5.7+ (write-protect registration, no faults to resolve); wp-async "
             "needs 6.7+";
    case MRC_MONITOR_UNCACHED:
      return "any cached mode needs userfaultfd with UNMAP/REMAP/REMOVE events: allow the "
             "userfaultfd syscall (container seccomp profile), and either Linux 5.11+ "
             "(UFFD_USER_MODE_ONLY, no privilege), vm.unprivileged_userfaultfd=1, CAP_SYS_PTRACE, "
             "or access to /dev/userfaultfd; MRC_MONITOR must not be off";
  }
  return "";
}

json iouring_info() {
  json out;
  out["max_slots"] = MRC_IOURING_MAX_SLOTS;
  out["default_slots"] = MRC_IOURING_DEFAULT_SLOTS;
  out["max_buffer_bytes"] = uint64_t{1} << 30;
  out["io_uring_disabled"] = read_first_line("/proc/sys/kernel/io_uring_disabled");
  mrc_iouring_ctx_t *ctx = nullptr;
  const mrc_status_t status = mrc_iouring_ctx_create(nullptr, &ctx);
  out["available"] = status == MRC_OK;
  if (status != MRC_OK) {
    out["error"] = std::string(mrc_status_string(status)) + ": " + mrc_backend_last_error();
    return out;
  }
  // One real registration: proves pinning works here (RLIMIT_MEMLOCK permitting).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void *mem = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem != MAP_FAILED) {
    void *handle = nullptr;
    uint64_t key = 0;
    const mrc_backend_t *backend = mrc_backend_iouring();
    const mrc_status_t reg =
        backend->reg(ctx, mem, page, MRC_PROT_READ | MRC_PROT_WRITE, &handle, &key);
    out["test_registration"] =
        reg == MRC_OK ? "ok (one page pinned and released)"
                      : std::string(mrc_status_string(reg)) + ": " + mrc_backend_last_error();
    if (reg == MRC_OK) backend->dereg(ctx, handle);
    munmap(mem, page);
  }
  mrc_iouring_ctx_destroy(ctx);
  return out;
}

json verbs_info() {
  json out;
#if MRC_INFO_HAVE_VERBS
  out["built"] = true;
  int count = 0;
  ibv_device **list = ibv_get_device_list(&count);
  json devices = json::array();
  for (int i = 0; list != nullptr && i < count; ++i) {
    json device;
    device["name"] = ibv_get_device_name(list[i]);
    if (ibv_context *context = ibv_open_device(list[i])) {
      ibv_device_attr attr{};
      if (ibv_query_device(context, &attr) == 0) {
        device["ports"] = attr.phys_port_cnt;
        device["max_mr"] = attr.max_mr;
        device["max_mr_size"] = attr.max_mr_size;
      }
      ibv_port_attr port{};
      if (ibv_query_port(context, 1, &port) == 0) {
        device["port1_state"] = ibv_port_state_str(port.state);
        device["port1_active_mtu"] = 128 << port.active_mtu;
        device["port1_link_layer"] =
            port.link_layer == IBV_LINK_LAYER_ETHERNET ? "ethernet" : "infiniband";
      }
      ibv_close_device(context);
    } else {
      device["error"] = std::string("ibv_open_device: ") + strerrordesc_np(errno);
    }
    devices.push_back(device);
  }
  if (list != nullptr) ibv_free_device_list(list);
  out["devices"] = devices;
  if (devices.empty()) {
    out["note"] =
        "no RDMA device: load a driver or soft-RoCE (rdma link add rxe0 type rxe "
        "netdev eth0; needs a kernel with CONFIG_RDMA_RXE)";
  }
#else
  out["built"] = false;
  out["devices"] = json::array();
  out["note"] = "this build has no verbs support (MRC_WITH_VERBS=OFF)";
#endif
  return out;
}

bool has_capability(int bit) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    unsigned long long caps = 0;
    if (std::sscanf(line.c_str(), "CapEff: %llx", &caps) == 1) return ((caps >> bit) & 1) != 0;
  }
  return false;
}

json gather(std::string *config_problem) {
  json j;
  j["version"] = mrc_version();
  j["header_version"] = std::to_string(MRC_VERSION_MAJOR) + "." +
                        std::to_string(MRC_VERSION_MINOR) + "." + std::to_string(MRC_VERSION_PATCH);
  json config = json::array();
  const std::vector<Variable> vars = configuration(config_problem);
  for (const Variable &v : vars) {
    config.push_back({{"name", v.name},
                      {"set", !v.raw.empty()},
                      {"value", v.raw},
                      {"effective", v.effective},
                      {"meaning", v.meaning}});
  }
  j["configuration"] = config;
  j["configuration_error"] = *config_problem;
  j["unknown_variables"] = unknown_variables(vars);

  mrc_monitor_info_t monitor{};
  if (mrc_monitor_info(&monitor) == MRC_OK) {
    char features[32];
    std::snprintf(features, sizeof features, "%#" PRIx64, monitor.features);
    j["monitor"] = {{"mode", monitor.mode_name != nullptr ? monitor.mode_name : "?"},
                    {"reason", monitor.reason},
                    {"better", better_mode(monitor.mode)},
                    {"features", features},
                    {"running", monitor.running != 0},
                    {"vma_budget", monitor.vma_budget},
                    {"gets", gets_mode(monitor.mode)}};
  } else {
    j["monitor"] = {{"mode", "unknown"}, {"reason", "mrc_monitor_info failed"}};
  }

  rlimit memlock{};
  getrlimit(RLIMIT_MEMLOCK, &memlock);
  const bool ipc_lock = has_capability(14);
  j["limits"] = {
      {"rlimit_memlock",
       memlock.rlim_cur == RLIM_INFINITY ? "unlimited" : size_text(memlock.rlim_cur, "0")},
      {"rlimit_memlock_bytes",
       memlock.rlim_cur == RLIM_INFINITY ? -1 : static_cast<int64_t>(memlock.rlim_cur)},
      {"cap_ipc_lock", ipc_lock},
      {"pinning_charged", ipc_lock
                              ? "no: CAP_IPC_LOCK, pinned memory is not charged to RLIMIT_MEMLOCK"
                              : "yes: io_uring and verbs charge pinned pages to RLIMIT_MEMLOCK"},
      {"vm_max_map_count", read_first_line("/proc/sys/vm/max_map_count")},
      {"vm_unprivileged_userfaultfd", read_first_line("/proc/sys/vm/unprivileged_userfaultfd")},
      {"dev_userfaultfd",
       access("/dev/userfaultfd", F_OK) == 0
           ? (access("/dev/userfaultfd", R_OK | W_OK) == 0 ? "usable" : "present, no access")
           : "absent"},
      {"kernel", read_first_line("/proc/sys/kernel/osrelease")},
  };
  j["backends"] = {
      {"null", {{"available", true}}}, {"iouring", iouring_info()}, {"verbs", verbs_info()}};
  return j;
}

void print_text(const json &j) {
  std::printf("mrcache %s (header %s)\n\n", j["version"].get<std::string>().c_str(),
              j["header_version"].get<std::string>().c_str());
  std::printf("Configuration (MRC_* environment variables; unset = default)\n");
  for (const json &v : j["configuration"]) {
    const std::string raw = v["set"].get<bool>() ? v["value"].get<std::string>() : "(unset)";
    std::printf("  %-20s %-12s -> %-28s %s\n", v["name"].get<std::string>().c_str(), raw.c_str(),
                v["effective"].get<std::string>().c_str(), v["meaning"].get<std::string>().c_str());
  }
  if (!j["configuration_error"].get<std::string>().empty()) {
    std::printf("  ERROR: %s (mrc_cache_create refuses such parameters)\n",
                j["configuration_error"].get<std::string>().c_str());
  }
  for (const json &name : j["unknown_variables"]) {
    std::printf("  warning: %s is not an mrcache variable (misspelt?)\n",
                name.get<std::string>().c_str());
  }
  const json &m = j["monitor"];
  std::printf("\nMonitor\n  mode       %s\n  why        %s\n  better     %s\n",
              m["mode"].get<std::string>().c_str(), m["reason"].get<std::string>().c_str(),
              m.value("better", "").c_str());
  if (m.contains("features")) {
    std::printf("  features   %s (UFFD_FEATURE_* granted)\n",
                m["features"].get<std::string>().c_str());
  }
  if (m.contains("gets")) std::printf("  gets       %s\n", m["gets"].get<std::string>().c_str());
  const json &l = j["limits"];
  std::printf("\nLimits\n");
  std::printf("  kernel                        %s\n", l["kernel"].get<std::string>().c_str());
  const uint64_t budget = m.value("vma_budget", uint64_t{0});
  std::printf(
      "  vm.max_map_count              %s (watching keeps registered mappings from merging "
      "with their neighbours; mrcache keeps the VMAs it may add under %s)\n",
      l["vm_max_map_count"].get<std::string>().c_str(),
      budget != 0 ? std::to_string(budget).c_str()
                  : "a budget derived from it when the monitor starts");
  std::printf("  vm.unprivileged_userfaultfd   %s\n",
              l["vm_unprivileged_userfaultfd"].get<std::string>().c_str());
  std::printf("  /dev/userfaultfd              %s\n",
              l["dev_userfaultfd"].get<std::string>().c_str());
  std::printf("  RLIMIT_MEMLOCK                %s; %s\n",
              l["rlimit_memlock"].get<std::string>().c_str(),
              l["pinning_charged"].get<std::string>().c_str());
  const json &b = j["backends"];
  std::printf("\nBackends\n  null       available (registers nothing)\n");
  const json &io = b["iouring"];
  if (io["available"].get<bool>()) {
    std::printf(
        "  iouring    available: fixed-buffer table of %u slots by default (at most %u), "
        "at most 1 GiB per buffer; test registration: %s\n",
        io["default_slots"].get<unsigned>(), io["max_slots"].get<unsigned>(),
        io.value("test_registration", "not tried").c_str());
  } else {
    std::printf("  iouring    unavailable: %s (kernel.io_uring_disabled=%s)\n",
                io["error"].get<std::string>().c_str(),
                io["io_uring_disabled"].get<std::string>().c_str());
  }
  const json &v = b["verbs"];
  if (v["devices"].empty()) {
    std::printf("  verbs      %s\n", v["note"].get<std::string>().c_str());
  } else {
    for (const json &d : v["devices"]) {
      std::printf("  verbs      %s: port 1 %s, %s, MTU %d\n", d["name"].get<std::string>().c_str(),
                  d.value("port1_state", "?").c_str(), d.value("port1_link_layer", "?").c_str(),
                  d.value("port1_active_mtu", 0));
    }
  }
}

}  // namespace

int main(int argc, char **argv) {
  mrc_tools::check_stdout_at_exit("mrcache-info");
  CLI::App app{
      "mrcache-info: what mrcache would do on this machine and why: version, effective "
      "configuration (MRC_* variables), the userfaultfd monitor mode, registration engines "
      "(io_uring, RDMA devices) and the limits that matter (RLIMIT_MEMLOCK, vm.max_map_count).",
      "mrcache-info"};
  bool as_json = false;
  app.add_flag("--json", as_json, "Print the same information as one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    std::string problem;
    const json j = gather(&problem);
    if (as_json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      print_text(j);
    }
    return problem.empty() ? 0 : 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "mrcache-info: %s\n", e.what());
    return 2;
  }
}
