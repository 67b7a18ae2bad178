// SPDX-License-Identifier: BSD-3-Clause
// Helpers shared by the backend tests: contexts and mappings that clean up after themselves.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <string>

#include "mrcache/mrcache.h"

namespace mrc_test {

struct NullCtx {
  mrc_null_ctx_t *ctx = nullptr;
  explicit NullCtx(const mrc_null_params_t *p = nullptr) {
    EXPECT_EQ(mrc_null_ctx_create(p, &ctx), MRC_OK) << mrc_backend_last_error();
  }
  ~NullCtx() { mrc_null_ctx_destroy(ctx); }
  NullCtx(const NullCtx &) = delete;
  NullCtx &operator=(const NullCtx &) = delete;
  NullCtx(NullCtx &&) = delete;
  NullCtx &operator=(NullCtx &&) = delete;
};

inline const mrc_backend_t &Ops() { return *mrc_backend_iouring(); }

inline std::string LastError() { return mrc_backend_last_error(); }

inline bool Contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

struct IouringCtx {
  mrc_iouring_ctx_t *ctx = nullptr;
  explicit IouringCtx(unsigned slots = 0, io_uring *ring = nullptr, unsigned flags = 0) {
    mrc_iouring_params_t p;
    mrc_iouring_params_init(&p);
    p.slots = slots;
    p.ring = ring;
    p.flags = flags;
    const mrc_status_t s = mrc_iouring_ctx_create(&p, &ctx);
    EXPECT_EQ(s, MRC_OK) << LastError();
  }
  ~IouringCtx() { mrc_iouring_ctx_destroy(ctx); }
  IouringCtx(const IouringCtx &) = delete;
  IouringCtx &operator=(const IouringCtx &) = delete;
  IouringCtx(IouringCtx &&) = delete;
  IouringCtx &operator=(IouringCtx &&) = delete;
  struct Slots {
    unsigned installed, awaiting, free;
  };
  Slots slots() const {
    Slots s{};
    mrc_iouring_ctx_slots(ctx, &s.installed, &s.awaiting, &s.free);
    return s;
  }
};

// An anonymous private mapping, pre-faulted.
struct Mapping {
  void *addr = nullptr;
  size_t len = 0;
  explicit Mapping(size_t bytes, int prot = PROT_READ | PROT_WRITE) : len(bytes) {
    addr = mmap(nullptr, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    EXPECT_NE(addr, MAP_FAILED);
  }
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) munmap(addr, len);
  }
  Mapping(const Mapping &) = delete;
  Mapping &operator=(const Mapping &) = delete;
  Mapping(Mapping &&) = delete;
  Mapping &operator=(Mapping &&) = delete;
  char *bytes() const { return static_cast<char *>(addr); }
};

struct Registration {
  void *handle = nullptr;
  uint64_t key = 0;
};

inline Registration MustReg(mrc_iouring_ctx_t *ctx, void *addr, size_t len) {
  Registration r;
  const mrc_status_t s =
      Ops().reg(ctx, addr, len, MRC_PROT_READ | MRC_PROT_WRITE, &r.handle, &r.key);
  EXPECT_EQ(s, MRC_OK) << LastError();
  return r;
}

}  // namespace mrc_test
