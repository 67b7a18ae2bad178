// SPDX-License-Identifier: BSD-3-Clause
// The C API of segment handles: their parameters (mrc_seg_params_t, and its 0.1 layout: see
// internal/seg_params.h), base/size, the heap, info, close, and the last error (an alias of
// mrc_last_error, base/error.h).
//
// SYNCHRONIZATION: a handle's mapping is immutable while the handle is open (the caller must
// not close a handle another thread still uses). The heap takes its own robust lock (heap.h).
// info reads the directory under the domain lock. Registration fields are guarded by
// mrc_seg::registration_mu (register.cc); close calls the release hook register.cc installed,
// so this file does not depend on the cache's symbols.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "base/error.h"
#include "base/sized.h"
#include "core/segment/domain.h"
#include "core/segment/heap.h"
#include "core/segment/internal/seg_params.h"
#include "core/segment/internal/sys.h"

using mrc::seg::fail;

namespace {

bool has_heap(const mrc_seg *seg) {
  return seg != nullptr && seg->map != nullptr && seg->map->header != nullptr &&
         (seg->map->flags & MRC_SEG_HEAP) != 0;
}

}  // namespace

namespace mrc::seg {

void seg_params_defaults(mrc_seg_params_t *params) noexcept {
  *params = mrc_seg_params_t{};
  params->struct_size = sizeof *params;
  params->numa_node = -1;
}

mrc_status_t seg_params_read(const mrc_seg_params_t *caller, mrc_seg_params_t *known) noexcept {
  // The size rule of mrcache.h: fields past the caller's struct_size keep their defaults.
  seg_params_defaults(known);
  if (!sized_input_copy(known, sizeof *known, caller, caller->struct_size,
                        MRC_SEG_PARAMS_SIZE_0_2)) {
    return fail(MRC_ERR_INVALID,
                "struct_size {} is not a mrc_seg_params_t this library reads (set it with "
                "mrc_seg_params_init)",
                caller->struct_size);
  }
  return MRC_OK;
}

SegParamsV0 seg_params_to_v0(const mrc_seg_params_t &in) noexcept {
  return SegParamsV0{in.name, in.size, in.flags, in.numa_node, in.backing_file};
}

mrc_seg_params_t seg_params_from_v0(const SegParamsV0 &in) noexcept {
  mrc_seg_params_t out;
  seg_params_defaults(&out);
  out.name = in.name;
  out.size = in.size;
  out.flags = in.flags;
  out.numa_node = in.numa_node;
  out.backing_file = in.backing_file;
  return out;
}

}  // namespace mrc::seg

extern "C" {

// mrc_seg_params_t gained struct_size in 0.2: the functions taking it exist as *_v2
// (name@@MRCACHE_0.2) and as *_v0 (name@MRCACHE_0, the 0.1 layout), as in core/cache/capi.cc.
// mrc_seg_memfd_create's pair is in memfd.cc.
MRC_API void mrc_seg_params_init_v2(mrc_seg_params_t *params);
MRC_API mrc_status_t mrc_seg_open_ex_v2(mrc_seg_domain_t *domain, const mrc_seg_params_t *params,
                                        mrc_seg_t **out);
MRC_API void mrc_seg_params_init_v0(mrc::seg::SegParamsV0 *params);
MRC_API mrc_status_t mrc_seg_open_ex_v0(mrc_seg_domain_t *domain,
                                        const mrc::seg::SegParamsV0 *params, mrc_seg_t **out);
__asm__(".symver mrc_seg_params_init_v2, mrc_seg_params_init@@MRCACHE_0.2");
__asm__(".symver mrc_seg_open_ex_v2, mrc_seg_open_ex@@MRCACHE_0.2");
__asm__(".symver mrc_seg_params_init_v0, mrc_seg_params_init@MRCACHE_0");
__asm__(".symver mrc_seg_open_ex_v0, mrc_seg_open_ex@MRCACHE_0");

void mrc_seg_params_init_v2(mrc_seg_params_t *params) {
  if (params == nullptr) return;
  mrc::seg::seg_params_defaults(params);
}

void mrc_seg_params_init_v0(mrc::seg::SegParamsV0 *params) {
  if (params == nullptr) return;
  mrc_seg_params_t current;
  mrc::seg::seg_params_defaults(&current);
  *params = mrc::seg::seg_params_to_v0(current);
}

mrc_status_t mrc_seg_open(mrc_seg_domain_t *domain, const char *name, size_t size, unsigned flags,
                          mrc_seg_t **out) {
  mrc_seg_params_t params;
  mrc::seg::seg_params_defaults(&params);
  params.name = name;
  params.size = size;
  params.flags = flags;
  return mrc::seg::segment_open(domain, &params, out);
}

mrc_status_t mrc_seg_open_ex_v2(mrc_seg_domain_t *domain, const mrc_seg_params_t *params,
                                mrc_seg_t **out) {
  if (params == nullptr) return mrc::seg::segment_open(domain, nullptr, out);
  mrc_seg_params_t known;
  if (mrc::seg::seg_params_read(params, &known) != MRC_OK) return MRC_ERR_INVALID;
  return mrc::seg::segment_open(domain, &known, out);
}

mrc_status_t mrc_seg_open_ex_v0(mrc_seg_domain_t *domain, const mrc::seg::SegParamsV0 *params,
                                mrc_seg_t **out) {
  if (params == nullptr) return mrc_seg_open_ex_v2(domain, nullptr, out);
  const mrc_seg_params_t current = mrc::seg::seg_params_from_v0(*params);
  return mrc_seg_open_ex_v2(domain, &current, out);
}

void *mrc_seg_base(const mrc_seg_t *seg) {
  return seg != nullptr && seg->map != nullptr ? seg->map->data : nullptr;
}

size_t mrc_seg_size(const mrc_seg_t *seg) {
  return seg != nullptr && seg->map != nullptr ? seg->map->data_size : 0;
}

void *mrc_seg_alloc(mrc_seg_t *seg, size_t size, size_t align) {
  if (!has_heap(seg)) {
    mrc::seg::set_error("segment has no heap");
    return nullptr;
  }
  mrc::seg::SharedHeap heap(&seg->map->header->heap, seg->map->data, seg->map->data_size);
  return heap.alloc(size, align);
}

void mrc_seg_free(mrc_seg_t *seg, void *ptr) {
  if (ptr == nullptr || !has_heap(seg)) return;
  mrc::seg::SharedHeap heap(&seg->map->header->heap, seg->map->data, seg->map->data_size);
  (void)heap.free(ptr);
}

mrc_status_t mrc_seg_heap_check(mrc_seg_t *seg, mrc_seg_heap_stats_t *stats) {
  mrc::seg::clear_error();
  if (!has_heap(seg)) return fail(MRC_ERR_INVALID, "segment has no heap");
  mrc::seg::SharedHeap heap(&seg->map->header->heap, seg->map->data, seg->map->data_size);
  return heap.check(stats);
}

mrc_status_t mrc_seg_info(const mrc_seg_t *seg, mrc_seg_info_t *info) {
  using namespace mrc::seg;
  clear_error();
  if (seg == nullptr || seg->map == nullptr || info == nullptr) {
    return fail(MRC_ERR_INVALID, "seg or info is NULL");
  }
  const MappedSegment *m = seg->map;
  *info = mrc_seg_info_t{};
  info->name = m->name;
  info->base = m->data;
  info->size = m->data_size;
  info->map_base = m->start;
  info->map_size = m->va_len;
  info->flags = m->flags;
  info->generation = m->generation;
  info->created = seg->created ? 1 : 0;
  info->numa_node = m->numa_node;
  if (seg->domain != nullptr) {
    mrc_seg_domain *d = seg->domain;
    if (!usable_here(d)) return MRC_ERR_INVALID;
    const mrc_status_t st = lock_domain(d, nullptr);
    if (st != MRC_OK) return st;
    const SegEntry &e = d->root->segments[m->entry];
    if (e.state == kEntryReady && e.generation == m->generation) {
      for (uint64_t word : e.clients)
        info->clients += static_cast<unsigned>(__builtin_popcountll(word));
    }
    unlock_domain(d);
  }
  return MRC_OK;
}

mrc_status_t mrc_seg_close(mrc_seg_t *seg) {
  using namespace mrc::seg;
  clear_error();
  if (seg == nullptr) return fail(MRC_ERR_INVALID, "seg is NULL");
  if (seg->domain != nullptr && seg->domain->root != nullptr && inherited(seg->domain)) {
    // A fork() child closing a segment it inherited (segment.h, fork()): unmapped here only. Its
    // registration is the parent's (a child's caches forget inherited regions): not touched.
    close_inherited(seg);
    pthread_mutex_destroy(&seg->registration_mu);
    delete seg;
    return MRC_OK;
  }
  if (seg->domain != nullptr && !usable_here(seg->domain)) return MRC_ERR_INVALID;
  // Drop the segment's own registration before the unmap, so that the unmap event finds the
  // region unreferenced and the cache deregisters it at once.
  pthread_mutex_lock(&seg->registration_mu);
  if (seg->release_registration != nullptr) seg->release_registration(seg);
  seg->release_registration = nullptr;
  pthread_mutex_unlock(&seg->registration_mu);
  mrc_status_t st = MRC_OK;
  if (seg->domain != nullptr) {
    st = segment_close(seg);
  } else {
    memfd_close(seg->map);
  }
  pthread_mutex_destroy(&seg->registration_mu);
  delete seg;
  return st;
}

// An alias of mrc_last_error() (base/error.cc).
const char *mrc_seg_last_error(void) { return mrc::last_error(); }

}  // extern "C"
