// SPDX-License-Identifier: BSD-3-Clause
// mrc_backend_t as 0.1 laid it out (docs/DESIGN.md, "C ABI"): the frozen 0.1 ops table, its
// translation to and from the library's sized layout, and the *_v0 entry points that 0.1
// programs reach through name@MRCACHE_0 (the getters, mrc_backend_complete). Their *_v2 twins,
// name@@MRCACHE_0.2, are declared here too, so that one header names every version. No state.
#pragma once

#include <cstdint>
#include <cstring>

#include "base/sized.h"
#include "mrcache/mrcache.h"

namespace mrc::backends {

// mrc_backend_t as 0.1 binaries lay it out: frozen, never edit.
struct BackendOpsV0 {
  const char *name;
  mrc_status_t (*reg)(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                      uint64_t *key);
  void (*dereg)(void *ctx, void *handle);
  int (*describe)(void *ctx, void *handle, char *buf, size_t len);
};

// A 0.1 table in the library's layout: a 0.1 table is every field of the first sized one.
constexpr mrc_backend_t ops_from_v0(const BackendOpsV0 &in) noexcept {
  return mrc_backend_t{.struct_size = sizeof(mrc_backend_t),
                       .name = in.name,
                       .reg = in.reg,
                       .dereg = in.dereg,
                       .describe = in.describe};
}

// Whether a table that reached a 0.1 entry point is laid out as 0.2 and later: its first word,
// where a 0.1 table keeps its name, is then a struct_size (1 to kMaxStructSize), which no name
// pointer can be (nothing is ever mapped in the first page of the address space; 0 is a 0.1
// table's NULL name). A mixed build does that: a table from 0.2 headers passed where the program
// linked the 0.1 symbol. Read by its struct_size, it means what its author meant.
inline bool is_sized_table(const BackendOpsV0 *in) noexcept {
  std::uintptr_t first = 0;
  std::memcpy(&first, static_cast<const void *>(in), sizeof first);
  return first != 0 && first <= kMaxStructSize;
}

// What a 0.1 program can see of a table: its 0.1 fields.
constexpr BackendOpsV0 ops_to_v0(const mrc_backend_t &in) noexcept {
  return BackendOpsV0{in.name, in.reg, in.dereg, in.describe};
}

}  // namespace mrc::backends

// Exported (default visibility) so that .symver can bind them; the version map's `local: *`
// hides the *_v0 and *_v2 names themselves. Each getter's file binds its pair.
extern "C" {
MRC_API const mrc_backend_t *mrc_backend_null_v2(void);
MRC_API const mrc::backends::BackendOpsV0 *mrc_backend_null_v0(void);
MRC_API const mrc_backend_t *mrc_backend_iouring_v2(void);
MRC_API const mrc::backends::BackendOpsV0 *mrc_backend_iouring_v0(void);
MRC_API const mrc_backend_t *mrc_backend_verbs_v2(void);
MRC_API const mrc::backends::BackendOpsV0 *mrc_backend_verbs_v0(void);
MRC_API mrc_status_t mrc_backend_complete_v2(const mrc_backend_t *in, mrc_backend_t *out);
MRC_API mrc_status_t mrc_backend_complete_v0(const mrc::backends::BackendOpsV0 *in,
                                             mrc::backends::BackendOpsV0 *out);
}  // extern "C"
