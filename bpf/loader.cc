// SPDX-License-Identifier: BSD-3-Clause
// Loading the eBPF monitor's programs (loader.h): hooks chosen from the kernel's BTF, the
// skeleton loaded and attached, the clients' rings.
#include "bpf/loader.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include "base/error.h"
#include "bpf/abi.h"
#include "bpf/changes.skel.h"

namespace mrc::bpf {
namespace {

// Each kind's candidate hooks, best first: the program that attaches there and the kernel
// function's name (docs/DESIGN.md, "The eBPF monitor's hooks").
struct HookCandidate {
  const char *function;
  bpf_program *(*program)(changes *);
};

constexpr HookCandidate kUnmapHooks[] = {
    {"vms_gather_munmap_vmas", [](changes *s) { return s->progs.gather_munmap; }},
    {"do_vmi_align_munmap", [](changes *s) { return s->progs.align_munmap; }},
};
constexpr HookCandidate kRemapHooks[] = {
    {"do_mremap", [](changes *s) { return s->progs.do_mremap; }},
    {"__x64_sys_mremap", [](changes *s) { return s->progs.sys_mremap; }},
};
constexpr HookCandidate kMadviseHooks[] = {
    {"madvise_do_behavior", [](changes *s) { return s->progs.madvise_do_behavior; }},
    {"do_madvise", [](changes *s) { return s->progs.do_madvise; }},
};

// libbpf's first warning while loading: what a refusal's reason quotes.
thread_local char tls_libbpf_message[192];

// libbpf's printer signature: the format is libbpf's own.
__attribute__((format(printf, 2, 0))) int keep_libbpf_message(enum libbpf_print_level level,
                                                              const char *format, va_list args) {
  if (level == LIBBPF_DEBUG || tls_libbpf_message[0] != '\0') return 0;
  char line[sizeof tls_libbpf_message];
  if (vsnprintf(line, sizeof line, format, args) <= 1) return 0;
  const char *text = strncmp(line, "libbpf: ", 8) == 0 ? line + 8 : line;
  size_t length = strnlen(text, sizeof line);
  while (length > 0 && text[length - 1] == '\n') --length;
  memcpy(tls_libbpf_message, text, length);
  tls_libbpf_message[length] = '\0';
  return 0;
}

// Keeps the first candidate the kernel has, turns the others' autoload off. False (and the
// reason) when the kernel has none.
template <size_t kCount>
bool choose(changes *skeleton, const btf *kernel, const char *kind,
            const HookCandidate (&candidates)[kCount], const char **chosen) noexcept {
  static_assert(kCount == 2, "the reason below names two candidates");
  *chosen = nullptr;
  for (const HookCandidate &candidate : candidates) {
    const bool present = *chosen == nullptr &&
                         btf__find_by_name_kind(kernel, candidate.function, BTF_KIND_FUNC) >= 0;
    if (present) *chosen = candidate.function;
    bpf_program__set_autoload(candidate.program(skeleton), present);
  }
  if (*chosen != nullptr) return true;
  set_last_error("bpf monitor: the kernel's BTF has no hook for %s (neither %s nor %s)", kind,
                 candidates[0].function, candidates[1].function);
  return false;
}

mrc_status_t refused(const char *step, int error) noexcept {
  const char *hint = "";
  if (error == EPERM) {
    hint = geteuid() == 0 ? " (the kernel refuses trampoline programs: lockdown?)"
                          : " (needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN)";
  } else if (error == ESRCH || error == ENOENT) {
    hint = " (a hook the programs name is not in this kernel)";
  }
  // EPERM's hint says it all; libbpf's words help with the rest.
  const bool quote = error != EPERM && tls_libbpf_message[0] != '\0';
  set_last_error("bpf monitor: %s: %s%s%s%s", step, strerrorname_np(error), hint,
                 quote ? "; libbpf: " : "", quote ? tls_libbpf_message : "");
  return MRC_ERR_UNSUPPORTED;
}

}  // namespace

bool Programs::built() noexcept { return true; }

mrc_status_t Programs::load(Programs **out) noexcept {
  *out = nullptr;
  tls_libbpf_message[0] = '\0';
  // libbpf's printer is process-wide: ours only while loading, then the application's again.
  const libbpf_print_fn_t previous = libbpf_set_print(keep_libbpf_message);
  struct Restore {
    libbpf_print_fn_t previous;
    ~Restore() { libbpf_set_print(previous); }
  } restore{previous};

  btf *kernel = btf__load_vmlinux_btf();
  if (kernel == nullptr) return refused("reading the kernel's BTF", errno);
  changes *skeleton = changes__open();
  if (skeleton == nullptr) {
    const int error = errno;
    btf__free(kernel);
    return refused("opening the programs", error);
  }
  Hooks hooks;
  const bool chosen = choose(skeleton, kernel, "unmaps", kUnmapHooks, &hooks.unmap) &&
                      choose(skeleton, kernel, "mremap", kRemapHooks, &hooks.remap) &&
                      choose(skeleton, kernel, "madvise", kMadviseHooks, &hooks.madvise);
  btf__free(kernel);
  if (!chosen) {
    changes__destroy(skeleton);
    return MRC_ERR_UNSUPPORTED;
  }
  if (changes__load(skeleton) != 0) {
    const int error = errno;
    changes__destroy(skeleton);
    return refused("loading the programs", error);
  }
  if (bpf_map_freeze(bpf_map__fd(skeleton->maps.lost)) != 0) {
    const int error = errno;
    changes__destroy(skeleton);
    return refused("freezing the lost counters", error);
  }
  if (changes__attach(skeleton) != 0) {
    const int error = errno;
    changes__destroy(skeleton);
    return refused("attaching the programs", error);
  }
  auto *programs = new (std::nothrow) Programs();
  if (programs == nullptr) {
    changes__destroy(skeleton);
    set_last_error("bpf monitor: out of memory");
    return MRC_ERR_NO_MEMORY;
  }
  programs->skeleton_ = skeleton;
  programs->hooks_ = hooks;
  *out = programs;
  return MRC_OK;
}

void Programs::close() noexcept {
  changes__destroy(skeleton_);
  delete this;
}

mrc_status_t Programs::add_client(pid_t tgid, size_t ring_bytes, Client *out) noexcept {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (ring_bytes < page || (ring_bytes & (ring_bytes - 1)) != 0 || ring_bytes > (1UL << 30)) {
    set_last_error("bpf monitor: a ring of %zu bytes: not a power of two from a page to 1 GiB",
                   ring_bytes);
    return MRC_ERR_INVALID;
  }
  uint32_t slot = 0;
  while (slot < MRC_BPF_MAX_CLIENTS && (slots_used_ & (uint64_t{1} << slot)) != 0) ++slot;
  if (slot == MRC_BPF_MAX_CLIENTS) {
    set_last_error("bpf monitor: all %d client slots are taken", MRC_BPF_MAX_CLIENTS);
    return MRC_ERR_BUSY;
  }
  const int ring_fd = bpf_map_create(BPF_MAP_TYPE_RINGBUF, "mrc_changes", 0, 0,
                                     static_cast<uint32_t>(ring_bytes), nullptr);
  if (ring_fd < 0) {
    set_last_error("bpf monitor: creating a ring of %zu bytes: %s", ring_bytes,
                   strerrorname_np(errno));
    return MRC_ERR_IO;
  }
  const auto group = static_cast<uint32_t>(tgid);
  if (bpf_map_update_elem(bpf_map__fd(skeleton_->maps.rings), &slot, &ring_fd, BPF_ANY) != 0 ||
      bpf_map_update_elem(bpf_map__fd(skeleton_->maps.tgid_slot), &group, &slot, BPF_ANY) != 0) {
    const int error = errno;
    bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.rings), &slot);
    ::close(ring_fd);
    set_last_error("bpf monitor: registering client %d: %s", tgid, strerrorname_np(error));
    return MRC_ERR_IO;
  }
  slots_used_ |= uint64_t{1} << slot;
  *out = Client{.slot = slot, .ring_fd = ring_fd, .ring_bytes = ring_bytes};
  return MRC_OK;
}

void Programs::remove_client(const Client &client, pid_t tgid) noexcept {
  const auto group = static_cast<uint32_t>(tgid);
  bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.tgid_slot), &group);
  // The address spaces it taught the programs: an mm's address is reused once it is freed.
  const int mm_fd = bpf_map__fd(skeleton_->maps.mm_slot);
  uint64_t key = 0;
  bool has_key = false;
  uint64_t next = 0;
  while (bpf_map_get_next_key(mm_fd, has_key ? &key : nullptr, &next) == 0) {
    uint32_t slot = 0;
    const bool mine = bpf_map_lookup_elem(mm_fd, &next, &slot) == 0 && slot == client.slot;
    if (mine && bpf_map_delete_elem(mm_fd, &next) == 0) {
      has_key = false;  // the walk starts again: the deleted key cannot name the next one
      continue;
    }
    key = next;
    has_key = true;
  }
  bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.rings), &client.slot);
  slots_used_ &= ~(uint64_t{1} << client.slot);
}

int Programs::lost_fd() const noexcept { return bpf_map__fd(skeleton_->maps.lost); }

}  // namespace mrc::bpf
