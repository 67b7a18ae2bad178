// SPDX-License-Identifier: BSD-3-Clause
#include "counting_backend.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace conformance {

CountingBackend::CountingBackend() {
  ops_.struct_size = sizeof ops_;
  ops_.name = "conformance-counting";
  ops_.reg = &CountingBackend::reg;
  ops_.dereg = &CountingBackend::dereg;
  ops_.describe = &CountingBackend::describe;
}

CountingBackend::~CountingBackend() = default;

mrc_cache_params_t CountingBackend::params(const char *name) {
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.name = name;
  params.backend = &ops_;
  params.backend_ctx = this;
  // UCX's and libfabric's scenarios expect every registration cached (merges, widening, reuse);
  // the learning of churning ranges would register repeated scenarios at one address uncached.
  params.flags |= MRC_FLAG_CACHE_CHURN;
  return params;
}

void CountingBackend::fail_always(mrc_status_t status) {
  std::lock_guard lock(mutex_);
  fail_always_ = status;
}

void CountingBackend::fail_next(unsigned count, mrc_status_t status) {
  std::lock_guard lock(mutex_);
  fail_next_count_ = count;
  fail_next_status_ = status;
}

void CountingBackend::limit_live(size_t live, mrc_status_t status) {
  std::lock_guard lock(mutex_);
  live_limit_ = live;
  live_limit_status_ = status;
}

size_t CountingBackend::live() {
  std::lock_guard lock(mutex_);
  return live_.size();
}

bool CountingBackend::is_live(uint64_t key) {
  std::lock_guard lock(mutex_);
  return live_.count(key) != 0;
}

uint64_t CountingBackend::next_key() {
  std::lock_guard lock(mutex_);
  return next_key_;
}

std::vector<Registered> CountingBackend::history() {
  std::lock_guard lock(mutex_);
  return history_;
}

mrc_status_t CountingBackend::reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                                  uint64_t *key) {
  auto *self = static_cast<CountingBackend *>(ctx);
  self->attempts_++;
  const auto start = reinterpret_cast<uintptr_t>(addr);
  if (self->check_protection_ && !memory_allows(start, len, prot)) {
    self->failures_++;
    mrc_backend_set_error("conformance-counting", "memory does not allow prot %u", prot);
    return MRC_ERR_INVALID;
  }
  std::lock_guard lock(self->mutex_);
  mrc_status_t failure = self->fail_always_;
  if (failure == MRC_OK && self->fail_next_count_ != 0) {
    --self->fail_next_count_;
    failure = self->fail_next_status_;
  }
  if (failure == MRC_OK && self->live_limit_ != 0 && self->live_.size() >= self->live_limit_) {
    failure = self->live_limit_status_;
  }
  if (failure != MRC_OK) {
    self->failures_++;
    mrc_backend_set_error("conformance-counting", "failure on demand (%s)",
                          mrc_status_string(failure));
    return failure;
  }
  auto *registered = new Registered{start, len, prot, self->next_key_++};
  self->live_.insert(registered->key);
  self->history_.push_back(*registered);
  self->regs_++;
  *handle = registered;
  *key = registered->key;
  return MRC_OK;
}

void CountingBackend::dereg(void *ctx, void *handle) {
  auto *self = static_cast<CountingBackend *>(ctx);
  auto *registered = static_cast<Registered *>(handle);
  {
    std::lock_guard lock(self->mutex_);
    self->live_.erase(registered->key);
  }
  self->deregs_++;
  delete registered;
}

int CountingBackend::describe(void *, void *handle, char *buf, size_t len) {
  const auto *registered = static_cast<const Registered *>(handle);
  return std::snprintf(buf, len, "key %" PRIu64 " [%#" PRIxPTR ", +%zu) prot %u", registered->key,
                       registered->start, registered->length, registered->prot);
}

bool maps_allow(uintptr_t start, size_t len, unsigned prot) {
  FILE *maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return false;
  const uintptr_t end = start + len;
  uintptr_t covered = start;  // [start, covered) is mapped with prot
  char line[512];
  while (covered < end && std::fgets(line, sizeof line, maps) != nullptr) {
    uintptr_t from = 0;
    uintptr_t to = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s", &from, &to, perms) != 3) continue;
    if (to <= covered) continue;
    if (from > covered) break;  // a hole
    if ((prot & MRC_PROT_READ) != 0 && perms[0] != 'r') break;
    if ((prot & MRC_PROT_WRITE) != 0 && perms[1] != 'w') break;
    covered = to;
  }
  std::fclose(maps);
  return covered >= end;
}

// /proc/self/maps is read in pieces, the mmap lock dropped between them: while other threads
// map and unmap, one reading can miss a mapping that stays. A hole that is really there is
// there at every reading.
bool memory_allows(uintptr_t start, size_t len, unsigned prot) {
  for (int reading = 0; reading < 3; ++reading) {
    if (maps_allow(start, len, prot)) return true;
  }
  return false;
}

}  // namespace conformance
