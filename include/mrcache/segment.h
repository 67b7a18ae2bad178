/* mrcache shared segments (mrc_seg_*). Included by <mrcache/mrcache.h>; do not include
 * directly. */
#ifndef MRCACHE_SEGMENT_H
#define MRCACHE_SEGMENT_H
#endif
