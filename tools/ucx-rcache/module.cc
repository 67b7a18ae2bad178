// SPDX-License-Identifier: BSD-3-Clause
// mrcache-ucx-rcache.so: UCX's ucs_rcache over an mrcache backend table (api.h). Built only
// where libucx-dev is installed.
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ucm/api/ucm.h>
extern "C" {  // rcache.h has no C++ guard of its own
#include <ucs/memory/rcache.h>
}

#include "tools/ucx-rcache/api.h"

namespace {

struct Rcache {
  ucs_rcache_t *rcache = nullptr;
  const mrc_backend_t *engine = nullptr;
  void *engine_ctx = nullptr;
};

struct Region {
  ucs_rcache_region_t super;
  void *handle;
};

ucs_status_t mem_reg(void *context, ucs_rcache_t *, void *, ucs_rcache_region_t *region, uint16_t) {
  auto *rc = static_cast<Rcache *>(context);
  auto *r = reinterpret_cast<Region *>(region);
  uint64_t key = 0;
  mrc_status_t status = rc->engine->reg(
      rc->engine_ctx, reinterpret_cast<void *>(region->super.start),
      region->super.end - region->super.start, MRC_PROT_READ | MRC_PROT_WRITE, &r->handle, &key);
  return status == MRC_OK ? UCS_OK : UCS_ERR_IO_ERROR;
}

void mem_dereg(void *context, ucs_rcache_t *, ucs_rcache_region_t *region) {
  auto *rc = static_cast<Rcache *>(context);
  rc->engine->dereg(rc->engine_ctx, reinterpret_cast<Region *>(region)->handle);
}

void dump_region(void *, ucs_rcache_t *, ucs_rcache_region_t *, char *buf, size_t max) {
  if (max != 0) buf[0] = '\0';
}

const ucs_rcache_ops_t kOps = {&mem_reg, &mem_dereg, &dump_region};

void *create(const mrc_backend_t *engine, void *engine_ctx, char *err, size_t errlen) {
  auto *rc = new Rcache;
  rc->engine = engine;
  rc->engine_ctx = engine_ctx;
  // What UCX's own transports ask for (uct_md rcache defaults): page-aligned regions, unmap
  // events from UCM's default hooks, no limits.
  ucs_rcache_params_t params{};
  params.region_struct_size = sizeof(Region);
  params.alignment = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  params.max_alignment = params.alignment;
  params.ucm_events = UCM_EVENT_VM_UNMAPPED;
  params.ucm_event_priority = 1000;
  params.ops = &kOps;
  params.context = rc;
  params.flags = 0;
  params.max_regions = static_cast<unsigned long>(-1);
  params.max_size = static_cast<size_t>(-1);
  params.max_unreleased = static_cast<size_t>(-1);
  ucs_status_t status = ucs_rcache_create(&params, "mrc-tools", nullptr, &rc->rcache);
  if (status != UCS_OK) {
    snprintf(err, errlen, "ucs_rcache_create: %s", ucs_status_string(status));
    delete rc;
    return nullptr;
  }
  return rc;
}

void *get(void *rcache, void *addr, size_t len, char *err, size_t errlen) {
  auto *rc = static_cast<Rcache *>(rcache);
  ucs_rcache_region_t *region = nullptr;
  ucs_status_t status =
      ucs_rcache_get(rc->rcache, addr, len, PROT_READ | PROT_WRITE, nullptr, &region);
  if (status != UCS_OK) {
    snprintf(err, errlen, "ucs_rcache_get(%p, %zu): %s", addr, len, ucs_status_string(status));
    return nullptr;
  }
  return region;
}

void put(void *rcache, void *region) {
  ucs_rcache_region_put(static_cast<Rcache *>(rcache)->rcache,
                        static_cast<ucs_rcache_region_t *>(region));
}

void destroy(void *rcache) {
  auto *rc = static_cast<Rcache *>(rcache);
  ucs_rcache_destroy(rc->rcache);
  delete rc;
}

void *engine_handle(void *region) { return static_cast<Region *>(region)->handle; }

const MrcUcxRcacheApi kApi = {&create, &get, &put, &destroy, MRC_UCX_VERSION, &engine_handle};

}  // namespace

extern "C" __attribute__((visibility("default"))) const MrcUcxRcacheApi *mrc_ucx_rcache_api(void) {
  return &kApi;
}
