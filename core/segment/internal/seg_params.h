// SPDX-License-Identifier: BSD-3-Clause
// mrc_seg_params_t across the C ABI's versions (docs/DESIGN.md, "C ABI"): its defaults, the size
// rule for a caller's struct_size (base/sized.h), and the 0.1 layout that 0.1 programs pass to
// mrc_seg_params_init, mrc_seg_open_ex and mrc_seg_memfd_create@MRCACHE_0. Defined in
// segment.cc; memfd.cc uses them too. No shared state.
#pragma once

#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::seg {

// mrc_seg_params_t as 0.1 binaries lay it out: frozen, never edit.
struct SegParamsV0 {
  const char *name;
  size_t size;
  unsigned flags;
  int numa_node;
  const char *backing_file;
};

// What mrc_seg_params_init writes: every field's default, struct_size = sizeof.
void seg_params_defaults(mrc_seg_params_t *params) noexcept;

// The size rule of mrcache.h: `known` receives the caller's fields that this library knows,
// the others keep their defaults. MRC_ERR_INVALID (and the last error) when the caller's
// struct_size is not one this library reads. `caller` is not NULL.
[[nodiscard]] mrc_status_t seg_params_read(const mrc_seg_params_t *caller,
                                           mrc_seg_params_t *known) noexcept;

SegParamsV0 seg_params_to_v0(const mrc_seg_params_t &in) noexcept;
mrc_seg_params_t seg_params_from_v0(const SegParamsV0 &in) noexcept;

}  // namespace mrc::seg
