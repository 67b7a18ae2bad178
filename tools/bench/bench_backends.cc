// SPDX-License-Identifier: BSD-3-Clause
// Registration + deregistration cost per backend and size: what a cache hit saves.
//
//   mrcache-bench --benchmark_filter=Backend
//
// Each iteration registers and deregisters one pre-faulted buffer; the counters reg_us and
// dereg_us split the time between the two. io_uring: 4 KiB to 64 MiB; the null backend: the
// floor (the cost of the ops table itself, reg + dereg together); verbs: the same sizes when an
// RDMA device exists (skipped otherwise, e.g. on hosts without CONFIG_INFINIBAND).
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <string>

#include "mrcache/mrcache.h"

// verbs: whenever rdma-core's header is installed. The library links libibverbs only when built
// with MRC_WITH_VERBS; the few calls made here to open a device are weak references, so a build
// without verbs still links and reports the benchmark as skipped.
#if __has_include(<infiniband/verbs.h>)
#define MRC_BENCH_VERBS 1
#include <infiniband/verbs.h>
#pragma weak ibv_get_device_list
#pragma weak ibv_free_device_list
#pragma weak ibv_get_device_name
#pragma weak ibv_open_device
#pragma weak ibv_close_device
#pragma weak ibv_alloc_pd
#pragma weak ibv_dealloc_pd
#endif

namespace {

using Clock = std::chrono::steady_clock;

// An anonymous mapping with every page faulted in, so that pinning measures pinning.
class Prefaulted {
 public:
  explicit Prefaulted(size_t len) : len_(len) {
    addr_ = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
    if (addr_ == MAP_FAILED) {
      addr_ = nullptr;
    } else {
      std::memset(addr_, 1, len);
    }
  }
  ~Prefaulted() {
    if (addr_ != nullptr) munmap(addr_, len_);
  }
  Prefaulted(const Prefaulted &) = delete;
  Prefaulted &operator=(const Prefaulted &) = delete;
  Prefaulted(Prefaulted &&) = delete;
  Prefaulted &operator=(Prefaulted &&) = delete;
  void *addr() const { return addr_; }

 private:
  void *addr_ = nullptr;
  size_t len_;
};

// The loop every backend shares: reg + dereg, timed apart.
void RegDeregLoop(benchmark::State &state, const mrc_backend_t &ops, void *ctx, void *addr,
                  size_t len, unsigned prot) {
  double reg_seconds = 0, dereg_seconds = 0;
  for (auto _ : state) {
    void *handle = nullptr;
    uint64_t key = 0;
    const auto t0 = Clock::now();
    const mrc_status_t s = ops.reg(ctx, addr, len, prot, &handle, &key);
    const auto t1 = Clock::now();
    if (s != MRC_OK) {
      state.SkipWithError(mrc_backend_last_error());
      break;
    }
    ops.dereg(ctx, handle);
    const auto t2 = Clock::now();
    reg_seconds += std::chrono::duration<double>(t1 - t0).count();
    dereg_seconds += std::chrono::duration<double>(t2 - t1).count();
  }
  state.counters["reg_us"] =
      benchmark::Counter(reg_seconds * 1e6, benchmark::Counter::kAvgIterations);
  state.counters["dereg_us"] =
      benchmark::Counter(dereg_seconds * 1e6, benchmark::Counter::kAvgIterations);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(len));
}

void BM_BackendIouringRegDereg(benchmark::State &state) {
  const auto len = static_cast<size_t>(state.range(0));
  Prefaulted buffer(len);
  mrc_iouring_ctx_t *ctx = nullptr;
  if (buffer.addr() == nullptr || mrc_iouring_ctx_create(nullptr, &ctx) != MRC_OK) {
    state.SkipWithError(buffer.addr() == nullptr ? "mmap failed" : mrc_backend_last_error());
    return;
  }
  RegDeregLoop(state, *mrc_backend_iouring(), ctx, buffer.addr(), len, MRC_PROT_WRITE);
  mrc_iouring_ctx_destroy(ctx);
}
BENCHMARK(BM_BackendIouringRegDereg)->RangeMultiplier(4)->Range(4 << 10, 64 << 20);

void BM_BackendNullRegDereg(benchmark::State &state) {
  static char memory[4096];
  mrc_null_ctx_t *ctx = nullptr;
  if (state.range(0) != 0 && mrc_null_ctx_create(nullptr, &ctx) != MRC_OK) {
    state.SkipWithError(mrc_backend_last_error());
    return;
  }
  // No split timing here: two clock reads would cost more than the backend.
  const mrc_backend_t &ops = *mrc_backend_null();
  for (auto _ : state) {
    void *handle = nullptr;
    uint64_t key = 0;
    if (ops.reg(ctx, memory, sizeof memory, MRC_PROT_READ, &handle, &key) != MRC_OK) {
      state.SkipWithError(mrc_backend_last_error());
      break;
    }
    benchmark::DoNotOptimize(key);
    ops.dereg(ctx, handle);
  }
  state.SetLabel(ctx != nullptr ? "counting context" : "no context");
  mrc_null_ctx_destroy(ctx);
}
BENCHMARK(BM_BackendNullRegDereg)->Arg(0)->Arg(1);

#if MRC_BENCH_VERBS
// The first RDMA device's protection domain, opened once for all sizes.
struct VerbsDevice {
  ibv_device **list = nullptr;
  ibv_context *context = nullptr;
  ibv_pd *pd = nullptr;
  std::string why_not;
  VerbsDevice() {
    if (&ibv_get_device_list == nullptr) {
      why_not = "this build has no verbs support (MRC_WITH_VERBS=OFF)";
      return;
    }
    int count = 0;
    list = ibv_get_device_list(&count);
    if (list == nullptr || count == 0) {
      why_not = "no RDMA device (ibv_get_device_list found none)";
      return;
    }
    context = ibv_open_device(list[0]);
    pd = context != nullptr ? ibv_alloc_pd(context) : nullptr;
    if (pd == nullptr) why_not = std::string("cannot open ") + ibv_get_device_name(list[0]);
  }
  VerbsDevice(const VerbsDevice &) = delete;
  VerbsDevice &operator=(const VerbsDevice &) = delete;
  VerbsDevice(VerbsDevice &&) = delete;
  VerbsDevice &operator=(VerbsDevice &&) = delete;
  ~VerbsDevice() {
    if (pd != nullptr) ibv_dealloc_pd(pd);
    if (context != nullptr) ibv_close_device(context);
    if (list != nullptr) ibv_free_device_list(list);
  }
};

void BM_BackendVerbsRegDereg(benchmark::State &state) {
  static VerbsDevice device;
  if (device.pd == nullptr) {
    state.SkipWithError(device.why_not.c_str());
    return;
  }
  const auto len = static_cast<size_t>(state.range(0));
  Prefaulted buffer(len);
  mrc_verbs_params_t params;
  mrc_verbs_params_init(&params);
  params.pd = device.pd;
  mrc_verbs_ctx_t *ctx = nullptr;
  if (buffer.addr() == nullptr || mrc_verbs_ctx_create(&params, &ctx) != MRC_OK) {
    state.SkipWithError(buffer.addr() == nullptr ? "mmap failed" : mrc_backend_last_error());
    return;
  }
  RegDeregLoop(state, *mrc_backend_verbs(), ctx, buffer.addr(), len, MRC_PROT_WRITE);
  state.SetLabel(ibv_get_device_name(device.context->device));
  mrc_verbs_ctx_destroy(ctx);
}
BENCHMARK(BM_BackendVerbsRegDereg)->RangeMultiplier(4)->Range(4 << 10, 64 << 20);
#endif

}  // namespace
