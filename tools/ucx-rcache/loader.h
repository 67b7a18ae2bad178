// SPDX-License-Identifier: BSD-3-Clause
// UCX's ucs_rcache, loaded from mrcache-ucx-rcache.so on first use (api.h says why a module).
//
// THREADS: one instance is used by one thread at a time, as ucs_rcache is by the tools.
#pragma once

#include <cstddef>

#include "tools/ucx-rcache/api.h"

namespace mrc_tools {

class UcxRcache {
 public:
  // An rcache over `engine`. Looks for the module next to the running program, then where this
  // build put it, then where it installs it. Throws std::runtime_error with the reason (no
  // module: this build had no libucx-dev).
  UcxRcache(const mrc_backend_t *engine, void *engine_ctx);
  // The module stays loaded: UCM's hooks stay in libc until the process ends.
  ~UcxRcache();
  UcxRcache(const UcxRcache &) = delete;
  UcxRcache &operator=(const UcxRcache &) = delete;

  // Throws std::runtime_error when UCX refuses.
  void *get(void *addr, size_t len);
  void put(void *region) { api_->put(rcache_, region); }
  void *engine_handle(void *region) const { return api_->engine_handle(region); }
  const char *version() const { return api_->version; }

 private:
  const MrcUcxRcacheApi *api_ = nullptr;
  void *rcache_ = nullptr;
};

}  // namespace mrc_tools
