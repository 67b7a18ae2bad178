// SPDX-License-Identifier: BSD-3-Clause
// What a process and mrcache-bpfd say over the daemon's unix socket (SOCK_SEQPACKET): one
// Hello from the process, one Welcome back, with the process's ring and the lost counters as
// descriptors (SCM_RIGHTS) when it was granted one (docs/DESIGN.md, "The eBPF monitor's daemon").
//
// 1. The daemon knows the process by SO_PEERCRED: the ring reports the changes of the address
//    space of the thread group that connected, whoever later holds the descriptors.
// 2. The connection is the registration: the daemon forgets the process when it closes (exit,
//    exec: the socket is close-on-exec).
#pragma once

#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::bpf {

// Where the daemon listens unless MRC_BPFD_SOCKET names another path.
inline constexpr const char *kDefaultSocket = "/run/mrcache/bpfd.sock";
inline constexpr uint32_t kProtocolMagic = 0x6d726266;  // "mrbf"
inline constexpr uint32_t kProtocolVersion = 1;

struct Hello {
  uint32_t magic = kProtocolMagic;
  uint32_t version = kProtocolVersion;
  uint64_t ring_bytes = 0;  // 0: the daemon's default
};

struct Welcome {
  uint32_t magic = kProtocolMagic;
  int32_t status = MRC_OK;  // mrc_status_t; not MRC_OK: no descriptors, `reason` says why
  uint32_t slot = 0;        // the client's counter in the lost array
  uint32_t unused = 0;
  uint64_t ring_bytes = 0;
  char hooks[3][48] = {};  // the functions the unmap, mremap and madvise programs attach to
  char reason[200] = {};
};

}  // namespace mrc::bpf
