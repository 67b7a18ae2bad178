// SPDX-License-Identifier: BSD-3-Clause
// The io_uring backend: registrations are fixed buffers in a sparse table.
//
// A registration takes a free slot and installs [addr, addr+len) there with a tagged update; the
// key is the slot (the buf_index of READ_FIXED / WRITE_FIXED). Deregistration empties the slot.
// The kernel keeps the old pages pinned until every request that uses them has completed, and
// then posts a completion whose user_data is the old buffer's tag; only then does the slot go
// back to the free list. So a slot index is never handed out while requests issued against its
// previous buffer may still be running, and the number of slots awaiting release tells how much
// memory is still pinned on behalf of dead registrations.
//
// Tags: MRC_IOURING_TAG_MAGIC << 48 | generation << 16 | slot. The generation makes a tag seen
// twice (once while looking ahead in the queue, once when the application forwards it) or a
// tag of an older use of the slot harmless.
//
// SYNCHRONIZATION
//   Threads: reg, dereg, describe, complete and the I/O helpers run on any application thread,
//   concurrently; never on the monitor thread. Create and destroy are exclusive (REQUIRES in
//   the header).
//   mu_ (mrc::Mutex) guards: free_, free_count_, every Slot::state and Slot::generation, the
//   counters installed_/awaiting_/lost_, the ring's completion queue (reaping) and, for a ring
//   the context owns, its submission queue (the I/O helpers submit under it).
//   Lock-free: Slot::index and Slot::ctx are const after construction. Slot::addr/len are
//   written by the reg thread while the slot is kInstalling (owned by that thread alone) and
//   published with the kInstalled state under mu_; describe and the helpers read them for a
//   live registration, which the caller holds (it has not called dereg).
//   The kernel calls (buffer updates) run outside mu_: the kernel serialises them on the
//   ring's own lock, and a 64 MiB pin takes half a millisecond that other threads need not
//   wait for. The state machine makes that safe: a slot is kInstalling (one owner) during an
//   install and kAwaitingRelease before the emptying update is issued, so a tag that arrives
//   right after the update always finds its slot waiting for it.
//   Progress: blocking (mu_), never held across a pin or unpin.
#include <liburing.h>
#include <sys/resource.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>

#include "backends/backend_v0.h"
#include "backends/backends.h"
#include "base/check.h"
#include "base/mutex.h"

namespace mrc::backends {
namespace {

constexpr const char *kIouringName = "iouring";
constexpr std::uint64_t kTagMagic = std::uint64_t{MRC_IOURING_TAG_MAGIC} << 48;
constexpr std::uint64_t kIoMagic = std::uint64_t{0x494f} << 48;  // "IO": the helpers' requests
constexpr std::uint64_t kMagicMask = std::uint64_t{0xffff} << 48;
constexpr std::size_t kMaxBufferLen = std::size_t{1} << 30;  // the kernel's limit per buffer
constexpr unsigned kOwnedRingEntries = 64;

enum class SlotState : unsigned char {
  Free,             // on the free list
  Installing,       // taken by a reg that is installing its buffer
  Installed,        // holds a live registration
  AwaitingRelease,  // emptied; the kernel has not yet posted the old buffer's tag
  Lost,             // emptying failed: the buffer stays until the table goes; never reused
};

bool is_tag(std::uint64_t user_data) { return (user_data & kMagicMask) == kTagMagic; }

std::uint64_t make_tag(unsigned slot, std::uint32_t generation) {
  return kTagMagic | (std::uint64_t{generation} << 16) | slot;
}

// "8192 KiB" or "unlimited", for messages about pinning.
void describe_memlock(char *buf, std::size_t len) {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    std::snprintf(buf, len, "unknown");
  } else if (limit.rlim_cur == RLIM_INFINITY) {
    std::snprintf(buf, len, "unlimited");
  } else {
    std::snprintf(buf, len, "%llu KiB", static_cast<unsigned long long>(limit.rlim_cur / 1024));
  }
}

}  // namespace

class IouringContext;

}  // namespace mrc::backends

struct mrc_iouring_ctx;

namespace mrc::backends {

struct IouringSlot {
  IouringContext *ctx = nullptr;
  unsigned index = 0;
  SlotState state = SlotState::Free;
  std::uint32_t generation = 0;
  void *addr = nullptr;
  std::size_t len = 0;
};

class IouringContext {
 public:
  static constexpr const char *kName = kIouringName;

  static IouringContext *resolve(void *opaque) noexcept;
  // Exempt from the analysis (docs/DESIGN.md, "Contracts the compiler checks"): it fills the
  // free list before the context is shared, without mu_.
  [[nodiscard]] static mrc_status_t create(const mrc_iouring_params_t &params,
                                           mrc_iouring_ctx **out) noexcept
      MRC_NO_THREAD_SAFETY_ANALYSIS;
  ~IouringContext();
  IouringContext(const IouringContext &) = delete;
  IouringContext &operator=(const IouringContext &) = delete;
  IouringContext(IouringContext &&) = delete;
  IouringContext &operator=(IouringContext &&) = delete;

  mrc_status_t reg(void *addr, std::size_t len, unsigned prot, void **handle,
                   std::uint64_t *key) noexcept;
  void dereg(void *handle) noexcept;
  int describe(void *handle, char *buf, std::size_t len) noexcept;

  io_uring *ring() const noexcept { return ring_; }
  int complete(std::uint64_t user_data) noexcept;
  void slots(unsigned *installed, unsigned *awaiting, unsigned *free_slots) noexcept;
  mrc_status_t transfer(bool write, void *handle, int fd, const void *buf, std::size_t len,
                        std::uint64_t offset, std::size_t *done) noexcept;

 protected:
  IouringContext() = default;

 private:
  void release_locked(std::uint64_t tag) MRC_REQUIRES(mu_);
  void reap_locked() MRC_REQUIRES(mu_);

  // The fields marked GUARDED_BY; Slot::state and Slot::generation too (another struct).
  Mutex mu_;
  io_uring owned_ring_{};
  io_uring *ring_ = nullptr;
  bool owns_ring_ = false;
  bool table_installed_ = false;
  unsigned flags_ = 0;
  unsigned slot_count_ = 0;
  IouringSlot *slots_ = nullptr;
  unsigned *free_ MRC_PT_GUARDED_BY(mu_) = nullptr;  // stack of free slot indices
  unsigned free_count_ MRC_GUARDED_BY(mu_) = 0;
  unsigned installed_ MRC_GUARDED_BY(mu_) = 0;
  unsigned awaiting_ MRC_GUARDED_BY(mu_) = 0;
  unsigned lost_ MRC_GUARDED_BY(mu_) = 0;
  std::uint64_t io_sequence_ MRC_GUARDED_BY(mu_) = 0;
};

static_assert(Backend<IouringContext>);

}  // namespace mrc::backends

struct mrc_iouring_ctx final : mrc::backends::IouringContext {};

namespace mrc::backends {

IouringContext *IouringContext::resolve(void *opaque) noexcept {
  return static_cast<IouringContext *>(static_cast<mrc_iouring_ctx *>(opaque));
}

mrc_status_t IouringContext::create(const mrc_iouring_params_t &params,
                                    mrc_iouring_ctx **out) noexcept {
  if ((params.flags & ~static_cast<unsigned>(MRC_IOURING_APP_REAPS)) != 0)
    return fail(MRC_ERR_INVALID, kName, "unknown flags 0x%x", params.flags);
  const unsigned slots = params.slots != 0 ? params.slots : MRC_IOURING_DEFAULT_SLOTS;
  if (slots > MRC_IOURING_MAX_SLOTS)
    return fail(MRC_ERR_INVALID, kName, "%u slots exceed the kernel's limit of %u", slots,
                MRC_IOURING_MAX_SLOTS);

  auto *ctx = new (std::nothrow) mrc_iouring_ctx;
  if (ctx == nullptr) return fail(MRC_ERR_NO_MEMORY, kName, "cannot allocate a context");
  ctx->flags_ = params.flags;
  ctx->slot_count_ = slots;
  ctx->slots_ = new (std::nothrow) IouringSlot[slots];
  ctx->free_ = new (std::nothrow) unsigned[slots];
  if (ctx->slots_ == nullptr || ctx->free_ == nullptr) {
    delete ctx;
    return fail(MRC_ERR_NO_MEMORY, kName, "cannot allocate a table of %u slots", slots);
  }
  for (unsigned i = 0; i < slots; ++i) {
    ctx->slots_[i].ctx = ctx;
    ctx->slots_[i].index = i;
    ctx->free_[i] = slots - 1 - i;  // pop order 0, 1, 2, ...
  }
  ctx->free_count_ = slots;

  if (params.ring == nullptr) {
    // A completion queue with room for a release tag per slot plus the helpers' requests, so
    // tags never overflow into the kernel's overflow list between two reaps.
    io_uring_params ring_params{};
    ring_params.flags = IORING_SETUP_CQSIZE;
    ring_params.cq_entries = slots + kOwnedRingEntries;
    const int ret = io_uring_queue_init_params(kOwnedRingEntries, &ctx->owned_ring_, &ring_params);
    if (ret < 0) {
      delete ctx;
      const mrc_status_t status = ret == -ENOMEM                    ? MRC_ERR_NO_MEMORY
                                  : ret == -ENOSYS || ret == -EPERM ? MRC_ERR_UNSUPPORTED
                                                                    : MRC_ERR_BACKEND;
      return fail(
          status, kName, "io_uring_queue_init: %s%s", strerrordesc_np(-ret),
          status == MRC_ERR_UNSUPPORTED ? " (io_uring disabled: kernel.io_uring_disabled?)" : "");
    }
    ctx->ring_ = &ctx->owned_ring_;
    ctx->owns_ring_ = true;
  } else {
    ctx->ring_ = params.ring;
  }

  const int ret = io_uring_register_buffers_sparse(ctx->ring_, slots);
  if (ret < 0) {
    delete ctx;
    const mrc_status_t status = ret == -EBUSY    ? MRC_ERR_BUSY
                                : ret == -ENOMEM ? MRC_ERR_NO_MEMORY
                                : ret == -EINVAL ? MRC_ERR_UNSUPPORTED
                                                 : MRC_ERR_BACKEND;
    return fail(status, kName, "io_uring_register_buffers_sparse(%u): %s%s", slots,
                strerrordesc_np(-ret),
                status == MRC_ERR_BUSY          ? " (the ring already has a buffer table)"
                : status == MRC_ERR_UNSUPPORTED ? " (sparse buffer tables need Linux 5.19)"
                                                : "");
  }
  ctx->table_installed_ = true;
  *out = ctx;
  return MRC_OK;
}

IouringContext::~IouringContext() {
  if (ring_ != nullptr) {
    if (owns_ring_) {
      io_uring_queue_exit(ring_);
    } else if (table_installed_) {
      (void)io_uring_unregister_buffers(ring_);
    }
  }
  delete[] slots_;
  delete[] free_;
}

void IouringContext::release_locked(std::uint64_t tag) {
  const auto index = static_cast<unsigned>(tag & 0xffff);
  const auto generation = static_cast<std::uint32_t>(tag >> 16);
  if (index >= slot_count_) return;
  IouringSlot &slot = slots_[index];
  if (slot.state != SlotState::AwaitingRelease || slot.generation != generation) return;
  slot.state = SlotState::Free;
  --awaiting_;
  free_[free_count_++] = index;
}

void IouringContext::reap_locked() {
  if ((flags_ & MRC_IOURING_APP_REAPS) != 0) return;
  io_uring_cqe *cqe = nullptr;
  // Consume the tags at the head of the queue...
  while (io_uring_peek_cqe(ring_, &cqe) == 0 && is_tag(cqe->user_data)) {
    release_locked(cqe->user_data);
    io_uring_cqe_seen(ring_, cqe);
  }
  // ...and learn from those behind a completion that is not ours, without consuming them: the
  // kernel posted them, so their buffers are released. The application will forward them to
  // mrc_iouring_ctx_complete later; the generation check makes that a no-op.
  unsigned head = 0;
  io_uring_for_each_cqe(ring_, head, cqe) {
    if (is_tag(cqe->user_data)) release_locked(cqe->user_data);
  }
}

mrc_status_t IouringContext::reg(void *addr, std::size_t len, unsigned, void **handle,
                                 std::uint64_t *key) noexcept {
  if (len > kMaxBufferLen)
    return fail(MRC_ERR_UNSUPPORTED, kName,
                "%zu bytes exceed the kernel's limit of 1 GiB for one fixed buffer", len);
  IouringSlot *slot = nullptr;
  {
    MutexLock lock(mu_);
    if (free_count_ == 0) reap_locked();
    if (free_count_ == 0) {
      return fail(MRC_ERR_NO_MEMORY, kName,
                  "buffer table full (%u slots: %u in use, %u awaiting release by in-flight I/O%s)",
                  slot_count_, installed_, awaiting_,
                  (flags_ & MRC_IOURING_APP_REAPS) != 0 && awaiting_ != 0
                      ? ", forward tag completions to mrc_iouring_ctx_complete"
                      : "");
    }
    slot = &slots_[free_[--free_count_]];
    slot->state = SlotState::Installing;
    slot->generation += 1;
  }

  // The slot is this thread's alone until it is published as kInstalled.
  slot->addr = addr;
  slot->len = len;
  iovec range{addr, len};
  __u64 tag = make_tag(slot->index, slot->generation);
  int ret = 0;
  do {
    ret = io_uring_register_buffers_update_tag(ring_, slot->index, &range, &tag, 1);
  } while (ret == -EINTR);

  MutexLock lock(mu_);
  if (ret != 1) {
    slot->state = SlotState::Free;
    free_[free_count_++] = slot->index;
    const int err = ret < 0 ? -ret : EIO;
    if (err == ENOMEM || err == EAGAIN) {
      char memlock[32];
      describe_memlock(memlock, sizeof memlock);
      return fail(MRC_ERR_NO_MEMORY, kName,
                  "cannot pin %zu bytes at %p: %s (RLIMIT_MEMLOCK %s; raise it or grant "
                  "CAP_IPC_LOCK)",
                  len, addr, strerrordesc_np(err), memlock);
    }
    if (err == EFAULT || err == EOVERFLOW) {
      return fail(MRC_ERR_INVALID, kName,
                  "cannot pin [%p, +%zu): %s (not mapped, or not writable: io_uring pins for "
                  "write)",
                  addr, len, strerrordesc_np(err));
    }
    return fail(MRC_ERR_BACKEND, kName, "io_uring_register_buffers_update_tag(slot %u): %s",
                slot->index, strerrordesc_np(err));
  }
  slot->state = SlotState::Installed;
  ++installed_;
  *handle = slot;
  *key = slot->index;
  return MRC_OK;
}

void IouringContext::dereg(void *handle) noexcept {
  auto *slot = static_cast<IouringSlot *>(handle);
  MRC_CHECK(slot != nullptr && slot->ctx == this);
  {
    MutexLock lock(mu_);
    MRC_CHECK(slot->state == SlotState::Installed);  // a handle deregistered twice
    slot->state = SlotState::AwaitingRelease;
    --installed_;
    ++awaiting_;
  }
  iovec empty{nullptr, 0};
  __u64 no_tag = 0;
  int ret = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    ret = io_uring_register_buffers_update_tag(ring_, slot->index, &empty, &no_tag, 1);
    if (ret == 1 || (ret != -EINTR && ret != -ENOMEM && ret != -EAGAIN)) break;
  }
  if (ret != 1) {
    // No release happened, so no tag can arrive for this generation: the slot keeps the
    // buffer (pinned until the table goes) and leaves circulation.
    MutexLock lock(mu_);
    slot->state = SlotState::Lost;
    --awaiting_;
    ++lost_;
    fail(MRC_ERR_BACKEND, kName, "cannot empty slot %u: %s (its buffer stays pinned)", slot->index,
         strerrordesc_np(ret < 0 ? -ret : EIO));
  }
}

int IouringContext::describe(void *handle, char *buf, std::size_t len) noexcept {
  const auto *slot = static_cast<const IouringSlot *>(handle);
  return std::snprintf(buf, len, "iouring: slot %u [%p, +%zu) ring fd %d", slot->index, slot->addr,
                       slot->len, ring_->ring_fd);
}

int IouringContext::complete(std::uint64_t user_data) noexcept {
  if (!is_tag(user_data)) return 0;
  MutexLock lock(mu_);
  release_locked(user_data);
  return 1;
}

void IouringContext::slots(unsigned *installed, unsigned *awaiting, unsigned *free_slots) noexcept {
  MutexLock lock(mu_);
  if (installed != nullptr) *installed = installed_;
  if (awaiting != nullptr) *awaiting = awaiting_;
  if (free_slots != nullptr) *free_slots = free_count_;
}

mrc_status_t IouringContext::transfer(bool write, void *handle, int fd, const void *buf,
                                      std::size_t len, std::uint64_t offset,
                                      std::size_t *done) noexcept {
  const char *op = write ? "WRITE_FIXED" : "READ_FIXED";
  if (handle == nullptr || done == nullptr || buf == nullptr)
    return fail(MRC_ERR_INVALID, kName, "%s without a handle, buffer or output", op);
  if (!owns_ring_ || (flags_ & MRC_IOURING_APP_REAPS) != 0)
    return fail(MRC_ERR_INVALID, kName,
                "%s helper needs a ring the context owns and reaps (the application's ring: "
                "submit the request yourself)",
                op);
  if (len > UINT_MAX) return fail(MRC_ERR_INVALID, kName, "%s of %zu bytes is too long", op, len);
  auto *slot = static_cast<IouringSlot *>(handle);
  MRC_CHECK(slot->ctx == this);

  MutexLock lock(mu_);
  if (slot->state != SlotState::Installed)
    return fail(MRC_ERR_INVALID, kName, "%s through slot %u, which holds no registration", op,
                slot->index);
  const auto start = reinterpret_cast<std::uintptr_t>(slot->addr);
  const auto first = reinterpret_cast<std::uintptr_t>(buf);
  if (first < start || first - start > slot->len || len > slot->len - (first - start))
    return fail(MRC_ERR_INVALID, kName, "%s of [%p, +%zu) is outside slot %u [%p, +%zu)", op, buf,
                len, slot->index, slot->addr, slot->len);

  io_uring_sqe *sqe = io_uring_get_sqe(ring_);
  if (sqe == nullptr) {  // only the helpers submit on this ring, one at a time
    (void)io_uring_submit(ring_);
    sqe = io_uring_get_sqe(ring_);
    if (sqe == nullptr) return fail(MRC_ERR_BUSY, kName, "%s: submission queue full", op);
  }
  // What io_uring_prep_{write,read}_fixed do, with one const-correct path for both.
  io_uring_prep_rw(write ? IORING_OP_WRITE_FIXED : IORING_OP_READ_FIXED, sqe, fd, buf,
                   static_cast<unsigned>(len), offset);
  sqe->buf_index = static_cast<__u16>(slot->index);
  const std::uint64_t user_data = kIoMagic | (++io_sequence_ & ~kMagicMask);
  sqe->user_data = user_data;
  int ret = io_uring_submit(ring_);
  if (ret < 0) return fail(MRC_ERR_IO, kName, "%s: io_uring_submit: %s", op, strerrordesc_np(-ret));

  for (;;) {
    io_uring_cqe *cqe = nullptr;
    ret = io_uring_wait_cqe(ring_, &cqe);
    if (ret == -EINTR) continue;
    if (ret < 0)
      return fail(MRC_ERR_IO, kName, "%s: io_uring_wait_cqe: %s", op, strerrordesc_np(-ret));
    const std::uint64_t seen = cqe->user_data;
    if (is_tag(seen)) {
      release_locked(seen);
      io_uring_cqe_seen(ring_, cqe);
      continue;
    }
    if ((seen & kMagicMask) != kIoMagic) {
      return fail(MRC_ERR_BUSY, kName,
                  "%s: the ring holds a completion that is not the context's (user_data 0x%llx):"
                  " someone else submits on it",
                  op, static_cast<unsigned long long>(seen));
    }
    const int res = cqe->res;
    io_uring_cqe_seen(ring_, cqe);
    if (seen != user_data) continue;  // a request of an earlier helper call that gave up
    if (res < 0)
      return fail(MRC_ERR_IO, kName, "%s of %zu bytes, fd %d, slot %u: %s", op, len, fd,
                  slot->index, strerrordesc_np(-res));
    *done = static_cast<std::size_t>(res);
    return MRC_OK;
  }
}

namespace {
constexpr mrc_backend_t kIouringOps = ops_for<IouringContext>();
// What mrc_backend_iouring@MRCACHE_0 hands a 0.1 program: the same operations, 0.1's layout.
constexpr BackendOpsV0 kIouringOpsV0 = ops_to_v0(kIouringOps);
}  // namespace

}  // namespace mrc::backends

extern "C" {

// mrc_backend_t gained struct_size in 0.2: the getter exists as *_v2 (name@@MRCACHE_0.2) and
// as *_v0 (name@MRCACHE_0, the 0.1 layout); backends/backend_v0.h.
__asm__(".symver mrc_backend_iouring_v2, mrc_backend_iouring@@MRCACHE_0.2");
__asm__(".symver mrc_backend_iouring_v0, mrc_backend_iouring@MRCACHE_0");

const mrc_backend_t *mrc_backend_iouring_v2(void) { return &mrc::backends::kIouringOps; }
const mrc::backends::BackendOpsV0 *mrc_backend_iouring_v0(void) {
  return &mrc::backends::kIouringOpsV0;
}

MRC_API void mrc_iouring_params_init(mrc_iouring_params_t *params) {
  if (params == nullptr) return;
  *params = mrc_iouring_params_t{.ring = nullptr, .slots = 0, .flags = 0};
}

MRC_API mrc_status_t mrc_iouring_ctx_create(const mrc_iouring_params_t *params,
                                            mrc_iouring_ctx_t **out) {
  using mrc::backends::fail;
  if (out == nullptr) return fail(MRC_ERR_INVALID, "iouring", "ctx_create without an output");
  mrc_iouring_params_t p;
  mrc_iouring_params_init(&p);
  if (params != nullptr) p = *params;
  return mrc::backends::IouringContext::create(p, out);
}

MRC_API void mrc_iouring_ctx_destroy(mrc_iouring_ctx_t *ctx) { delete ctx; }

MRC_API struct io_uring *mrc_iouring_ctx_ring(mrc_iouring_ctx_t *ctx) {
  return ctx != nullptr ? ctx->ring() : nullptr;
}

MRC_API int mrc_iouring_ctx_complete(mrc_iouring_ctx_t *ctx, uint64_t user_data) {
  return ctx != nullptr ? ctx->complete(user_data) : 0;
}

MRC_API void mrc_iouring_ctx_slots(mrc_iouring_ctx_t *ctx, unsigned *installed,
                                   unsigned *awaiting_release, unsigned *free_slots) {
  if (ctx == nullptr) return;
  ctx->slots(installed, awaiting_release, free_slots);
}

MRC_API mrc_status_t mrc_iouring_ctx_write_fixed(mrc_iouring_ctx_t *ctx, void *handle, int fd,
                                                 const void *buf, size_t len, uint64_t offset,
                                                 size_t *done) {
  if (ctx == nullptr) return mrc::backends::fail(MRC_ERR_INVALID, "iouring", "no context");
  return ctx->transfer(true, handle, fd, buf, len, offset, done);
}

MRC_API mrc_status_t mrc_iouring_ctx_read_fixed(mrc_iouring_ctx_t *ctx, void *handle, int fd,
                                                void *buf, size_t len, uint64_t offset,
                                                size_t *done) {
  if (ctx == nullptr) return mrc::backends::fail(MRC_ERR_INVALID, "iouring", "no context");
  return ctx->transfer(false, handle, fd, buf, len, offset, done);
}

MRC_API unsigned mrc_iouring_handle_slot(void *handle) {
  return handle != nullptr ? static_cast<mrc::backends::IouringSlot *>(handle)->index : ~0u;
}

MRC_API struct io_uring *mrc_iouring_handle_ring(void *handle) {
  return handle != nullptr ? static_cast<mrc::backends::IouringSlot *>(handle)->ctx->ring()
                           : nullptr;
}

}  // extern "C"
