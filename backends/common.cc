// SPDX-License-Identifier: BSD-3-Clause
// What every backend shares: the cause of a failure (written to the thread's last error,
// base/error.h), argument checks, the not-supported defaults, reading a caller's ops table by
// its struct_size and the completion of a plugin's ops table (mrc_backend_complete, in the
// sized layout and in 0.1's: backend_v0.h).
//
// SYNCHRONIZATION: the only state is the thread-local last error (base/error.h); each thread
// reads and writes only its own. Everything else is pure.
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "backends/backend_v0.h"
#include "backends/backends.h"
#include "base/error.h"
#include "base/sized.h"

namespace mrc::backends {
namespace {

// "<backend>: <cause>" into the thread's last error.
__attribute__((format(printf, 2, 0))) void set_error_v(const char *backend, const char *fmt,
                                                       std::va_list args) noexcept {
  char cause[kLastErrorSize];
  std::vsnprintf(cause, sizeof cause, fmt, args);
  set_last_error("%s: %s", backend != nullptr ? backend : "plugin", cause);
}

}  // namespace

mrc_status_t fail(mrc_status_t status, const char *backend, const char *fmt, ...) noexcept {
  std::va_list args;
  va_start(args, fmt);
  set_error_v(backend, fmt, args);
  va_end(args);
  return status;
}

mrc_status_t checked_status(int raw, const char *backend, const char *op) noexcept {
  if (is_status(raw)) return static_cast<mrc_status_t>(raw);
  return fail(MRC_ERR_BACKEND, backend, "%s returned %d, which is not an mrc_status_t", op, raw);
}

mrc_status_t check_reg_args(const char *backend, const void *addr, std::size_t len, unsigned prot,
                            void *const *handle_out, const std::uint64_t *key) noexcept {
  if (handle_out == nullptr || key == nullptr)
    return fail(MRC_ERR_INVALID, backend, "reg called without handle or key output");
  if (addr == nullptr || len == 0)
    return fail(MRC_ERR_INVALID, backend, "empty range (addr %p, length %zu)", addr, len);
  const auto start = reinterpret_cast<std::uintptr_t>(addr);
  if (start + len < start)
    return fail(MRC_ERR_INVALID, backend, "range %p + %zu wraps around", addr, len);
  if ((prot & ~static_cast<unsigned>(MRC_PROT_READ | MRC_PROT_WRITE)) != 0)
    return fail(MRC_ERR_INVALID, backend, "unknown protection bits 0x%x", prot);
  return MRC_OK;
}

mrc_status_t unsupported_reg(void *, void *, std::size_t, unsigned, void **,
                             std::uint64_t *) noexcept {
  return fail(MRC_ERR_UNSUPPORTED, nullptr, "the plugin has no reg operation");
}

void noop_dereg(void *, void *) noexcept {}

int handle_describe(void *, void *handle, char *buf, std::size_t len) noexcept {
  return std::snprintf(buf, len, "handle %p", handle);
}

mrc_backend_t complete_ops(const mrc_backend_t &in) noexcept {
  return mrc_backend_t{
      .struct_size = sizeof(mrc_backend_t),
      .name = in.name != nullptr ? in.name : "plugin",
      .reg = in.reg != nullptr ? in.reg : unsupported_reg,
      .dereg = in.dereg != nullptr ? in.dereg : noop_dereg,
      .describe = in.describe != nullptr ? in.describe : handle_describe,
  };
}

mrc_status_t read_ops(const mrc_backend_t *caller, mrc_backend_t *known) noexcept {
  // Fields past the caller's struct_size stay NULL: complete_ops gives them their defaults.
  mrc_backend_t read{};
  if (!sized_input_copy(&read, sizeof read, caller, caller->struct_size, MRC_BACKEND_SIZE_0_2)) {
    set_last_error(
        "backend table: struct_size %zu is not a mrc_backend_t this library reads (set it to "
        "sizeof(mrc_backend_t); at least %zu, and any bytes past %zu zero)",
        caller->struct_size, static_cast<std::size_t>(MRC_BACKEND_SIZE_0_2), sizeof read);
    return MRC_ERR_INVALID;
  }
  read.struct_size = sizeof read;
  *known = read;
  return MRC_OK;
}

mrc_status_t complete_caller_ops(const mrc_backend_t *caller, mrc_backend_t *out) noexcept {
  mrc_backend_t known;
  if (mrc_status_t status = read_ops(caller, &known); status != MRC_OK) return status;
  *out = complete_ops(known);
  return MRC_OK;
}

}  // namespace mrc::backends

extern "C" {

// An alias of mrc_last_error() (base/error.cc).
MRC_API const char *mrc_backend_last_error(void) { return mrc::last_error(); }

MRC_API void mrc_backend_set_error(const char *backend, const char *fmt, ...) {
  if (fmt == nullptr) fmt = "unknown error";
  std::va_list args;
  va_start(args, fmt);
  mrc::backends::set_error_v(backend, fmt, args);
  va_end(args);
}

// mrc_backend_t gained struct_size in 0.2: mrc_backend_complete exists as *_v2
// (name@@MRCACHE_0.2) and as *_v0 (name@MRCACHE_0, the 0.1 layout), as in core/cache/capi.cc.
__asm__(".symver mrc_backend_complete_v2, mrc_backend_complete@@MRCACHE_0.2");
__asm__(".symver mrc_backend_complete_v0, mrc_backend_complete@MRCACHE_0");

// `out` is the caller's table type too: it receives in->struct_size bytes (base/sized.h's output
// rule), so that a caller with a larger table than the library's gets its unknown tail zeroed,
// and a caller with a smaller one is not written past its end.
mrc_status_t mrc_backend_complete_v2(const mrc_backend_t *in, mrc_backend_t *out) {
  if (in == nullptr || out == nullptr) {
    mrc::set_last_error("mrc_backend_complete: %s is NULL", in == nullptr ? "in" : "out");
    return MRC_ERR_INVALID;
  }
  const std::size_t caller_size = in->struct_size;  // in and out may be the same table
  mrc_backend_t completed;
  if (mrc_status_t status = mrc::backends::complete_caller_ops(in, &completed); status != MRC_OK)
    return status;
  completed.struct_size = caller_size;
  mrc::sized_output_copy(out, caller_size, &completed, sizeof completed);
  return MRC_OK;
}

mrc_status_t mrc_backend_complete_v0(const mrc::backends::BackendOpsV0 *in,
                                     mrc::backends::BackendOpsV0 *out) {
  if (in == nullptr || out == nullptr) {
    mrc::set_last_error("mrc_backend_complete: %s is NULL", in == nullptr ? "in" : "out");
    return MRC_ERR_INVALID;
  }
  // A program built against 0.2 headers that reached the 0.1 symbol: its tables are sized, in
  // and out alike.
  if (mrc::backends::is_sized_table(in)) {
    return mrc_backend_complete_v2(reinterpret_cast<const mrc_backend_t *>(in),
                                   reinterpret_cast<mrc_backend_t *>(out));
  }
  const mrc_backend_t sized = mrc::backends::ops_from_v0(*in);
  *out = mrc::backends::ops_to_v0(mrc::backends::complete_ops(sized));
  return MRC_OK;
}

}  // extern "C"
