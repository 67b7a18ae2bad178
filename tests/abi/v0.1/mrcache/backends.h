// SPDX-License-Identifier: BSD-3-Clause
/* mrcache built-in registration backends: io_uring fixed buffers, rdma-core verbs, the null
 * backend's context, and the helpers that plugins use. Included by <mrcache/mrcache.h>; do not
 * include directly. The plugin contract (threads, what reg may do, errors) is in
 * backends/README.md.
 *
 * Self-contained apart from the types of mrcache.h: it does not include liburing.h or
 * infiniband/verbs.h; the engines' own types are only forward-declared. */
#ifndef MRCACHE_BACKENDS_H
#define MRCACHE_BACKENDS_H

#include "mrcache/mrcache.h" /* the types it builds on; mrcache.h includes this file last */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct io_uring;
struct ibv_pd;
struct ibv_mr;

/* ---- every backend ---------------------------------------------------------------------- */

/* The cause of the last failure of a backend call on the calling thread, as
 * "<backend>: <cause>", e.g. "iouring: buffer table full (4096 slots, 3 awaiting release)".
 * Meaningful right after a backend call returned an error; success does not clear it. Never
 * NULL ("" when nothing failed on this thread). The text is the calling thread's own. */
MRC_API const char *mrc_backend_last_error(void);

/* For plugins: record the cause of a failure for mrc_backend_last_error() on this thread, as
 * "<backend>: <printf-formatted cause>". backend may be NULL ("plugin"). */
MRC_API void mrc_backend_set_error(const char *backend, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Completes an ops table: copies *in to *out and fills every missing operation with its
 * not-supported default, so that callers never test for NULL (rdma-core's dummy ops):
 *   name     NULL -> "plugin"
 *   reg      NULL -> returns MRC_ERR_UNSUPPORTED (and sets the last error)
 *   dereg    NULL -> does nothing
 *   describe NULL -> writes "handle <pointer>"
 * Returns MRC_ERR_INVALID if in or out is NULL. in and out may be the same table. */
MRC_API mrc_status_t mrc_backend_complete(const mrc_backend_t *in, mrc_backend_t *out);

/* ---- null ------------------------------------------------------------------------------- */

/* mrc_backend_null() (declared in mrcache.h) registers nothing. Its key is a process-wide
 * registration serial number, starting at 1 and never reused, whatever the context. Its
 * backend_ctx may be NULL (count nothing, never fail) or a context created below. */
typedef struct mrc_null_ctx mrc_null_ctx_t;

typedef struct {
  double fail_rate;         /* each reg fails with this probability, in [0, 1]; 0 = never */
  unsigned long fail_every; /* every Nth reg of the context fails (N, 2N, ...); 0 = never */
  unsigned long seed;       /* seed of the fail_rate draws: equal seeds, equal sequences */
} mrc_null_params_t;

/* Defaults (never fail, seed 0), then the environment: MRC_NULL_FAIL_RATE (e.g. 0.1),
 * MRC_NULL_FAIL_EVERY (e.g. 10), MRC_NULL_FAIL_SEED. Malformed values are ignored. */
MRC_API void mrc_null_params_init(mrc_null_params_t *params);
/* params NULL = the defaults of mrc_null_params_init. MRC_ERR_INVALID: out NULL, fail_rate
 * outside [0, 1] or NaN. Injected failures return MRC_ERR_BACKEND. */
MRC_API mrc_status_t mrc_null_ctx_create(const mrc_null_params_t *params, mrc_null_ctx_t **out);
/* REQUIRES: no reg or dereg of this context is running or will run. */
MRC_API void mrc_null_ctx_destroy(mrc_null_ctx_t *ctx);
/* Successful registrations, deregistrations, injected failures; live = regs - deregs. Any
 * output may be NULL. */
MRC_API void mrc_null_ctx_counters(const mrc_null_ctx_t *ctx, uint64_t *registrations,
                                   uint64_t *deregistrations, uint64_t *failures);

/* ---- io_uring fixed buffers ------------------------------------------------------------- */

/* Registrations are io_uring fixed buffers in a sparse table: key = the slot (the buf_index of
 * IORING_OP_READ_FIXED / WRITE_FIXED), handle = the slot record (mrc_iouring_handle_slot,
 * mrc_iouring_handle_ring). A slot is reused only after the kernel has released the old buffer
 * (its tagged update completed: in-flight I/O is done). Errors: MRC_ERR_NO_MEMORY for a full
 * table, RLIMIT_MEMLOCK or ENOMEM; MRC_ERR_INVALID for memory that cannot be pinned (not
 * mapped, or not writable: io_uring always pins for write); MRC_ERR_UNSUPPORTED for one buffer
 * above the kernel's 1 GiB limit; the cause in mrc_backend_last_error(). */
MRC_API const mrc_backend_t *mrc_backend_iouring(void);

typedef struct mrc_iouring_ctx mrc_iouring_ctx_t;

/* Release tags that the context puts in the ring's completion queue carry this value in the
 * top 16 bits of user_data; the application must not use such user_data on the ring. */
#define MRC_IOURING_TAG_MAGIC 0x4d52u /* "MR" */
#define MRC_IOURING_MAX_SLOTS 16384u  /* the kernel's IORING_MAX_REG_BUFFERS */
#define MRC_IOURING_DEFAULT_SLOTS 4096u

enum {
  /* Another thread may reap the ring's completion queue while reg runs: reg never touches
   * the queue, and the application passes every completion's user_data to
   * mrc_iouring_ctx_complete. Without it, reg consumes release tags at the head of the queue
   * when it needs a slot, so the application must not reap concurrently with reg. */
  MRC_IOURING_APP_REAPS = 1
};

typedef struct {
  struct io_uring *ring; /* NULL = the context creates and owns a ring */
  unsigned slots;        /* size of the sparse table; 0 = MRC_IOURING_DEFAULT_SLOTS */
  unsigned flags;        /* MRC_IOURING_* */
} mrc_iouring_params_t;

/* ring NULL, slots 0 (default), flags 0. */
MRC_API void mrc_iouring_params_init(mrc_iouring_params_t *params);
/* An application's ring must have no registered buffer table yet (MRC_ERR_BUSY otherwise);
 * the context installs one and removes it at destroy. params NULL = the defaults.
 * MRC_ERR_INVALID: out NULL, slots > MRC_IOURING_MAX_SLOTS, unknown flags.
 * MRC_ERR_UNSUPPORTED: io_uring disabled or without sparse tables (Linux < 5.19). */
MRC_API mrc_status_t mrc_iouring_ctx_create(const mrc_iouring_params_t *params,
                                            mrc_iouring_ctx_t **out);
/* Removes the buffer table (or closes the ring the context owns). REQUIRES: no reg, dereg or
 * I/O helper of this context is running or will run. */
MRC_API void mrc_iouring_ctx_destroy(mrc_iouring_ctx_t *ctx);
MRC_API struct io_uring *mrc_iouring_ctx_ring(mrc_iouring_ctx_t *ctx);
/* For every completion the application reaps from the ring: returns 1 if it was one of the
 * context's release tags (consumed: not the application's), 0 otherwise. Thread-safe. */
MRC_API int mrc_iouring_ctx_complete(mrc_iouring_ctx_t *ctx, uint64_t user_data);
/* Slots holding a buffer, slots emptied but not yet released by the kernel, free slots. Any
 * output may be NULL. */
MRC_API void mrc_iouring_ctx_slots(mrc_iouring_ctx_t *ctx, unsigned *installed,
                                   unsigned *awaiting_release, unsigned *free_slots);

/* Synchronous IORING_OP_WRITE_FIXED / READ_FIXED of [buf, buf+len) (inside the registration
 * `handle`) to / from fd at offset, on the ring the context owns; thread-safe (serialised with
 * reg's reaping). *done = bytes transferred. MRC_ERR_INVALID: a ring the context does not own,
 * MRC_IOURING_APP_REAPS, a range outside the registration; MRC_ERR_IO: the operation failed
 * (the cause in mrc_backend_last_error()). This is the data-path oracle's primitive. */
MRC_API mrc_status_t mrc_iouring_ctx_write_fixed(mrc_iouring_ctx_t *ctx, void *handle, int fd,
                                                 const void *buf, size_t len, uint64_t offset,
                                                 size_t *done);
MRC_API mrc_status_t mrc_iouring_ctx_read_fixed(mrc_iouring_ctx_t *ctx, void *handle, int fd,
                                                void *buf, size_t len, uint64_t offset,
                                                size_t *done);

/* For a handle of a live registration: its slot (= its key) and its ring. */
MRC_API unsigned mrc_iouring_handle_slot(void *handle);
MRC_API struct io_uring *mrc_iouring_handle_ring(void *handle);

/* ---- rdma-core verbs -------------------------------------------------------------------- */

/* Registrations are ibv_reg_mr memory regions on the context's protection domain: key = lkey,
 * handle = struct ibv_mr * (rkey through it). Access: IBV_ACCESS_LOCAL_WRITE when prot has
 * MRC_PROT_WRITE (or when the configured access needs it), plus the configured access.
 * In a build without verbs (MRC_WITH_VERBS=OFF) every call returns MRC_ERR_UNSUPPORTED. */
MRC_API const mrc_backend_t *mrc_backend_verbs(void);

typedef struct mrc_verbs_ctx mrc_verbs_ctx_t;

typedef struct {
  struct ibv_pd *pd; /* the runtime's protection domain (required; stays the runtime's) */
  unsigned access;   /* extra IBV_ACCESS_* for every registration: REMOTE_READ, REMOTE_WRITE,
                        REMOTE_ATOMIC, RELAXED_ORDERING, ON_DEMAND */
  int odp;           /* non-zero: on-demand paging (IBV_ACCESS_ON_DEMAND) */
} mrc_verbs_params_t;

/* pd NULL, access 0, odp 0. */
MRC_API void mrc_verbs_params_init(mrc_verbs_params_t *params);
/* MRC_ERR_INVALID: params, pd or out NULL, access bits outside the list above.
 * MRC_ERR_UNSUPPORTED: ODP asked for but the device does not report it for RC (send, receive,
 * read, write), or a build without verbs. */
MRC_API mrc_status_t mrc_verbs_ctx_create(const mrc_verbs_params_t *params, mrc_verbs_ctx_t **out);
/* REQUIRES: no reg or dereg of this context is running or will run. The pd stays open. */
MRC_API void mrc_verbs_ctx_destroy(mrc_verbs_ctx_t *ctx);
/* The memory region of a live registration (NULL in a build without verbs). */
MRC_API struct ibv_mr *mrc_verbs_handle_mr(void *handle);

#ifdef __cplusplus
}
#endif

#endif /* MRCACHE_BACKENDS_H */
