// What every backend shares: the cause of a failure (written to the thread's last error,
// base/error.h), argument checks, the not-supported defaults and the completion of a plugin's
// ops table.
//
// SYNCHRONIZATION: the only state is the thread-local last error (base/error.h); each thread
// reads and writes only its own. Everything else is pure.
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "backends/backends.h"
#include "base/error.h"

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
      .name = in.name != nullptr ? in.name : "plugin",
      .reg = in.reg != nullptr ? in.reg : unsupported_reg,
      .dereg = in.dereg != nullptr ? in.dereg : noop_dereg,
      .describe = in.describe != nullptr ? in.describe : handle_describe,
  };
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

MRC_API mrc_status_t mrc_backend_complete(const mrc_backend_t *in, mrc_backend_t *out) {
  if (in == nullptr || out == nullptr) return MRC_ERR_INVALID;
  *out = mrc::backends::complete_ops(*in);
  return MRC_OK;
}

}  // extern "C"
