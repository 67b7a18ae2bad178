// SPDX-License-Identifier: BSD-3-Clause
#include "tools/stress/backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "tools/stress/util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace stress {

// ---- page frames ---------------------------------------------------------------------------

bool read_frames(int pagemap_fd, uintptr_t start, size_t len, uint64_t *frames) {
  const size_t pages = len / page_size();
  const auto offset = static_cast<off_t>(start / page_size() * sizeof(uint64_t));
  const size_t bytes = pages * sizeof(uint64_t);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = pread(pagemap_fd, reinterpret_cast<char *>(frames) + done, bytes - done,
                            offset + static_cast<off_t>(done));
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  for (size_t i = 0; i < pages; ++i) {
    const bool present = (frames[i] >> 63) != 0;
    frames[i] = present ? (frames[i] & ((uint64_t{1} << 55) - 1)) : 0;
  }
  return true;
}

bool frames_visible(std::string *why) {
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = std::string("cannot open /proc/self/pagemap: ") + strerrordesc_np(errno);
    return false;
  }
  static volatile char probe = 1;
  probe = 2;
  uint64_t frame = 0;
  const bool ok =
      read_frames(fd, page_down(reinterpret_cast<uintptr_t>(&probe)), page_size(), &frame);
  close(fd);
  if (!ok || frame == 0) {
    *why = "/proc/self/pagemap hides frame numbers without CAP_SYS_ADMIN (run as root)";
    return false;
  }
  return true;
}

// ---- Instrumented ----------------------------------------------------------------------------

namespace {
thread_local int t_worker = -1;
thread_local int t_slot = -1;
}  // namespace

void Instrumented::set_thread_context(int worker, int slot) {
  t_worker = worker;
  t_slot = slot;
}

std::optional<RegistrationInfo> Instrumented::lookup(void *handle) const {
  std::lock_guard lock(live_mutex_);
  const auto it = live_.find(handle);
  if (it == live_.end()) return std::nullopt;
  return it->second;
}

Instrumented::Instrumented(const Config &config) : config_(config) {
  ops_.struct_size = sizeof ops_;
  ops_.name = config.inner->name;
  ops_.reg = &Instrumented::reg;
  ops_.dereg = &Instrumented::dereg;
  ops_.describe = &Instrumented::describe;
}

void *Instrumented::inner_handle(void *handle) const {
  if (config_.pagemap_fd < 0 || handle == nullptr) return handle;
  return static_cast<FrameRecord *>(handle)->inner;
}

const FrameRecord *Instrumented::frames(void *handle) const {
  return config_.pagemap_fd < 0 ? nullptr : static_cast<const FrameRecord *>(handle);
}

// Whether this kernel knows MADV_POPULATE_WRITE (5.14 and later): tried once on a page of our
// own, where only an unknown advice gives EINVAL.
static bool populate_write_supported() {
  static const bool supported = [] {
    void *page =
        mmap(nullptr, page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return false;
    const bool ok = madvise(page, page_size(), MADV_POPULATE_WRITE) == 0;
    munmap(page, page_size());
    return ok;
  }();
  return supported;
}

mrc_status_t Instrumented::reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                               uint64_t *key) {
  auto *self = static_cast<Instrumented *>(ctx);
  const uint64_t attempt = self->attempts_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (self->config_.fail_rate > 0) {
    const double draw =
        static_cast<double>(mix64(self->config_.seed ^ mix64(attempt)) >> 11) * 0x1.0p-53;
    if (draw < self->config_.fail_rate) {
      self->injected_.fetch_add(1, std::memory_order_relaxed);
      mrc_backend_set_error("stress", "injected failure (--fail-rate %g)", self->config_.fail_rate);
      return MRC_ERR_BACKEND;
    }
  }

  FrameRecord *record = nullptr;
  const auto start = reinterpret_cast<uintptr_t>(addr);
  if (self->config_.pagemap_fd >= 0) {
    if (start % page_size() != 0 || len % page_size() != 0) {
      mrc_backend_set_error("stress", "pfn recording needs page-aligned registrations");
      return MRC_ERR_INVALID;
    }
    // What pinning would do: fault every page in, writable, so that its frame is the one the
    // application will use (a read fault would map the shared zero page).
    if (madvise(addr, len, MADV_POPULATE_WRITE) != 0) {
      // EINVAL from a kernel that has MADV_POPULATE_WRITE: memory that is not writable (a range
      // another thread made PROT_NONE or read-only while the cache registers it). Pinning would
      // refuse it too; touching it would kill the process.
      if (errno != EINVAL || populate_write_supported()) {
        mrc_backend_set_error("stress", "MADV_POPULATE_WRITE: %s", strerrordesc_np(errno));
        return MRC_ERR_INVALID;
      }
      for (uintptr_t p = start; p < start + len; p += page_size()) {
        __atomic_fetch_add(reinterpret_cast<char *>(p), 0, __ATOMIC_RELAXED);
      }
    }
    record = new (std::nothrow) FrameRecord;
    if (record == nullptr) return MRC_ERR_NO_MEMORY;
    try {
      record->frames.resize(len / page_size());
    } catch (...) {
      delete record;
      return MRC_ERR_NO_MEMORY;
    }
    record->start = start;
    record->len = len;
    if (!read_frames(self->config_.pagemap_fd, start, len, record->frames.data())) {
      delete record;
      mrc_backend_set_error("stress", "reading /proc/self/pagemap failed");
      return MRC_ERR_IO;
    }
  }

  void *inner = nullptr;
  const mrc_status_t status =
      self->config_.inner->reg(self->config_.inner_ctx, addr, len, prot, &inner, key);
  if (status != MRC_OK) {
    delete record;
    self->inner_failures_.fetch_add(1, std::memory_order_relaxed);
    return status;
  }
  if (record != nullptr) {
    record->inner = inner;
    *handle = record;
  } else {
    *handle = inner;
  }
  try {
    std::lock_guard lock(self->live_mutex_);
    self->live_[*handle] =
        RegistrationInfo{start, len, now_ns() - self->origin_ns_, t_worker, t_slot};
  } catch (...) {
    // Only the stale report's detail is lost.
  }
  self->registrations_.fetch_add(1, std::memory_order_relaxed);
  self->live_bytes_.fetch_add(len, std::memory_order_relaxed);
  return MRC_OK;
}

void Instrumented::dereg(void *ctx, void *handle) {
  auto *self = static_cast<Instrumented *>(ctx);
  {
    std::lock_guard lock(self->live_mutex_);
    self->live_.erase(handle);
  }
  size_t len = 0;
  void *inner = handle;
  if (self->config_.pagemap_fd >= 0) {
    auto *record = static_cast<FrameRecord *>(handle);
    inner = record->inner;
    len = record->len;
    delete record;
  }
  self->config_.inner->dereg(self->config_.inner_ctx, inner);
  self->deregistrations_.fetch_add(1, std::memory_order_relaxed);
  if (len != 0) self->live_bytes_.fetch_sub(len, std::memory_order_relaxed);
}

int Instrumented::describe(void *ctx, void *handle, char *buf, size_t len) {
  auto *self = static_cast<Instrumented *>(ctx);
  void *inner = self->inner_handle(handle);
  if (self->config_.inner->describe != nullptr) {
    return self->config_.inner->describe(self->config_.inner_ctx, inner, buf, len);
  }
  return std::snprintf(buf, len, "handle %p", inner);
}

// ---- BackendSetup ----------------------------------------------------------------------------

std::unique_ptr<BackendSetup> BackendSetup::create(const Config &config, std::string *error) {
  std::unique_ptr<BackendSetup> setup(new BackendSetup);
  setup->config_ = config;
  Instrumented::Config wrap;
  wrap.seed = mix64(config.seed ^ 0xfa11);
  wrap.pagemap_fd = config.pagemap_fd;
  switch (config.backend) {
    case Backend::kNull: {
      // The null backend injects its own failures (its context's fail_rate and seed).
      mrc_null_params_t params;
      mrc_null_params_init(&params);
      params.fail_rate = config.fail_rate;
      params.seed = config.seed;
      const mrc_status_t status = mrc_null_ctx_create(&params, &setup->null_ctx_);
      if (status != MRC_OK) {
        *error = std::string("mrc_null_ctx_create: ") + mrc_status_string(status);
        return nullptr;
      }
      wrap.inner = mrc_backend_null();
      wrap.inner_ctx = setup->null_ctx_;
      break;
    }
    case Backend::kIouring: {
      mrc_iouring_params_t params;
      mrc_iouring_params_init(&params);
      params.slots = config.iouring_slots;
      const mrc_status_t status = mrc_iouring_ctx_create(&params, &setup->iouring_);
      if (status != MRC_OK) {
        *error = std::string("mrc_iouring_ctx_create: ") + mrc_status_string(status) + " (" +
                 mrc_backend_last_error() + ")";
        return nullptr;
      }
      wrap.inner = mrc_backend_iouring();
      wrap.inner_ctx = setup->iouring_;
      wrap.fail_rate = config.fail_rate;
      break;
    }
    case Backend::kVerbs: {
      setup->verbs_device_ = open_verbs_device(config.rdma_device, config.gid_index, error);
      if (setup->verbs_device_ == nullptr) return nullptr;
      mrc_verbs_params_t params;
      mrc_verbs_params_init(&params);
      params.pd = setup->verbs_device_->pd;
      params.access = 1u << 2;  // IBV_ACCESS_REMOTE_READ: the rdma oracle reads through it
      const mrc_status_t status = mrc_verbs_ctx_create(&params, &setup->verbs_);
      if (status != MRC_OK) {
        *error = std::string("mrc_verbs_ctx_create: ") + mrc_status_string(status) + " (" +
                 mrc_backend_last_error() + ")";
        return nullptr;
      }
      wrap.inner = mrc_backend_verbs();
      wrap.inner_ctx = setup->verbs_;
      wrap.fail_rate = config.fail_rate;
      break;
    }
  }
  setup->instrumented_ = std::make_unique<Instrumented>(wrap);
  return setup;
}

BackendSetup::~BackendSetup() {
  if (iouring_ != nullptr) mrc_iouring_ctx_destroy(iouring_);
  if (null_ctx_ != nullptr) mrc_null_ctx_destroy(null_ctx_);
  if (verbs_ != nullptr) mrc_verbs_ctx_destroy(verbs_);
  verbs_device_.reset();
}

uint64_t BackendSetup::injected() const {
  uint64_t failures = 0;
  if (null_ctx_ != nullptr) mrc_null_ctx_counters(null_ctx_, nullptr, nullptr, &failures);
  return failures + (instrumented_ != nullptr ? instrumented_->injected() : 0);
}

std::vector<std::string> BackendSetup::leaks() const {
  std::vector<std::string> out;
  char line[256];
  const uint64_t regs = instrumented_->registrations();
  const uint64_t deregs = instrumented_->deregistrations();
  if (regs != deregs) {
    std::snprintf(line, sizeof line,
                  "%s: %llu registrations, %llu deregistrations: %lld still registered",
                  instrumented_->ops()->name, static_cast<unsigned long long>(regs),
                  static_cast<unsigned long long>(deregs),
                  static_cast<long long>(regs) - static_cast<long long>(deregs));
    out.emplace_back(line);
  }
  if (null_ctx_ != nullptr) {
    uint64_t null_regs = 0, null_deregs = 0;
    mrc_null_ctx_counters(null_ctx_, &null_regs, &null_deregs, nullptr);
    if (null_regs != null_deregs) {
      std::snprintf(line, sizeof line, "null context: %llu registrations, %llu deregistrations",
                    static_cast<unsigned long long>(null_regs),
                    static_cast<unsigned long long>(null_deregs));
      out.emplace_back(line);
    }
  }
  if (iouring_ != nullptr) {
    unsigned installed = 0, awaiting = 0, free_slots = 0;
    mrc_iouring_ctx_slots(iouring_, &installed, &awaiting, &free_slots);
    if (installed != 0) {
      std::snprintf(line, sizeof line,
                    "iouring: %u buffer slots still installed (%u awaiting release, %u free)",
                    installed, awaiting, free_slots);
      out.emplace_back(line);
    }
  }
  return out;
}

}  // namespace stress
