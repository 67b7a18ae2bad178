// SPDX-License-Identifier: BSD-3-Clause
// The unmap probe: one ioctl that tells whether changes of watched memory are in flight
// (docs/DESIGN.md, "Exact under concurrent unmaps"). Internal to uffd/: the cache reaches it
// through Subscription::probe_unmaps() only. Any thread, no lock.
//
// Inline on purpose, like probe_unmaps(): an exact get probes on every hit, and each function
// level between the get and its ioctl cost about 20 ns here (a return after a system call is
// mispredicted; docs/DESIGN.md, "Kernel facts probed on this machine"). mrcache-bench's
// BM_CacheHit/exact against BM_ProbeThenFastHit shows what the remaining levels cost.
#pragma once

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#include <atomic>
#include <cerrno>

namespace mrc::bpf {
class RingConsumer;
}  // namespace mrc::bpf

namespace mrc::uffd::detail {

enum class ProbeAnswer { Clear, Changing, Refused };

// What g_probe_fd holds when no descriptor answers the probe.
inline constexpr int kProbeNoMonitor = -1;
inline constexpr int kProbeRefused = -2;

// The descriptor gets probe (any thread, no lock): the running monitor's userfaultfd,
// kProbeNoMonitor, or kProbeRefused. Stored (release) by start_locked() before any range is
// watched, kProbeNoMonitor before the descriptor is closed; it changes only while no cache
// exists, or in a forked child. Defined in monitor.cc, beside g_monitor.
extern std::atomic<int> g_probe_fd;

// The eBPF monitor's ring (bpf/ring.h) while it is the mode, else null: the exactness check of
// that mode, which needs no probe. Same rules as g_probe_fd (stored with release before any
// subscription reads it, null before the ring is closed, changed only while no cache exists or
// in a forked child). Defined in monitor.cc.
extern std::atomic<bpf::RingConsumer *> g_bpf_ring;

// The kernel counts changes of watched memory in ctx->mmap_changing: raised inside the mmap
// lock before an unmap, a moving or shrinking mremap, or a madvise(DONTNEED/FREE/REMOVE) takes
// anything away, lowered by the changing thread once the monitor has read its event. Every
// UFFDIO_ZEROPAGE checks it first and fails with EAGAIN while it is raised; an empty range is
// refused (EINVAL) before any page-table work or lock. So this ioctl is a pure probe.
[[gnu::always_inline]] inline ProbeAnswer probe_mmap_changing(int uffd) noexcept {
  uffdio_zeropage probe{};
  if (ioctl(uffd, UFFDIO_ZEROPAGE, &probe) == 0) return ProbeAnswer::Refused;
  if (errno == EINVAL) return ProbeAnswer::Clear;
  return errno == EAGAIN ? ProbeAnswer::Changing : ProbeAnswer::Refused;
}

}  // namespace mrc::uffd::detail
