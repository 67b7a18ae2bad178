/* mrcache built-in registration backends: io_uring fixed buffers, rdma-core verbs, and the
 * null backend's context. Included by <mrcache/mrcache.h>; do not include directly. */
#ifndef MRCACHE_BACKENDS_H
#define MRCACHE_BACKENDS_H
#endif
