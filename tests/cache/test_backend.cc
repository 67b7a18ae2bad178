// SPDX-License-Identifier: BSD-3-Clause
#include "test_backend.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "base/ticks.h"

namespace mrc::test {

CountingBackend::CountingBackend() {
  ops_ = mrc_backend_t{};
  ops_.struct_size = sizeof ops_;
  ops_.name = "counting";
  ops_.reg = &CountingBackend::reg;
  ops_.dereg = &CountingBackend::dereg;
}

mrc_cache_params_t CountingBackend::params(const char *name) {
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.name = name;
  params.backend = ops();
  params.backend_ctx = ctx();
  return params;
}

mrc_status_t CountingBackend::reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                                  uint64_t *key) {
  auto *self = static_cast<CountingBackend *>(ctx);
  {
    std::lock_guard lock(self->mutex);
    if (self->fail_all || self->failing_starts.count(reinterpret_cast<uintptr_t>(addr)) != 0) {
      self->failures++;
      return self->fail_status.load();
    }
  }
  const uint64_t waited_from = os::ticks();
  if (const uint32_t delay = self->reg_delay_us.load(); delay != 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(delay));
  }
  if (const uint64_t spin = self->reg_spin_ticks.load(); spin != 0) {
    for (const uint64_t began = os::ticks(); os::ticks() - began < spin;) {
    }
  }
  const uint64_t waited = os::ticks() - waited_from;
  for (uint64_t longest = self->longest_wait_ticks.load();
       waited > longest && !self->longest_wait_ticks.compare_exchange_weak(longest, waited);) {
  }
  auto *registration = new Registration{reinterpret_cast<uintptr_t>(addr), len, prot, 0,
                                        self->next_serial_.fetch_add(1)};
  if (auto source = self->stamp_source.load()) registration->stamp = source(registration->start);
  {
    std::lock_guard lock(self->mutex);
    self->live.insert(registration->serial);
  }
  self->regs++;
  *handle = registration;
  *key = registration->serial;
  return MRC_OK;
}

void CountingBackend::dereg(void *ctx, void *handle) {
  auto *self = static_cast<CountingBackend *>(ctx);
  auto *registration = static_cast<Registration *>(handle);
  {
    std::lock_guard lock(self->mutex);
    self->live.erase(registration->serial);
  }
  self->deregs++;
  delete registration;
}

}  // namespace mrc::test
