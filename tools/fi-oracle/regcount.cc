// SPDX-License-Identifier: BSD-3-Clause
#include "tools/fi-oracle/regcount.h"

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace {

std::atomic<uint64_t> g_registrations{0};

// The next definition of `name` (libibverbs'), looked up once.
template <typename Fn>
Fn next(std::atomic<Fn> &cache, const char *name) {
  Fn fn = cache.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
    if (fn == nullptr) {
      std::fprintf(stderr, "mrcache-fi-oracle: no %s after the oracle's own\n", name);
      std::abort();
    }
    cache.store(fn, std::memory_order_release);
  }
  return fn;
}

}  // namespace

// The prototypes of rdma-core's <infiniband/verbs.h> (not included: it turns ibv_reg_mr into a
// macro), with the structures left opaque.
extern "C" {
struct ibv_pd;
struct ibv_mr;
ibv_mr *ibv_reg_mr(ibv_pd *pd, void *addr, size_t length, int access);
ibv_mr *ibv_reg_mr_iova2(ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access);

ibv_mr *ibv_reg_mr(ibv_pd *pd, void *addr, size_t length, int access) {
  using Fn = ibv_mr *(*)(ibv_pd *, void *, size_t, int);
  static std::atomic<Fn> real{nullptr};
  g_registrations.fetch_add(1, std::memory_order_relaxed);
  return next(real, "ibv_reg_mr")(pd, addr, length, access);
}

ibv_mr *ibv_reg_mr_iova2(ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access) {
  using Fn = ibv_mr *(*)(ibv_pd *, void *, size_t, uint64_t, unsigned);
  static std::atomic<Fn> real{nullptr};
  g_registrations.fetch_add(1, std::memory_order_relaxed);
  return next(real, "ibv_reg_mr_iova2")(pd, addr, length, iova, access);
}
}

namespace fi_oracle {

uint64_t registrations() { return g_registrations.load(std::memory_order_relaxed); }

}  // namespace fi_oracle
