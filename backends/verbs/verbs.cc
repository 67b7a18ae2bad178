// SPDX-License-Identifier: BSD-3-Clause
// The rdma-core verbs backend: registrations are memory regions (ibv_reg_mr) on a protection
// domain that the runtime owns. key = lkey; handle = the struct ibv_mr * (rkey, device).
//
// SYNCHRONIZATION: reg, dereg and describe run on any application thread, concurrently; never
// on the monitor thread. The context is immutable after creation (pd, access, odp); libibverbs
// allows ibv_reg_mr and ibv_dereg_mr on one pd from many threads at once. The only mutable
// state is dereg_failures_, a relaxed counter (statistics, no ordering needed).
// Progress: as ibv_reg_mr / ibv_dereg_mr (they block in the kernel).
#include <infiniband/verbs.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "backends/backend_v0.h"
#include "backends/backends.h"
#include "base/check.h"

struct mrc_verbs_ctx;

namespace mrc::backends {
namespace {

constexpr unsigned kAllowedAccess = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                                    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING |
                                    IBV_ACCESS_ON_DEMAND;
// The verbs specification: remote write and remote atomic need local write on the same MR.
constexpr unsigned kNeedsLocalWrite = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
// What an RC transfer through an ODP region needs from the device.
constexpr std::uint32_t kRcOdpNeeded =
    IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_WRITE;

const char *device_name(const ibv_pd *pd) {
  return pd != nullptr && pd->context != nullptr && pd->context->device != nullptr
             ? ibv_get_device_name(pd->context->device)
             : "?";
}

}  // namespace

class VerbsContext {
 public:
  static constexpr const char *kName = "verbs";

  static VerbsContext *resolve(void *opaque) noexcept;
  [[nodiscard]] static mrc_status_t create(const mrc_verbs_params_t &params,
                                           mrc_verbs_ctx **out) noexcept;

  mrc_status_t reg(void *addr, std::size_t len, unsigned prot, void **handle,
                   std::uint64_t *key) noexcept {
    unsigned access = access_;
    if ((prot & MRC_PROT_WRITE) != 0 || (access & kNeedsLocalWrite) != 0)
      access |= IBV_ACCESS_LOCAL_WRITE;
    errno = 0;
    ibv_mr *mr = ibv_reg_mr(pd_, addr, len, access);
    if (mr == nullptr) {
      const int err = errno != 0 ? errno : EIO;
      if (err == ENOMEM || err == EAGAIN) {
        rlimit limit{};
        char memlock[32] = "unknown";
        if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
          if (limit.rlim_cur == RLIM_INFINITY) {
            std::snprintf(memlock, sizeof memlock, "unlimited");
          } else {
            std::snprintf(memlock, sizeof memlock, "%llu KiB",
                          static_cast<unsigned long long>(limit.rlim_cur / 1024));
          }
        }
        return fail(MRC_ERR_NO_MEMORY, kName,
                    "ibv_reg_mr(%zu bytes) on %s: %s (check RLIMIT_MEMLOCK, now %s)", len,
                    device_name(pd_), strerrordesc_np(err), memlock);
      }
      const mrc_status_t status =
          err == EFAULT || err == EACCES || err == EINVAL ? MRC_ERR_INVALID : MRC_ERR_BACKEND;
      return fail(status, kName, "ibv_reg_mr([%p, +%zu), access 0x%x) on %s: %s", addr, len, access,
                  device_name(pd_), strerrordesc_np(err));
    }
    *handle = mr;
    *key = mr->lkey;
    return MRC_OK;
  }

  void dereg(void *handle) noexcept {
    auto *mr = static_cast<ibv_mr *>(handle);
    MRC_CHECK(mr != nullptr);
    const int err = ibv_dereg_mr(mr);
    if (err != 0) {
      // EBUSY: a memory window is still bound. The region stays registered; nothing else can be
      // done from a void operation but to say so.
      dereg_failures_.fetch_add(1, std::memory_order_relaxed);
      fail(MRC_ERR_BACKEND, kName, "ibv_dereg_mr(lkey 0x%x): %s", mr->lkey, strerrordesc_np(err));
    }
  }

  int describe(void *handle, char *buf, std::size_t len) const noexcept {
    const auto *mr = static_cast<const ibv_mr *>(handle);
    return std::snprintf(buf, len, "verbs: lkey 0x%x rkey 0x%x device %s [%p, +%zu)%s", mr->lkey,
                         mr->rkey, device_name(mr->pd), mr->addr, mr->length, odp_ ? " odp" : "");
  }

 protected:
  VerbsContext() = default;

 private:
  ibv_pd *pd_ = nullptr;
  unsigned access_ = 0;
  bool odp_ = false;
  std::atomic<std::uint64_t> dereg_failures_{0};
};

static_assert(Backend<VerbsContext>);

}  // namespace mrc::backends

struct mrc_verbs_ctx final : mrc::backends::VerbsContext {};

namespace mrc::backends {

VerbsContext *VerbsContext::resolve(void *opaque) noexcept {
  return static_cast<VerbsContext *>(static_cast<mrc_verbs_ctx *>(opaque));
}

mrc_status_t VerbsContext::create(const mrc_verbs_params_t &params, mrc_verbs_ctx **out) noexcept {
  if (params.pd == nullptr) return fail(MRC_ERR_INVALID, kName, "no protection domain");
  if ((params.access & ~kAllowedAccess) != 0)
    return fail(MRC_ERR_INVALID, kName,
                "access bits 0x%x are not allowed (only remote "
                "read/write/atomic, relaxed ordering, on-demand)",
                params.access & ~kAllowedAccess);
  const bool odp = params.odp != 0 || (params.access & IBV_ACCESS_ON_DEMAND) != 0;
  if (odp) {
    ibv_device_attr_ex attr{};
    const int err = ibv_query_device_ex(params.pd->context, nullptr, &attr);
    if (err != 0)
      return fail(MRC_ERR_UNSUPPORTED, kName, "on-demand paging: ibv_query_device_ex on %s: %s",
                  device_name(params.pd), strerrordesc_np(err));
    if ((attr.odp_caps.general_caps & IBV_ODP_SUPPORT) == 0 ||
        (attr.odp_caps.per_transport_caps.rc_odp_caps & kRcOdpNeeded) != kRcOdpNeeded)
      return fail(MRC_ERR_UNSUPPORTED, kName,
                  "device %s has no on-demand paging for RC (general caps 0x%llx, rc caps 0x%x)",
                  device_name(params.pd),
                  static_cast<unsigned long long>(attr.odp_caps.general_caps),
                  attr.odp_caps.per_transport_caps.rc_odp_caps);
  }
  auto *ctx = new (std::nothrow) mrc_verbs_ctx;
  if (ctx == nullptr) return fail(MRC_ERR_NO_MEMORY, kName, "cannot allocate a context");
  ctx->pd_ = params.pd;
  ctx->odp_ = odp;
  ctx->access_ = params.access | (odp ? static_cast<unsigned>(IBV_ACCESS_ON_DEMAND) : 0u);
  *out = ctx;
  return MRC_OK;
}

namespace {
constexpr mrc_backend_t kVerbsOps = ops_for<VerbsContext>();
// What mrc_backend_verbs@MRCACHE_0 hands a 0.1 program: the same operations, 0.1's layout.
constexpr BackendOpsV0 kVerbsOpsV0 = ops_to_v0(kVerbsOps);
}  // namespace

}  // namespace mrc::backends

extern "C" {

// mrc_backend_t gained struct_size in 0.2: the getter exists as *_v2 (name@@MRCACHE_0.2) and
// as *_v0 (name@MRCACHE_0, the 0.1 layout); backends/backend_v0.h.
__asm__(".symver mrc_backend_verbs_v2, mrc_backend_verbs@@MRCACHE_0.2");
__asm__(".symver mrc_backend_verbs_v0, mrc_backend_verbs@MRCACHE_0");

const mrc_backend_t *mrc_backend_verbs_v2(void) { return &mrc::backends::kVerbsOps; }
const mrc::backends::BackendOpsV0 *mrc_backend_verbs_v0(void) {
  return &mrc::backends::kVerbsOpsV0;
}

MRC_API void mrc_verbs_params_init(mrc_verbs_params_t *params) {
  if (params == nullptr) return;
  *params = mrc_verbs_params_t{.pd = nullptr, .access = 0, .odp = 0};
}

MRC_API mrc_status_t mrc_verbs_ctx_create(const mrc_verbs_params_t *params, mrc_verbs_ctx_t **out) {
  using mrc::backends::fail;
  if (params == nullptr || out == nullptr)
    return fail(MRC_ERR_INVALID, "verbs", "ctx_create without parameters or output");
  return mrc::backends::VerbsContext::create(*params, out);
}

MRC_API void mrc_verbs_ctx_destroy(mrc_verbs_ctx_t *ctx) { delete ctx; }

MRC_API struct ibv_mr *mrc_verbs_handle_mr(void *handle) { return static_cast<ibv_mr *>(handle); }

}  // extern "C"
