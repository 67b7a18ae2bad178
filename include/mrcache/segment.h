// SPDX-License-Identifier: BSD-3-Clause
/* mrcache shared segments (mrc_seg_*). Included by <mrcache/mrcache.h>; do not include
 * directly.
 *
 * A domain (like VPP's svm root region) is a name space (`prefix`) and a window of virtual
 * addresses that every member process reserves at the same place. Named segments are carved out
 * of that window, so each segment sits at the same address in every process and raw pointers
 * into it stay valid across processes. The first process creates the domain, later ones join;
 * the last one out removes it. Files live in /dev/shm as "<prefix>:root" and
 * "<prefix>:<generation>.<tag>:<name>" (tag: 16 random hex digits, so no other local user can
 * create a segment's file before it); they are created 0600 (or the domain's mode, never
 * world-writable) with O_EXCL, and removed only with shm_unlink. Files of the prefix that are not
 * the domain's (another user's) cost nothing: check, repair and remove skip them, describe lists
 * them.
 *
 * Shared memory is input: any process of the domain (or a peer that sent a memfd segment) can
 * write anything into the root, the directory, the client table or a heap header. Every value is
 * checked before use (range, alignment, inside the window, inside the mapping); a bad one makes
 * the call return MRC_ERR_IO with the structure and field named in mrc_seg_last_error(), and
 * nothing outside the window or the segment's mapping is touched. A client slot in a state that
 * is neither free nor used is reaped by scan (and by a join that finds no free slot).
 *
 * Threads: every call is thread-safe. A handle must not be used after it was closed.
 * fork(): a child must not use the domain or segment handles of its parent (calls return
 * MRC_ERR_INVALID there), except the segments it inherited: their base, size and heap work, and
 * mrc_seg_close unmaps one in the child only (the directory, and the parent's registration, stay
 * the parent's). While the child still has inherited segments of a domain open, opening that
 * domain again returns MRC_ERR_BUSY (and changes nothing): joining anew replaces the inherited
 * window, which would pull the memory from under them. After closing them it opens the domain
 * again as a new client.
 * Errors: status codes; mrc_seg_last_error() tells the calling thread why the last call failed.
 */
#ifndef MRCACHE_SEGMENT_H
#define MRCACHE_SEGMENT_H

#include "mrcache/mrcache.h" /* the types it builds on; mrcache.h includes this file last */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mrc_seg_domain mrc_seg_domain_t;
typedef struct mrc_seg mrc_seg_t;

typedef struct {
  size_t struct_size;       /* sizeof(mrc_seg_domain_params_t); set by mrc_seg_domain_params_init
                               (the size rule: top of mrcache.h) */
  const char *prefix;       /* name space, like VPP's root_path; NULL = "mrcache" */
  uintptr_t base;           /* 0 = the default window for this architecture */
  size_t size;              /* size of the virtual-address window; 0 = default */
  unsigned mode;            /* file mode; 0 = 0600; never world-writable */
  int uid, gid;             /* -1 = the caller's */
  unsigned join_timeout_ms; /* how long a joiner waits for the creator; 0 = default */
} mrc_seg_domain_params_t;
/* The smallest struct_size accepted: the first layout that carried one (0.2). */
#define MRC_SEG_DOMAIN_PARAMS_SIZE_0_2 \
  (offsetof(mrc_seg_domain_params_t, join_timeout_ms) + sizeof(unsigned))

enum {
  MRC_SEG_HEAP = 1,     /* the segment carries a heap usable from every process */
  MRC_SEG_NODATA = 2,   /* no memory: a named address range reserved (PROT_NONE) everywhere */
  MRC_SEG_FILE = 4,     /* data in mrc_seg_params_t.backing_file (never unlinked by mrcache) */
  MRC_SEG_HUGETLB = 8,  /* memfd segments: huge pages (MFD_HUGETLB) */
  MRC_SEG_EXCL = 16,    /* create only: MRC_ERR_EXISTS when the segment exists */
  MRC_SEG_NOCREATE = 32 /* join only: MRC_ERR_NOT_FOUND when it does not exist */
};

/* Defaults for every field. The default window (x86-64): a 64 GiB window placed at a random
 * 1 GiB boundary inside [0x580000000000, 0x5a0000000000); joiners with base 0 accept any window
 * inside that range. With base set, the window is exactly [base, base + size). */
MRC_API void mrc_seg_domain_params_init(mrc_seg_domain_params_t *params);
/* Create or join. MRC_ERR_INVALID: bad params, a root file owned by another user, with looser
 * permissions than `mode`, or a hostile/foreign header; MRC_ERR_EXISTS: something is already
 * mapped in this process where the window goes; MRC_ERR_BUSY: the creator did not finish within
 * join_timeout_ms, or (fork child) segments inherited from the parent are still open here;
 * MRC_ERR_NO_MEMORY: every client slot is taken by a live process. A process that opens the same
 * prefix twice gets the same domain, reference-counted. */
MRC_API mrc_status_t mrc_seg_domain_open(const mrc_seg_domain_params_t *params,
                                         mrc_seg_domain_t **out);
/* Attach as an observer (what mrcache-seg does): no client slot, no window; describe, info,
 * check, scan, repair and remove work, mrc_seg_open does not. With base and size 0 it accepts a
 * window anywhere (it maps nothing there). MRC_ERR_NOT_FOUND when there is no domain under that
 * prefix. */
MRC_API mrc_status_t mrc_seg_domain_inspect(const mrc_seg_domain_params_t *params,
                                            mrc_seg_domain_t **out);
/* Remove clients that died (their presence lock was released by the kernel), slots in a state
 * that is neither free nor used (garbage) whose presence lock no live process holds, and the
 * segments that only they used. */
MRC_API mrc_status_t mrc_seg_domain_scan(mrc_seg_domain_t *domain);
/* Leave the domain. MRC_ERR_BUSY (nothing changed) while this process still has segments of
 * this handle open. The last process out removes the remaining segments and the root file. */
MRC_API mrc_status_t mrc_seg_domain_close(mrc_seg_domain_t *domain);

typedef struct {
  uintptr_t base; /* the window */
  size_t size;
  size_t va_page_size; /* granule of the window's page bitmap */
  size_t pages_total, pages_used;
  unsigned clients;        /* client slots in use */
  unsigned segments;       /* directory entries in use */
  int slot;                /* this process's client slot; -1 for an observer */
  int created;             /* this process created the domain */
  uint64_t domain_id;      /* random, fixed for the life of the domain */
  uint64_t repairs;        /* recoveries after a process died holding the domain lock */
  uint64_t clients_reaped; /* dead clients removed by scans */
} mrc_seg_domain_info_t;
MRC_API mrc_status_t mrc_seg_domain_info(mrc_seg_domain_t *domain, mrc_seg_domain_info_t *info);

enum { MRC_SEG_DESCRIBE_VERBOSE = 1, MRC_SEG_DESCRIBE_JSON = 2 };
/* The domain and its segments (base, size, flags, clients, pages in use), as text or as one JSON
 * object. A lock-free snapshot: changes nothing, even when the lock's owner died. Returns the
 * length snprintf would (call again with a larger buffer for all of it), or a negative status. */
MRC_API int mrc_seg_domain_describe(mrc_seg_domain_t *domain, unsigned flags, char *buf,
                                    size_t len);
/* Take the domain lock (recovering it when its owner died), then verify every invariant of the
 * root header: directory entries (every field), the page bitmap, client slots, segment files (a
 * file of the domain that no entry names is a leak; another user's file is skipped). MRC_OK when
 * all hold; MRC_ERR_IO with the first violation in mrc_seg_last_error() otherwise. */
MRC_API mrc_status_t mrc_seg_domain_check(mrc_seg_domain_t *domain);
/* What mrcache-seg repair does: recover the domain lock and every heap lock whose owner died,
 * remove dead clients, then check the domain and each heap. `repaired` (may be NULL) receives
 * the number of locks recovered. */
MRC_API mrc_status_t mrc_seg_domain_repair(mrc_seg_domain_t *domain, unsigned *repaired);
/* Remove the named segment when no live process uses it (MRC_ERR_BUSY otherwise). */
MRC_API mrc_status_t mrc_seg_remove(mrc_seg_domain_t *domain, const char *name);
/* mrcache-seg remove --all: remove every segment no live process uses; when no live client
 * remains, the domain itself, a root file whose creator died before finishing, and segment files
 * of this prefix that no directory entry names (owner-checked). MRC_ERR_BUSY when live clients
 * keep the domain. `removed` (may be NULL) receives the number of files unlinked. */
MRC_API mrc_status_t mrc_seg_domain_remove(const mrc_seg_domain_params_t *params,
                                           unsigned *removed);

/* ---- segments ----------------------------------------------------------------------------- */
typedef struct {
  size_t struct_size;       /* sizeof(mrc_seg_params_t); set by mrc_seg_params_init (the size
                               rule: top of mrcache.h) */
  const char *name;         /* [A-Za-z0-9._-], 1..63 characters */
  size_t size;              /* usable bytes; 0 when joining = whatever size it has */
  unsigned flags;           /* MRC_SEG_* */
  int numa_node;            /* -1 = no policy; else bind the pages to this node (libnuma) */
  const char *backing_file; /* MRC_SEG_FILE: created 0600 with O_EXCL, or opened after owner,
                               mode and size checks; may be on hugetlbfs */
} mrc_seg_params_t;
/* The smallest struct_size accepted: the first layout that carried one (0.2). */
#define MRC_SEG_PARAMS_SIZE_0_2 (offsetof(mrc_seg_params_t, backing_file) + sizeof(const char *))
MRC_API void mrc_seg_params_init(mrc_seg_params_t *params);

/* Find or create a named segment, mapped at the same address in every process.
 * MRC_ERR_INVALID: bad name, size or flags, flags that differ from the existing segment's, a
 * size larger than the existing one, a file that fails the owner/mode/size/header checks;
 * MRC_ERR_IO: the segment's directory entry fails its checks (the field named);
 * MRC_ERR_NO_MEMORY: no room in the window or the directory; MRC_ERR_NOT_FOUND: no such NUMA
 * node; MRC_ERR_UNSUPPORTED: NUMA or huge pages unavailable. */
MRC_API mrc_status_t mrc_seg_open(mrc_seg_domain_t *domain, const char *name, size_t size,
                                  unsigned flags, mrc_seg_t **out);
MRC_API mrc_status_t mrc_seg_open_ex(mrc_seg_domain_t *domain, const mrc_seg_params_t *params,
                                     mrc_seg_t **out);

MRC_API void *mrc_seg_base(const mrc_seg_t *seg); /* the usable bytes */
MRC_API size_t mrc_seg_size(const mrc_seg_t *seg);

/* The heap of a MRC_SEG_HEAP segment: first fit under a robust process-shared mutex; memory
 * allocated in one process may be freed in another. align: 0 or a power of two (>= 16 used).
 * NULL when full, on bad arguments, for a segment without heap, or when the heap's header or a
 * free-list link fails its checks (the heap is then marked corrupt: no allocation until repaired).
 * Free of NULL or of a pointer that is not a live block of this heap does nothing (and sets
 * mrc_seg_last_error). No heap call reads or writes outside the segment's mapping, whatever the
 * shared header says. */
MRC_API void *mrc_seg_alloc(mrc_seg_t *seg, size_t size, size_t align);
MRC_API void mrc_seg_free(mrc_seg_t *seg, void *ptr);

typedef struct {
  size_t heap_size, bytes_used, bytes_free, largest_free;
  size_t used_blocks, free_blocks;
  uint64_t allocs, frees, repairs; /* repairs: recoveries after an owner died in the heap */
} mrc_seg_heap_stats_t;
/* Walk the heap under its lock (recovering it when its owner died) and verify it: the header
 * (heap size, free-list head, state, counters) fits the mapping, blocks tile the heap, the free
 * list holds exactly the free blocks (a cycle ends the walk), no two free blocks touch, the
 * counters match. MRC_ERR_IO with the violation in mrc_seg_last_error() otherwise. stats may be
 * NULL. */
MRC_API mrc_status_t mrc_seg_heap_check(mrc_seg_t *seg, mrc_seg_heap_stats_t *stats);

typedef struct {
  const char *name; /* valid while the handle is open */
  void *base;       /* = mrc_seg_base */
  size_t size;      /* = mrc_seg_size */
  void *map_base;   /* the whole range the segment owns in the window (header included) */
  size_t map_size;
  unsigned flags;
  uint64_t generation; /* unique within the domain, never reused */
  int created;         /* this handle created the segment */
  unsigned clients;    /* processes attached (0 for memfd segments) */
  int numa_node;
} mrc_seg_info_t;
MRC_API mrc_status_t mrc_seg_info(const mrc_seg_t *seg, mrc_seg_info_t *info);

/* The whole segment [mrc_seg_base, +mrc_seg_size) registered through `cache`; *region holds
 * one reference for the caller (mrc_put it). The segment also keeps a reference of its own, used
 * for the keys below, until mrc_seg_close. Unmapping the segment (mrc_seg_close) invalidates the
 * registration through the cache's monitor. */
MRC_API mrc_status_t mrc_seg_register(mrc_seg_t *seg, mrc_cache_t *cache, mrc_region_t **region);
/* The registration key for [addr, addr+len) inside a registered segment. */
MRC_API mrc_status_t mrc_seg_key(const mrc_seg_t *seg, const void *addr, size_t len, uint64_t *key);
/* mrc_seg_alloc, with the key of the segment's registration: allocations come registered.
 * NULL (and *key untouched) when the segment is not registered or the heap is full. */
MRC_API void *mrc_seg_alloc_registered(mrc_seg_t *seg, size_t size, size_t align, uint64_t *key);

/* Detach. The last process out frees the window pages, removes the directory entry and
 * unlinks the file. The address range goes back to a PROT_NONE reservation. */
MRC_API mrc_status_t mrc_seg_close(mrc_seg_t *seg);

/* ---- memfd segments: no name in /dev/shm, passed over a Unix socket (SCM_RIGHTS) ----------- */
/* A sealed memfd (size fixed), mapped at an address the kernel picks (aligned to 2 MiB). name is
 * only a label. Flags: MRC_SEG_HEAP, MRC_SEG_HUGETLB; numa_node as above. */
MRC_API mrc_status_t mrc_seg_memfd_create(const mrc_seg_params_t *params, mrc_seg_t **out);
/* Send the segment's descriptor over a connected AF_UNIX socket. */
MRC_API mrc_status_t mrc_seg_send(const mrc_seg_t *seg, int sock);
/* Receive one, verify it (one descriptor, not cut short; a sealed memfd this process may map
 * writable whose header, heap header included, is sane: MRC_ERR_INVALID otherwise, the field
 * named), and map it at the sender's address with MAP_FIXED_NOREPLACE: MRC_ERR_EXISTS when that
 * range is taken here. A refused message's descriptors are all closed. The sender can still write
 * to it: the heap calls check the heap header again each time. */
MRC_API mrc_status_t mrc_seg_recv(int sock, mrc_seg_t **out);

/* Why the calling thread's last failed mrc_seg_* call failed ("" when it did not). An alias of
 * mrc_last_error() (mrcache.h): the mrc_seg_* calls that return a status clear that text when
 * they start, and every mrc_seg_* call sets it when it fails. */
MRC_API const char *mrc_seg_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MRCACHE_SEGMENT_H */
