// SPDX-License-Identifier: BSD-3-Clause
// Negotiation: the userfaultfd mode (MRC_MONITOR, the kernel's features, a trial registration)
// and the unmap probe (see internal/negotiation.h).
//
// SYNCHRONIZATION: see internal/monitor_state.h (negotiate() runs under the registry mutex; the
// probe is one ioctl, any thread).
#include "uffd/internal/negotiation.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "uffd/internal/kernel.h"
#include "uffd/modes.h"

// Valgrind's client request, when its header is installed (Debian: valgrind); without it the
// preload valgrind puts into the environment tells (running_under_valgrind).
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define MRC_HAVE_VALGRIND_H 1
#endif

namespace mrc::uffd::detail {

namespace {

constexpr uint64_t kRequiredEvents =
    UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_EVENT_REMOVE;

struct Opened {
  int fd = -1;
  const char *how = "";
};

// The ways to get a userfaultfd, in order: user-mode-only (works unprivileged since 5.11),
// plain (root or vm.unprivileged_userfaultfd=1), /dev/userfaultfd (its file mode decides).
Opened open_uffd(bool allow_user_mode_only, Text *failures) noexcept {
  const int flags = O_CLOEXEC | O_NONBLOCK;
  Opened opened;
  if (allow_user_mode_only) {
    opened.fd = static_cast<int>(syscall(SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY));
    opened.how = "userfaultfd(UFFD_USER_MODE_ONLY)";
    if (opened.fd >= 0) return opened;
    failures->add("%s: %s; ", opened.how, strerrorname_np(errno));
  }
  opened.fd = static_cast<int>(syscall(SYS_userfaultfd, flags));
  opened.how = "userfaultfd()";
  if (opened.fd >= 0) return opened;
  failures->add("%s: %s; ", opened.how, strerrorname_np(errno));
  opened.how = "/dev/userfaultfd";
  const int device = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (device >= 0) {
    opened.fd = ioctl(device, USERFAULTFD_IOC_NEW, flags);
    const int error = errno;
    close(device);
    if (opened.fd >= 0) return opened;
    failures->add("%s: %s; ", opened.how, strerrorname_np(error));
  } else {
    failures->add("%s: %s; ", opened.how, strerrorname_np(errno));
  }
  opened.fd = -1;
  return opened;
}

// UFFDIO_API; on success *granted holds the features now enabled (or, for request 0, offered).
bool uffd_api(int fd, uint64_t request, uint64_t *granted) noexcept {
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = request;
  if (ioctl(fd, UFFDIO_API, &api) != 0) return false;
  *granted = api.features;
  return true;
}

// Registers and unregisters one scratch page: proves the mode works before we promise it.
bool probe_registration(int fd, uint64_t register_mode, int *error) noexcept {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void *scratch = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (scratch == MAP_FAILED) {
    *error = errno;
    return false;
  }
  uffdio_register request{};
  request.range.start = reinterpret_cast<uintptr_t>(scratch);
  request.range.len = page;
  request.mode = register_mode;
  const bool ok = ioctl(fd, UFFDIO_REGISTER, &request) == 0;
  *error = ok ? 0 : errno;
  if (ok) {
    // Unregister first: with the registration in place this munmap would wait for a reader.
    (void)ioctl(fd, UFFDIO_UNREGISTER, &request.range);
  }
  munmap(scratch, page);
  return ok;
}

// Valgrind runs one thread at a time, and a thread in munmap keeps its lock: the kernel holds that
// munmap of watched memory until the monitor thread has read its event, and the monitor cannot
// run until the munmap returns. The first unmap of cached memory would hang the process, so no
// userfaultfd mode works under valgrind. Returns how valgrind was recognised, or nullptr.
const char *running_under_valgrind() noexcept {
#if defined(MRC_HAVE_VALGRIND_H)
  // A magic instruction sequence: 0 natively, cheap, no library call.
  if (RUNNING_ON_VALGRIND != 0) return "RUNNING_ON_VALGRIND";
  return nullptr;
#else
  // valgrind preloads vgpreload_core-<arch>.so (and its tool's vgpreload_<tool>-<arch>.so).
  const char *preload = getenv("LD_PRELOAD");  // NOLINT(concurrency-mt-unsafe): no setenv here
  return preload != nullptr && strstr(preload, "vgpreload") != nullptr ? "LD_PRELOAD has vgpreload"
                                                                       : nullptr;
#endif
}

// What MRC_MONITOR asks for: the best mode that works (automatic), or one mode (uncached: "off").
struct Wanted {
  bool automatic = true;
  mrc_monitor_mode_t mode = MRC_MONITOR_UNCACHED;
  bool understood = true;  // false: a value the mode table does not know (then automatic)
};

Wanted wanted_mode(const char *value) noexcept {
  Wanted wanted;
  if (value == nullptr || *value == '\0' || strcmp(value, detail::kAutoModeSetting) == 0)
    return wanted;
  wanted.automatic = !detail::parse_mode_setting(value, &wanted.mode);
  wanted.understood = !wanted.automatic;
  return wanted;
}

// What MRC_MONITOR (`env`) asks for. A value it does not understand goes into the reason, with
// the values it does.
Wanted read_wanted(const char *env, Text *why) noexcept {
  const Wanted wanted = wanted_mode(env);
  if (!wanted.understood) {
    why->add("MRC_MONITOR=%s not understood (%s", env, detail::kAutoModeSetting);
    for (const detail::ModeSpelling &spelling : detail::kModeSpellings)
      why->add(", %s", spelling.setting);
    why->add("); ");
  }
  return wanted;
}

// The features a userfaultfd of any kind offers. false, with the reason, when none opens or the
// kernel lacks the events every mode needs.
bool probe_features(uint64_t *offered, Text *why) noexcept {
  char failures_buf[192] = "";
  Text failures{failures_buf, sizeof(failures_buf)};
  Opened opened = open_uffd(true, &failures);
  if (opened.fd >= 0 && !uffd_api(opened.fd, 0, offered)) {
    failures.add("UFFDIO_API: %s; ", strerrorname_np(errno));
    close(opened.fd);
    opened.fd = -1;
  }
  if (opened.fd < 0) {
    why->add(
        "userfaultfd unavailable (%s) (seccomp, vm.unprivileged_userfaultfd=0 or a kernel "
        "without it); every get registers, the last put deregisters",
        failures.trimmed());
    return false;
  }
  close(opened.fd);
  if ((*offered & kRequiredEvents) != kRequiredEvents) {
    why->add("the kernel's userfaultfd lacks UNMAP/REMAP/REMOVE events (features %#" PRIx64
             "); every get registers, the last put deregisters",
             *offered);
    return false;
  }
  return true;
}

struct Candidate {
  mrc_monitor_mode_t mode;
  uint64_t needs;
  uint64_t register_mode;
};

// Best first, as kModeSpellings lists them.
constexpr Candidate kCandidates[] = {
    {MRC_MONITOR_WP_ASYNC, UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_PAGEFAULT_FLAG_WP,
     UFFDIO_REGISTER_MODE_WP},
    {MRC_MONITOR_WP, UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFDIO_REGISTER_MODE_WP},
    {MRC_MONITOR_MISSING, 0, UFFDIO_REGISTER_MODE_MISSING},
};

// The features to enable for `mode`: the events, plus write-protection of shmem and hugetlbfs
// where the kernel offers it.
uint64_t features_to_request(mrc_monitor_mode_t mode, uint64_t offered) noexcept {
  const uint64_t wp_shmem = offered & UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
  uint64_t request = kRequiredEvents;
  if (mode == MRC_MONITOR_WP_ASYNC) request |= UFFD_FEATURE_WP_ASYNC | wp_shmem;
  if (mode == MRC_MONITOR_WP) request |= wp_shmem;
  return request;
}

// Tries one mode for real: a userfaultfd of its own, its features enabled, a scratch page
// registered. On success fills *result (the fd is its) and *how; otherwise adds why to *failures.
bool try_mode(const Candidate &candidate, uint64_t offered, Negotiated *result, const char **how,
              Text *failures) noexcept {
  const char *name = detail::mode_name(candidate.mode);
  if ((offered & candidate.needs) != candidate.needs) {
    failures->add("%s: kernel lacks %s; ", name,
                  candidate.mode == MRC_MONITOR_WP_ASYNC ? "UFFD_FEATURE_WP_ASYNC (6.7)"
                                                         : "write-protect support (5.7)");
    return false;
  }
  // MISSING mode needs the kernel's own accesses to fault through us too: with
  // UFFD_USER_MODE_ONLY a read(2) or an ibv_reg_mr on an untouched watched page would fail
  // with EFAULT instead of waiting for the zero page.
  const bool user_mode_only_ok = candidate.mode != MRC_MONITOR_MISSING;
  Opened fd = open_uffd(user_mode_only_ok, failures);
  if (fd.fd < 0) return false;
  uint64_t granted = 0;
  int error = 0;
  if (!uffd_api(fd.fd, features_to_request(candidate.mode, offered), &granted)) {
    failures->add("%s: UFFDIO_API %s; ", name, strerrorname_np(errno));
    close(fd.fd);
    return false;
  }
  if (!probe_registration(fd.fd, candidate.register_mode, &error)) {
    failures->add("%s: UFFDIO_REGISTER %s; ", name, strerrorname_np(error));
    close(fd.fd);
    return false;
  }
  result->mode = candidate.mode;
  result->fd = fd.fd;
  result->features = granted;
  result->register_mode = candidate.register_mode;
  *how = fd.how;
  return true;
}

// The reason for the mode chosen: what it watches, how the fd was got, whether the unmap probe
// answers, and what failed before it.
void record_chosen(const Wanted &wanted, const char *env, const char *how, Text *failures,
                   Negotiated *result, Text *why) noexcept {
  switch (result->mode) {
    case MRC_MONITOR_WP_ASYNC:
      why->add(
          "%s with UFFD_FEATURE_WP_ASYNC: write-protect-only registration watches any "
          "mapping and never faults",
          how);
      break;
    case MRC_MONITOR_WP:
      why->add(
          "%s, write-protect-only registration: anonymous, shmem and hugetlbfs memory; "
          "file mappings need UFFD_FEATURE_WP_ASYNC (Linux 6.7)",
          how);
      break;
    default:
      why->add(
          "%s, MISSING mode: the monitor resolves every fault in watched mappings with a "
          "zero page; private anonymous memory only (write-protect mode needs Linux 5.7)",
          how);
      break;
  }
  if (!wanted.automatic) why->add(" (MRC_MONITOR=%s)", env);
  // Nothing is watched yet, so nothing can be in flight: any answer but Clear means the
  // kernel (or a sandbox) refuses the probe, and exact caches must not trust their tables.
  result->probe_ok = probe_mmap_changing(result->fd) == ProbeAnswer::Clear;
  why->add(result->probe_ok ? "; exact gets: one unmap probe (UFFDIO_ZEROPAGE) each"
                            : "; the kernel refuses the unmap probe (UFFDIO_ZEROPAGE): exact "
                              "caches register every get anew");
  if (failures->used > 0) why->add("; tried first: %s", failures->trimmed());
}

// The reason when no mode (or not the one MRC_MONITOR forces) works: what each attempt met.
void record_none_works(const Wanted &wanted, const char *env, Text *failures, Text *why) noexcept {
  if (!wanted.automatic) {
    why->add("MRC_MONITOR=%s cannot run here (%s); every get registers, the last put deregisters",
             env, failures->trimmed());
  } else {
    why->add("no userfaultfd mode works (%s); every get registers, the last put deregisters",
             failures->trimmed());
  }
}

}  // namespace

Negotiated negotiate(char *reason, size_t reason_len) noexcept {
  Negotiated result;
  Text why{reason, reason_len};
  const char *env = getenv("MRC_MONITOR");  // NOLINT(concurrency-mt-unsafe): no setenv here
  const Wanted wanted = read_wanted(env, &why);
  if (!wanted.automatic && wanted.mode == MRC_MONITOR_UNCACHED) {
    why.add("MRC_MONITOR=%s: no userfaultfd; every get registers, the last put deregisters", env);
    return result;
  }
  if (const char *how = running_under_valgrind()) {
    // Whatever MRC_MONITOR asks: any mode with a monitor thread would hang at the first unmap.
    // "unavailable": the process says so once (one line on stderr, monitor.cc).
    result.unavailable = true;
    why.add(
        "running under valgrind (%s), which runs one thread at a time: an unmap of watched "
        "memory would wait forever for the monitor thread, so no userfaultfd is used; every get "
        "registers, the last put deregisters",
        how);
    return result;
  }
  // The eBPF monitor was asked for but could not start (start_locked tried it first): the best
  // userfaultfd mode instead.
  const Wanted uffd_wanted = wanted.mode == MRC_MONITOR_BPF ? Wanted{} : wanted;
  uint64_t offered = 0;
  if (!probe_features(&offered, &why)) {
    result.unavailable = true;
    return result;
  }

  char failures_buf[192] = "";
  Text failures{failures_buf, sizeof(failures_buf)};
  for (const Candidate &candidate : kCandidates) {
    if (!uffd_wanted.automatic && candidate.mode != uffd_wanted.mode) continue;
    const char *how = "";
    if (try_mode(candidate, offered, &result, &how, &failures)) {
      record_chosen(uffd_wanted, env, how, &failures, &result, &why);
      return result;
    }
  }
  result.unavailable = true;
  record_none_works(uffd_wanted, env, &failures, &why);
  return result;
}

// getenv: no thread of ours calls setenv.
bool bpf_wanted() noexcept {
  const char *env = getenv("MRC_MONITOR");  // NOLINT(concurrency-mt-unsafe)
  return wanted_mode(env).mode == MRC_MONITOR_BPF;
}

bool auto_wanted() noexcept {
  const char *env = getenv("MRC_MONITOR");  // NOLINT(concurrency-mt-unsafe)
  return wanted_mode(env).automatic;
}

}  // namespace mrc::uffd::detail
