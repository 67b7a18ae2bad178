// SPDX-License-Identifier: BSD-3-Clause
/* mrcache shared segments (mrc_seg_*). Included by <mrcache/mrcache.h>; do not include
 * directly.
 *
 * A domain (like VPP's svm root region) is a name space (`prefix`) and a window of virtual
 * addresses that every member process reserves at the same place. Named segments are carved out
 * of that window, so each segment sits at the same address in every process and raw pointers
 * into it stay valid across processes. The first process creates the domain, later ones join;
 * the last one out removes it. Files live in /dev/shm as "<prefix>:root" and
 * "<prefix>:<generation>:<name>"; they are created 0600 (or the domain's mode, never
 * world-writable) with O_EXCL, and removed only with shm_unlink.
 *
 * Threads: every call is thread-safe. A handle must not be used after it was closed.
 * fork(): a child must not use the domain or segment handles of its parent (calls return
 * MRC_ERR_INVALID there), except the heap of a segment it inherited; it opens the domain again.
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
  const char *prefix;       /* name space, like VPP's root_path; NULL = "mrcache" */
  uintptr_t base;           /* 0 = the default window for this architecture */
  size_t size;              /* size of the virtual-address window; 0 = default */
  unsigned mode;            /* file mode; 0 = 0600; never world-writable */
  int uid, gid;             /* -1 = the caller's */
  unsigned join_timeout_ms; /* how long a joiner waits for the creator; 0 = default */
} mrc_seg_domain_params_t;

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
 * join_timeout_ms; MRC_ERR_NO_MEMORY: every client slot is taken. A process that opens the same
 * prefix twice gets the same domain, reference-counted. */
MRC_API mrc_status_t mrc_seg_domain_open(const mrc_seg_domain_params_t *params,
                                         mrc_seg_domain_t **out);
/* Attach as an observer (what mrcache-seg does): no client slot, no window; describe, info,
 * check, scan, repair and remove work, mrc_seg_open does not. With base and size 0 it accepts a
 * window anywhere (it maps nothing there). MRC_ERR_NOT_FOUND when there is no domain under that
 * prefix. */
MRC_API mrc_status_t mrc_seg_domain_inspect(const mrc_seg_domain_params_t *params,
                                            mrc_seg_domain_t **out);
/* Remove clients that died (their presence lock was released by the kernel), and the segments
 * that only they used. */
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
 * root header: directory entries, the page bitmap, client slots, segment files. MRC_OK when all
 * hold; MRC_ERR_IO with the first violation in mrc_seg_last_error() otherwise. */
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
  const char *name;         /* [A-Za-z0-9._-], 1..63 characters */
  size_t size;              /* usable bytes; 0 when joining = whatever size it has */
  unsigned flags;           /* MRC_SEG_* */
  int numa_node;            /* -1 = no policy; else bind the pages to this node (libnuma) */
  const char *backing_file; /* MRC_SEG_FILE: created 0600 with O_EXCL, or opened after owner,
                               mode and size checks; may be on hugetlbfs */
} mrc_seg_params_t;
MRC_API void mrc_seg_params_init(mrc_seg_params_t *params);

/* Find or create a named segment, mapped at the same address in every process.
 * MRC_ERR_INVALID: bad name, size or flags, flags that differ from the existing segment's, a
 * size larger than the existing one, a file that fails the owner/mode/size/header checks;
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
 * NULL when full, on bad arguments, or for a segment without heap. Free of NULL or of a pointer
 * that is not a live block of this heap does nothing (and sets mrc_seg_last_error). */
MRC_API void *mrc_seg_alloc(mrc_seg_t *seg, size_t size, size_t align);
MRC_API void mrc_seg_free(mrc_seg_t *seg, void *ptr);

typedef struct {
  size_t heap_size, bytes_used, bytes_free, largest_free;
  size_t used_blocks, free_blocks;
  uint64_t allocs, frees, repairs; /* repairs: recoveries after an owner died in the heap */
} mrc_seg_heap_stats_t;
/* Walk the heap under its lock (recovering it when its owner died) and verify it: blocks tile
 * the heap, the free list holds exactly the free blocks, no two free blocks touch, the counters
 * match. MRC_ERR_IO with the violation in mrc_seg_last_error() otherwise. stats may be NULL. */
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
/* Receive one, verify it (a sealed memfd whose header is sane), and map it at the sender's
 * address with MAP_FIXED_NOREPLACE: MRC_ERR_EXISTS when that range is taken here. */
MRC_API mrc_status_t mrc_seg_recv(int sock, mrc_seg_t **out);

/* Why the calling thread's last failed mrc_seg_* call failed ("" when it did not). */
MRC_API const char *mrc_seg_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MRCACHE_SEGMENT_H */
