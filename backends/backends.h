// SPDX-License-Identifier: BSD-3-Clause
// backends/: the built-in registration engines behind mrc_backend_t.
//
// The ABI boundary is the C ops table mrc_backend_t (include/mrcache/mrcache.h); inside the
// library an engine is a context class that satisfies the Backend concept below, and
// ops_for<Engine>() turns it into an ops table with designated initialisers. Every table the
// core holds is complete (complete_ops): missing operations of a runtime's plugin are filled with
// not-supported defaults, so the core calls reg/dereg/describe without testing for NULL (the
// model is rdma-core's verbs_context_ops and dummy_ops.c). A caller's table is read by its
// struct_size (read_ops, the size rule of mrcache.h); the 0.1 layout, which had none, and the
// getters that 0.1 programs call are in backend_v0.h.
//
// One folder per engine: null/, iouring/, verbs/. The contract every engine and every plugin
// keeps is in backends/README.md.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mrcache/mrcache.h"

namespace mrc::backends {

// An engine: `Ctx::kName` names it in messages; `Ctx::resolve(void *)` turns the opaque
// backend_ctx into the engine (nullptr = no usable context: reg fails with MRC_ERR_INVALID);
// the three operations never throw.
// (clang-format 14 tears compound requirements with noexcept apart.)
// clang-format off
template <class Ctx>
concept Backend = requires(Ctx &ctx, void *opaque, void *addr, std::size_t len, unsigned prot,
                           void **handle_out, std::uint64_t *key, void *handle, char *buf) {
  { Ctx::kName } -> std::convertible_to<const char *>;
  { Ctx::resolve(opaque) } noexcept -> std::same_as<Ctx *>;
  { ctx.reg(addr, len, prot, handle_out, key) } noexcept -> std::same_as<mrc_status_t>;
  { ctx.dereg(handle) } noexcept -> std::same_as<void>;
  { ctx.describe(handle, buf, len) } noexcept -> std::same_as<int>;
};
// clang-format on

// Records "<backend>: <cause>" as this thread's last error (base/error.h: what mrc_last_error()
// and its alias mrc_backend_last_error() return). Returns `status`
// so that a failure reads `return fail(MRC_ERR_NO_MEMORY, kName, "...", ...);`.
mrc_status_t fail(mrc_status_t status, const char *backend, const char *fmt, ...) noexcept
    __attribute__((format(printf, 3, 4)));

// The checks every reg shares: outputs present, len > 0, no wrap-around, known prot bits.
// On failure sets the last error and returns MRC_ERR_INVALID.
[[nodiscard]] mrc_status_t check_reg_args(const char *backend, const void *addr, std::size_t len,
                                          unsigned prot, void *const *handle_out,
                                          const std::uint64_t *key) noexcept;

// The not-supported defaults and the completion of a runtime's table.
mrc_status_t unsupported_reg(void *ctx, void *addr, std::size_t len, unsigned prot, void **handle,
                             std::uint64_t *key) noexcept;
void noop_dereg(void *ctx, void *handle) noexcept;
int handle_describe(void *ctx, void *handle, char *buf, std::size_t len) noexcept;
// `in` with every NULL operation replaced by its default (name NULL -> "plugin"); struct_size
// is the library's sizeof. `in` is a table in the library's layout (read_ops made it one).
[[nodiscard]] mrc_backend_t complete_ops(const mrc_backend_t &in) noexcept;
// The size rule of mrcache.h for a caller's table: `known` receives the fields of `caller` that
// this library knows (the others NULL), struct_size = sizeof. MRC_ERR_INVALID, with the reason
// in the thread's last error and `known` unchanged, when caller->struct_size is not one this
// library reads. `caller` is not NULL.
[[nodiscard]] mrc_status_t read_ops(const mrc_backend_t *caller, mrc_backend_t *known) noexcept;
// read_ops, then complete_ops: what every entry point that takes a caller's table does
// (mrc_backend_complete, and Cache::create for mrc_cache_params_t.backend).
[[nodiscard]] mrc_status_t complete_caller_ops(const mrc_backend_t *caller,
                                               mrc_backend_t *out) noexcept;

// Whether `raw` is one of mrc_status_t's values. A plugin's operation is C: it may return any int
// (an errno, a count, garbage), which must not reach the caller as if it were a status.
constexpr bool is_status(int raw) noexcept {
  return raw <= static_cast<int>(MRC_OK) && raw >= static_cast<int>(MRC_ERR_IO);
}
// `raw` as a status: itself when it is one, else MRC_ERR_BACKEND with "<backend>: <op> returned
// <raw>, which is not an mrc_status_t" as the thread's last error.
[[nodiscard]] mrc_status_t checked_status(int raw, const char *backend, const char *op) noexcept;

// The operations the core calls, over a complete table (complete_ops): the same calls as the
// table's, except that reg's result is always an mrc_status_t (checked_status; backends.h of the
// public headers promises it). A plain value: copied into the cache, no pointer to the table.
class CheckedOps {
 public:
  CheckedOps() = default;
  explicit CheckedOps(const mrc_backend_t &complete) noexcept
      : name(complete.name), ops_(complete) {}

  const char *name = nullptr;  // never NULL once made from a complete table

  mrc_status_t reg(void *ctx, void *addr, std::size_t len, unsigned prot, void **handle,
                   std::uint64_t *key) const noexcept {
    // Converted before anything reads it as an mrc_status_t (a load of a value outside the
    // enumeration is undefined, and UBSan's enum check would abort on it).
    const int raw = static_cast<int>(ops_.reg(ctx, addr, len, prot, handle, key));
    if (__builtin_expect(is_status(raw), 1)) return static_cast<mrc_status_t>(raw);
    return checked_status(raw, name, "reg");
  }
  void dereg(void *ctx, void *handle) const noexcept { ops_.dereg(ctx, handle); }
  int describe(void *ctx, void *handle, char *buf, std::size_t len) const noexcept {
    return ops_.describe(ctx, handle, buf, len);
  }

 private:
  mrc_backend_t ops_{};
};

// A complete ops table for an engine. reg validates its arguments, resolves the context and
// calls the engine; dereg and describe trust what reg handed out.
template <Backend Ctx>
constexpr mrc_backend_t ops_for() noexcept {
  return mrc_backend_t{
      .struct_size = sizeof(mrc_backend_t),
      .name = Ctx::kName,
      .reg = [](void *opaque, void *addr, std::size_t len, unsigned prot, void **handle,
                std::uint64_t *key) noexcept -> mrc_status_t {
        if (mrc_status_t s = check_reg_args(Ctx::kName, addr, len, prot, handle, key); s != MRC_OK)
          return s;
        Ctx *ctx = Ctx::resolve(opaque);
        if (ctx == nullptr)
          return fail(MRC_ERR_INVALID, Ctx::kName, "no context (backend_ctx is NULL)");
        return ctx->reg(addr, len, prot, handle, key);
      },
      .dereg =
          [](void *opaque, void *handle) noexcept {
            Ctx *ctx = Ctx::resolve(opaque);
            if (ctx != nullptr) ctx->dereg(handle);
          },
      .describe = [](void *opaque, void *handle, char *buf, std::size_t len) noexcept -> int {
        Ctx *ctx = Ctx::resolve(opaque);
        if (ctx == nullptr) return handle_describe(opaque, handle, buf, len);
        return ctx->describe(handle, buf, len);
      },
  };
}

}  // namespace mrc::backends
