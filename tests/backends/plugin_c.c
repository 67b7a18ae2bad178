// SPDX-License-Identifier: BSD-3-Clause
/* A runtime's own registration engine, written in C exactly as an embedding runtime would:
 * an ops table with designated initialisers (its struct_size first) that leaves out what it
 * does not need, completed with mrc_backend_complete. Compiled as C (this also proves
 * <mrcache/mrcache.h> is C). */
#include <stdint.h>
#include <string.h>

#include "mrcache/mrcache.h"

#include "plugin_c.h"

struct plugin_state {
  unsigned live;
  unsigned regs;
};

static struct plugin_state g_state;

/* Registers anything up to 1 MiB; refuses more, with a cause for mrc_backend_last_error. */
static mrc_status_t plugin_reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                               uint64_t *key) {
  struct plugin_state *state = (struct plugin_state *)ctx;
  (void)prot;
  if (len > ((size_t)1 << 20)) {
    mrc_backend_set_error("c-plugin", "%zu bytes is more than this engine pins", len);
    return MRC_ERR_NO_MEMORY;
  }
  state->live += 1;
  state->regs += 1;
  *handle = addr;
  *key = 0xc0de0000u + state->regs;
  return MRC_OK;
}

/* No dereg, no describe: the defaults stand in. */
static const mrc_backend_t plugin_ops = {
    .struct_size = sizeof(mrc_backend_t),
    .name = "c-plugin",
    .reg = plugin_reg,
};

mrc_status_t plugin_c_complete(mrc_backend_t *out) {
  return mrc_backend_complete(&plugin_ops, out);
}

void *plugin_c_ctx(void) { return &g_state; }

unsigned plugin_c_live(void) { return g_state.live; }

/* Everything left out, even the name: only the size is there. */
mrc_status_t plugin_c_complete_empty(mrc_backend_t *out) {
  const mrc_backend_t empty = {.struct_size = sizeof(mrc_backend_t)};
  return mrc_backend_complete(&empty, out);
}

int plugin_c_original_has_no_dereg(void) {
  return plugin_ops.dereg == NULL && plugin_ops.describe == NULL;
}
