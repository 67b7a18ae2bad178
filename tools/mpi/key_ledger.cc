// SPDX-License-Identifier: BSD-3-Clause
#include "tools/mpi/key_ledger.h"

#include <infiniband/verbs.h>

#include <stdexcept>
#include <string>

namespace mrc_mpi {

namespace {

constexpr size_t kDeadWindow = 1024;

struct Record {
  void *inner = nullptr;  // the verbs backend's handle
  ibv_mr *mr = nullptr;
};

}  // namespace

KeyLedger::KeyLedger(ibv_pd *pd) {
  mrc_verbs_params_t params;
  mrc_verbs_params_init(&params);
  params.pd = pd;
  params.access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  const mrc_status_t status = mrc_verbs_ctx_create(&params, &verbs_);
  if (status != MRC_OK) {
    throw std::runtime_error(std::string("mrc_verbs_ctx_create: ") + mrc_status_string(status) +
                             " (" + mrc_last_error() + ")");
  }
  ops_.struct_size = sizeof ops_;
  ops_.name = "verbs+ledger";
  ops_.reg = &KeyLedger::reg;
  ops_.dereg = &KeyLedger::dereg;
}

KeyLedger::~KeyLedger() { mrc_verbs_ctx_destroy(verbs_); }

ibv_mr *KeyLedger::mr(void *handle) { return static_cast<Record *>(handle)->mr; }

mrc_status_t KeyLedger::reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                            uint64_t *key) {
  auto *self = static_cast<KeyLedger *>(ctx);
  auto *record = new Record;
  const mrc_status_t status =
      mrc_backend_verbs()->reg(self->verbs_, addr, len, prot, &record->inner, key);
  if (status != MRC_OK) {
    delete record;
    return status;
  }
  record->mr = mrc_verbs_handle_mr(record->inner);
  {
    std::lock_guard lock(self->mutex_);
    ++self->live_[record->mr->rkey];
    ++self->registrations_;
  }
  *handle = record;
  return MRC_OK;
}

void KeyLedger::dereg(void *ctx, void *handle) {
  auto *self = static_cast<KeyLedger *>(ctx);
  auto *record = static_cast<Record *>(handle);
  const DeadKey dead{record->mr->rkey, reinterpret_cast<uint64_t>(record->mr->addr)};
  mrc_backend_verbs()->dereg(self->verbs_, record->inner);
  delete record;
  std::lock_guard lock(self->mutex_);
  if (auto it = self->live_.find(dead.rkey); it != self->live_.end() && --it->second == 0) {
    self->live_.erase(it);
  }
  if (self->dead_.size() == kDeadWindow) {
    self->dead_[self->rng_() % kDeadWindow] = dead;
  } else {
    self->dead_.push_back(dead);
  }
}

std::vector<KeyLedger::DeadKey> KeyLedger::take_dead(size_t max) {
  std::lock_guard lock(mutex_);
  std::vector<DeadKey> taken;
  while (taken.size() < max && !dead_.empty()) {
    const size_t i = rng_() % dead_.size();
    const DeadKey key = dead_[i];
    dead_[i] = dead_.back();
    dead_.pop_back();
    if (live_.count(key.rkey) == 0) taken.push_back(key);
  }
  return taken;
}

uint64_t KeyLedger::live() const {
  std::lock_guard lock(mutex_);
  uint64_t n = 0;
  for (const auto &[rkey, count] : live_) n += count;
  return n;
}

uint64_t KeyLedger::registrations() const {
  std::lock_guard lock(mutex_);
  return registrations_;
}

}  // namespace mrc_mpi
