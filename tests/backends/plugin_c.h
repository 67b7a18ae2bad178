// SPDX-License-Identifier: BSD-3-Clause
/* The C plugin of plugin_c.c, driven by plugin_test.cc. */
#ifndef MRCACHE_TESTS_BACKENDS_PLUGIN_C_H
#define MRCACHE_TESTS_BACKENDS_PLUGIN_C_H

#include "mrcache/mrcache.h"

#ifdef __cplusplus
extern "C" {
#endif

mrc_status_t plugin_c_complete(mrc_backend_t *out);
mrc_status_t plugin_c_complete_empty(mrc_backend_t *out);
void *plugin_c_ctx(void);
unsigned plugin_c_live(void);
int plugin_c_original_has_no_dereg(void);

#ifdef __cplusplus
}
#endif

#endif
