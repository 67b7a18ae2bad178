// SPDX-License-Identifier: BSD-3-Clause
// The loader (loader.h) of a build without the BPF toolchain: nothing loads, and load() says
// what the build lacked.
#include "bpf/loader.h"

#include "base/error.h"

namespace mrc::bpf {

bool Programs::built() noexcept { return false; }

mrc_status_t Programs::load(Programs **out) noexcept {
  *out = nullptr;
  set_last_error(
      "bpf monitor: this build has no eBPF programs (it needs clang, bpftool and libbpf-dev)");
  return MRC_ERR_UNSUPPORTED;
}

// Unreachable: no Programs exists in this build.
void Programs::close() noexcept {}
mrc_status_t Programs::add_client(pid_t, size_t, Client *) noexcept { return MRC_ERR_UNSUPPORTED; }
void Programs::remove_client(const Client &, pid_t) noexcept {}
int Programs::lost_fd() const noexcept { return -1; }

}  // namespace mrc::bpf
