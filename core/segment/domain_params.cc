// SPDX-License-Identifier: BSD-3-Clause
// The params of a domain: the defaults of mrc_seg_domain_params_t, the checks on a caller's
// params (the size rule, names, mode, ids), and the window the domain lives in.
#include <unistd.h>

#include <cstring>

#include "base/sized.h"
#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {

namespace {

constexpr unsigned kDefaultTimeoutMs = 5000;
constexpr uint64_t kUserTop = uint64_t{1} << 47;

}  // namespace

void domain_defaults(mrc_seg_domain_params_t *params) {
  *params = mrc_seg_domain_params_t{};
  params->struct_size = sizeof *params;
  params->uid = -1;
  params->gid = -1;
}

mrc_status_t resolve(const mrc_seg_domain_params_t *caller, bool observer, Resolved *r) {
  if (caller == nullptr) return fail(MRC_ERR_INVALID, "params is NULL");
  // The size rule of mrcache.h: fields past the caller's struct_size keep their defaults.
  mrc_seg_domain_params_t known;
  domain_defaults(&known);
  if (!sized_input_copy(&known, sizeof known, caller, caller->struct_size,
                        MRC_SEG_DOMAIN_PARAMS_SIZE_0_2)) {
    return fail(MRC_ERR_INVALID,
                "struct_size {} is not a mrc_seg_domain_params_t this library reads (set it "
                "with mrc_seg_domain_params_init)",
                caller->struct_size);
  }
  const mrc_seg_domain_params_t *p = &known;
  const char *prefix = p->prefix != nullptr ? p->prefix : "mrcache";
  if (!valid_name(prefix)) {
    return fail(MRC_ERR_INVALID, "prefix must be 1..{} characters of [A-Za-z0-9._-]", kNameMax);
  }
  std::strcpy(r->prefix, prefix);  // NOLINT: length checked by valid_name
  root_shm_name(prefix, r->root_name);
  r->mode = p->mode == 0 ? 0600U : p->mode;
  if ((r->mode & ~0777U) != 0 || (r->mode & 0002U) != 0 || (r->mode & 0600U) != 0600U) {
    return fail(MRC_ERR_INVALID, "mode {:o}: needs owner read/write and never world-write",
                r->mode);
  }
  if (p->uid < -1 || p->gid < -1) return fail(MRC_ERR_INVALID, "uid and gid: -1 or an id");
  r->uid = p->uid == -1 ? geteuid() : static_cast<uid_t>(p->uid);
  r->gid = p->gid == -1 ? getegid() : static_cast<gid_t>(p->gid);
  r->timeout_ms = p->join_timeout_ms == 0 ? kDefaultTimeoutMs : p->join_timeout_ms;
  r->want_size = p->size == 0 ? kDefaultWindow.size : p->size;
  if (r->want_size % kVaPageSize != 0 || r->want_size / kVaPageSize > kMaxVaPages) {
    return fail(MRC_ERR_INVALID, "window size {:#x}: a multiple of 2 MiB, at most {} GiB",
                r->want_size, (kMaxVaPages * kVaPageSize) >> 30);
  }
  r->want_base = p->base;
  if (p->base != 0) {
    if (p->base % kVaPageSize != 0 || p->base >= kUserTop || r->want_size > kUserTop - p->base) {
      return fail(MRC_ERR_INVALID, "window base {:#x}: 2 MiB aligned, window below {:#x}", p->base,
                  kUserTop);
    }
    r->accept_lo = p->base;
    r->accept_hi = p->base + r->want_size;
  } else if (observer && p->size == 0) {
    // An observer maps nothing at the window, so it need not trust where the window is: it
    // accepts any window in user space unless told which one to expect.
    r->accept_lo = 0;
    r->accept_hi = kUserTop;
  } else {
    if (r->want_size > kDefaultWindow.hi - kDefaultWindow.lo) {
      return fail(MRC_ERR_INVALID, "window size {:#x} exceeds the default range: set a base",
                  r->want_size);
    }
    r->accept_lo = kDefaultWindow.lo;
    r->accept_hi = kDefaultWindow.hi;
  }
  return MRC_OK;
}

}  // namespace mrc::seg
