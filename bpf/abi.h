/* SPDX-License-Identifier: BSD-3-Clause */
/* The layout the eBPF monitor's programs (programs/changes.bpf.c) share with user space: one
 * record per change of a watched address space, the client slots, the lost counters. C, so that
 * the BPF programs and the library read the same definitions (docs/DESIGN.md, "The eBPF ring"). */
#ifndef MRC_BPF_ABI_H
#define MRC_BPF_ABI_H

/* Address spaces (clients) one loading of the programs serves. */
#define MRC_BPF_MAX_CLIENTS 64
/* u64 counters per client in the lost array: each client's counter on a cache line of its own. */
#define MRC_BPF_LOST_STRIDE 8

/* What changed. Every range is [start, end), page-aligned; end ~0: to the top. */
enum mrc_bpf_change_kind {
  MRC_BPF_CHANGE_UNMAP = 1,   /* munmap, brk shrink, shmdt, MAP_FIXED over, an mremap's unmaps */
  MRC_BPF_CHANGE_REMAP = 2,   /* mremap: the old range (moved, shrunk, DONTUNMAP) */
  MRC_BPF_CHANGE_MADVISE = 3, /* madvise, process_madvise, io_uring: pages dropped; aux = advice */
  MRC_BPF_CHANGE_PURGE = 6    /* a change whose range could not be read: everything */
};

/* Which program wrote a record (mrc_bpf_change.aux for the unmap and remap kinds). */
enum mrc_bpf_hook {
  MRC_BPF_HOOK_GATHER_MUNMAP = 1,
  MRC_BPF_HOOK_ALIGN_MUNMAP = 2,
  MRC_BPF_HOOK_DO_MREMAP = 3,
  MRC_BPF_HOOK_SYS_MREMAP = 4
};

struct mrc_bpf_change {
  unsigned int kind; /* enum mrc_bpf_change_kind */
  unsigned int aux;
  unsigned long long start;
  unsigned long long end;
};

#endif /* MRC_BPF_ABI_H */
