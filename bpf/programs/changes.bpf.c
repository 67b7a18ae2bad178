// SPDX-License-Identifier: BSD-3-Clause
// The eBPF monitor's programs: at the kernel's choke points for address-space changes, in the
// changing thread, before anything is detached or freed, one record per change of a client's
// address space into that client's ring (docs/DESIGN.md, "The eBPF monitor's hooks").
//
// 1. Each kind of change has candidate hooks, one program each; the loader (loader.cc) keeps
//    the first candidate the running kernel's BTF has and leaves the others unloaded.
// 2. Clients are address spaces: mm_slot maps an mm to its slot; a thread of a registered
//    thread group teaches it its mm at its first change (vfork and CLONE_VM children share it).
// 3. A full ring counts the change in the client's lost counter instead: the client then
//    trusts nothing it cached.
//
// Built with clang for the bpf target against the few kernel fields it reads, declared below
// with preserve_access_index: libbpf relocates them to the running kernel's layout (CO-RE), so
// one object serves every kernel whose BTF has the hooks.
#include <linux/bpf.h>
#include <linux/types.h>

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "bpf/abi.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// ---- the kernel's fields this reads (names as in its BTF; offsets relocated at load) ----

struct mm_struct {
} __attribute__((preserve_access_index));

struct task_struct {
  struct mm_struct *mm;
} __attribute__((preserve_access_index));

struct vm_area_struct {
  struct mm_struct *vm_mm;
} __attribute__((preserve_access_index));

struct vma_munmap_struct {
  struct vm_area_struct *vma;
  unsigned long start;
  unsigned long end;
} __attribute__((preserve_access_index));

struct vma_remap_struct {
  unsigned long addr;
  unsigned long old_len;
} __attribute__((preserve_access_index));

struct madvise_behavior {
  struct mm_struct *mm;
  int behavior;
} __attribute__((preserve_access_index));

struct pt_regs {
  unsigned long di;
  unsigned long si;
} __attribute__((preserve_access_index));

// ---- maps ----

struct client_ring {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 20);  // a template: each client's ring has its own size
};

// slot -> the client's ring.
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
  __uint(max_entries, MRC_BPF_MAX_CLIENTS);
  __type(key, __u32);
  __array(values, struct client_ring);
} rings SEC(".maps");

// Thread group id -> slot: written by the loader when a client registers.
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4 * MRC_BPF_MAX_CLIENTS);
  __type(key, __u32);
  __type(value, __u32);
} tgid_slot SEC(".maps");

// Address space -> slot: learnt by the programs, cleared by the loader when a client leaves.
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4 * MRC_BPF_MAX_CLIENTS);
  __type(key, __u64);
  __type(value, __u32);
} mm_slot SEC(".maps");

// lost[slot * MRC_BPF_LOST_STRIDE]: changes that found the client's ring full. Mapped read-only
// by the clients (the loader freezes it).
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MRC_BPF_MAX_CLIENTS *MRC_BPF_LOST_STRIDE);
  __uint(map_flags, BPF_F_MMAPABLE);
  __type(key, __u32);
  __type(value, __u64);
} lost SEC(".maps");

// ---- the record ----

static __always_inline int slot_of(struct mm_struct *mm, __u32 *slot) {
  __u64 key = (__u64)mm;
  __u32 *known = bpf_map_lookup_elem(&mm_slot, &key);
  if (known) {
    *slot = *known;
    return 1;
  }
  // Learn the mm of a registered thread group from its own thread: only then is it current's.
  struct task_struct *task = bpf_get_current_task_btf();
  if (!mm || (__u64)task->mm != key) return 0;
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  __u32 *registered = bpf_map_lookup_elem(&tgid_slot, &tgid);
  if (!registered) return 0;
  *slot = *registered;
  bpf_map_update_elem(&mm_slot, &key, registered, BPF_ANY);
  return 1;
}

static __always_inline void emit(struct mm_struct *mm, __u32 kind, __u32 aux, __u64 start,
                                 __u64 end) {
  __u32 slot;
  if (!slot_of(mm, &slot)) return;
  void *ring = bpf_map_lookup_elem(&rings, &slot);
  if (!ring) return;
  struct mrc_bpf_change *record = bpf_ringbuf_reserve(ring, sizeof(*record), 0);
  if (!record) {
    __u32 index = slot * MRC_BPF_LOST_STRIDE;
    __u64 *count = bpf_map_lookup_elem(&lost, &index);
    if (count) __sync_fetch_and_add(count, 1);
    return;
  }
  record->kind = kind;
  record->aux = aux;
  record->start = start;
  record->end = end;
  // No wakeup: clients compare positions, they never sleep on the ring.
  bpf_ringbuf_submit(record, BPF_RB_NO_WAKEUP);
}

// The kernel acts on whole pages: munmap(p, 100) unmaps p's whole page.
static __always_inline __u64 page_end(__u64 start, __u64 length) {
  return (start + length + 4095) & ~4095ULL;
}

// Advice that takes pages away; the rest (WILLNEED, COLD, PAGEOUT, ...) leaves pinned pages be.
static __always_inline int drops_pages(int advice) {
  return advice == 4 /* DONTNEED */ || advice == 8 /* FREE */ || advice == 9 /* REMOVE */ ||
         advice == 24 /* DONTNEED_LOCKED */ || advice == 100 /* HWPOISON */ ||
         advice == 101 /* SOFT_OFFLINE */ || advice == 102 /* GUARD_INSTALL */;
}

// ---- unmaps: munmap, brk shrink, shmdt, MAP_FIXED over, shmat(SHM_REMAP), mremap's unmaps ----

// Under the mmap write lock, before the VMAs are detached (6.12+).
SEC("fentry/vms_gather_munmap_vmas")
int BPF_PROG(gather_munmap, struct vma_munmap_struct *vms) {
  struct vm_area_struct *vma = vms->vma;
  if (!vma) return 0;
  emit(vma->vm_mm, MRC_BPF_CHANGE_UNMAP, MRC_BPF_HOOK_GATHER_MUNMAP, vms->start, vms->end);
  return 0;
}

// Its caller, where vms_gather_munmap_vmas is not a function of its own.
SEC("fentry/do_vmi_align_munmap")
int BPF_PROG(align_munmap, void *vmi, struct vm_area_struct *vma, struct mm_struct *mm,
             unsigned long start, unsigned long end) {
  emit(mm, MRC_BPF_CHANGE_UNMAP, MRC_BPF_HOOK_ALIGN_MUNMAP, start, end);
  return 0;
}

// ---- mremap: its old range, whatever it becomes (moved, shrunk, grown, DONTUNMAP) ----

SEC("fentry/do_mremap")
int BPF_PROG(do_mremap, struct vma_remap_struct *remap) {
  struct task_struct *task = bpf_get_current_task_btf();
  emit(task->mm, MRC_BPF_CHANGE_REMAP, MRC_BPF_HOOK_DO_MREMAP, remap->addr,
       page_end(remap->addr, remap->old_len));
  return 0;
}

// The system call's entry, where no mremap function of the kernel's own is one (6.12).
SEC("fentry/__x64_sys_mremap")
int BPF_PROG(sys_mremap, struct pt_regs *regs) {
  struct task_struct *task = bpf_get_current_task_btf();
  unsigned long start = regs->di;
  emit(task->mm, MRC_BPF_CHANGE_REMAP, MRC_BPF_HOOK_SYS_MREMAP, start, page_end(start, regs->si));
  return 0;
}

// ---- madvise: the behaviour dispatcher madvise, process_madvise and io_uring share ----

SEC("fentry/madvise_do_behavior")
int BPF_PROG(madvise_do_behavior, unsigned long start, unsigned long length,
             struct madvise_behavior *behavior) {
  int advice = behavior->behavior;
  if (drops_pages(advice)) {
    emit(behavior->mm, MRC_BPF_CHANGE_MADVISE, advice, start, page_end(start, length));
  }
  return 0;
}

SEC("fentry/do_madvise")
int BPF_PROG(do_madvise, struct mm_struct *mm, unsigned long start, unsigned long length,
             int advice) {
  if (drops_pages(advice)) emit(mm, MRC_BPF_CHANGE_MADVISE, advice, start, page_end(start, length));
  return 0;
}
