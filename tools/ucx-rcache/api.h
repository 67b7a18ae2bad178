// SPDX-License-Identifier: BSD-3-Clause
// The interface of mrcache-ucx-rcache.so, the module that holds UCX's ucs_rcache for the tools
// that compare against it (mrcache-appbench, mrcache-mpi). They dlopen() it (loader.h) only in
// the runs that use UCX: loading libucs/libucm patches libc's memory calls for the rest of the
// process, which must not touch the other paths' figures.
#pragma once

#include <stddef.h>

#include "mrcache/mrcache.h"

extern "C" {

struct MrcUcxRcacheApi {
  // An rcache whose mem_reg/mem_dereg call engine->reg/dereg, with UCX's default memory hooks
  // (UCM_EVENT_VM_UNMAPPED). Returns NULL and writes the reason into err on failure.
  void *(*create)(const mrc_backend_t *engine, void *engine_ctx, char *err, size_t errlen);
  // The region of [addr, addr+len) registered for read and write; NULL and err on failure.
  void *(*get)(void *rcache, void *addr, size_t len, char *err, size_t errlen);
  void (*put)(void *rcache, void *region);
  void (*destroy)(void *rcache);
  const char *version;
  // The engine's handle of a region get returned (its registration: an ibv_mr for verbs).
  void *(*engine_handle)(void *region);
};

// The module's one symbol.
const MrcUcxRcacheApi *mrc_ucx_rcache_api(void);
typedef const MrcUcxRcacheApi *(*MrcUcxRcacheApiFn)(void);
}
