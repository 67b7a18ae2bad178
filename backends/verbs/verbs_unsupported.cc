// SPDX-License-Identifier: BSD-3-Clause
// The verbs entry points of a build without rdma-core (MRC_WITH_VERBS=OFF): they exist, so
// that runtimes link against any build, and say why they cannot work.
//
// SYNCHRONIZATION: no state.
#include "backends/backend_v0.h"
#include "backends/backends.h"

namespace mrc::backends {
namespace {

constexpr const char *kWhy = "this build has no verbs support (configured with MRC_WITH_VERBS=OFF)";

mrc_status_t unsupported_verbs_reg(void *, void *, std::size_t, unsigned, void **,
                                   std::uint64_t *) noexcept {
  return fail(MRC_ERR_UNSUPPORTED, "verbs", "%s", kWhy);
}

constexpr mrc_backend_t kVerbsOps = {
    .struct_size = sizeof(mrc_backend_t),
    .name = "verbs",
    .reg = unsupported_verbs_reg,
    .dereg = noop_dereg,
    .describe = handle_describe,
};
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

MRC_API mrc_status_t mrc_verbs_ctx_create(const mrc_verbs_params_t *, mrc_verbs_ctx_t **) {
  return mrc::backends::fail(MRC_ERR_UNSUPPORTED, "verbs", "%s", mrc::backends::kWhy);
}

MRC_API void mrc_verbs_ctx_destroy(mrc_verbs_ctx_t *) {}

MRC_API struct ibv_mr *mrc_verbs_handle_mr(void *) { return nullptr; }

}  // extern "C"
