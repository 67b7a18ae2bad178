// The interface of mrcache-appbench-ucx.so, the module that holds UCX's ucs_rcache. The trial
// dlopen()s it only when it runs the "ucx" path: loading libucs/libucm patches libc's memory
// calls for the rest of the process, which must not touch the other paths' trials.
#pragma once

#include <stddef.h>

#include "mrcache/mrcache.h"

extern "C" {

struct AppbenchUcxApi {
  // An rcache whose mem_reg/mem_dereg call engine->reg/dereg, with UCX's default memory hooks
  // (UCM_EVENT_VM_UNMAPPED). Returns NULL and writes the reason into err on failure.
  void *(*create)(const mrc_backend_t *engine, void *engine_ctx, char *err, size_t errlen);
  // The region of [addr, addr+len) registered for read and write; NULL and err on failure.
  void *(*get)(void *rcache, void *addr, size_t len, char *err, size_t errlen);
  void (*put)(void *rcache, void *region);
  void (*destroy)(void *rcache);
  const char *version;
};

// The module's one symbol.
const AppbenchUcxApi *mrc_appbench_ucx_api(void);
typedef const AppbenchUcxApi *(*AppbenchUcxApiFn)(void);
}
