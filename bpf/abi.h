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

/* What changed (mrc_bpf_change.kind). Every range is [start, end), page-aligned; end ~0: to the
 * top. Macros, not an enum: the BPF programs' C and the library's C++ read the same values. */
/* munmap, brk shrink, shmdt, MAP_FIXED over a mapping, the unmaps of an mremap */
#define MRC_BPF_CHANGE_UNMAP 1
/* mremap: the old range (moved, shrunk, grown, DONTUNMAP) */
#define MRC_BPF_CHANGE_REMAP 2
/* madvise, process_madvise, io_uring: pages dropped; aux = the advice */
#define MRC_BPF_CHANGE_MADVISE 3
/* a change whose range could not be read: everything */
#define MRC_BPF_CHANGE_PURGE 6

/* Which program wrote an unmap or remap record (mrc_bpf_change.aux). */
#define MRC_BPF_HOOK_GATHER_MUNMAP 1
#define MRC_BPF_HOOK_ALIGN_MUNMAP 2
#define MRC_BPF_HOOK_DO_MREMAP 3
#define MRC_BPF_HOOK_SYS_MREMAP 4

struct mrc_bpf_change {
  unsigned int kind; /* MRC_BPF_CHANGE_* */
  unsigned int aux;
  unsigned long long start;
  unsigned long long end;
};

#endif /* MRC_BPF_ABI_H */
