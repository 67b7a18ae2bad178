// SPDX-License-Identifier: BSD-3-Clause
// The null backend: registers nothing. Its key is a process-wide serial number that is never
// reused, so a test or the stress harness can tell every registration apart; its context counts
// registrations and injects failures (every Nth call, or with a seeded probability).
//
// SYNCHRONIZATION: reg, dereg and describe run on any application thread, concurrently.
//   - g_next_serial: one relaxed fetch_add per registration. Uniqueness needs only the
//     atomicity of the read-modify-write, not ordering: nothing is published with a serial.
//   - NullContext counters: relaxed fetch_add; they are statistics read by
//     mrc_null_ctx_counters, which promises no snapshot across the three values.
//   - attempts_: relaxed fetch_add; it numbers the attempts so that the N-th attempt's fate
//     depends only on (seed, N), whichever thread makes it.
//   - The parameters are const after construction.
//   Progress: wait-free.
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "backends/backend_v0.h"
#include "backends/backends.h"

namespace mrc::backends {
namespace {

std::atomic<std::uint64_t> g_next_serial{1};

// splitmix64's finaliser: a bijective mix, so distinct attempt numbers give unrelated draws.
constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

class NullContext {
 public:
  static constexpr const char *kName = "null";

  constexpr NullContext() = default;
  explicit NullContext(const mrc_null_params_t &p)
      : fail_rate_(p.fail_rate), fail_every_(p.fail_every), seed_(p.seed) {}

  static NullContext *resolve(void *opaque) noexcept;

  mrc_status_t reg(void *, std::size_t, unsigned, void **handle, std::uint64_t *key) noexcept {
    const std::uint64_t attempt = attempts_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (fail_every_ != 0 && attempt % fail_every_ == 0) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      return fail(MRC_ERR_BACKEND, kName, "injected failure (every %lu registrations)",
                  fail_every_);
    }
    if (fail_rate_ > 0.0) {
      // 53 random bits as a double in [0, 1).
      const double draw = static_cast<double>(mix(seed_ ^ mix(attempt)) >> 11) * 0x1.0p-53;
      if (draw < fail_rate_) {
        failures_.fetch_add(1, std::memory_order_relaxed);
        return fail(MRC_ERR_BACKEND, kName, "injected failure (rate %g, seed %lu)", fail_rate_,
                    seed_);
      }
    }
    const std::uint64_t serial = g_next_serial.fetch_add(1, std::memory_order_relaxed);
    registrations_.fetch_add(1, std::memory_order_relaxed);
    *key = serial;
    *handle = reinterpret_cast<void *>(static_cast<std::uintptr_t>(serial));
    return MRC_OK;
  }

  void dereg(void *) noexcept { deregistrations_.fetch_add(1, std::memory_order_relaxed); }

  static int describe(void *handle, char *buf, std::size_t len) noexcept {
    return std::snprintf(buf, len, "null: serial %" PRIuPTR,
                         reinterpret_cast<std::uintptr_t>(handle));
  }

  void counters(std::uint64_t *regs, std::uint64_t *deregs, std::uint64_t *failures) const {
    if (regs != nullptr) *regs = registrations_.load(std::memory_order_relaxed);
    if (deregs != nullptr) *deregs = deregistrations_.load(std::memory_order_relaxed);
    if (failures != nullptr) *failures = failures_.load(std::memory_order_relaxed);
  }

 private:
  const double fail_rate_ = 0.0;
  const unsigned long fail_every_ = 0;
  const unsigned long seed_ = 0;
  std::atomic<std::uint64_t> attempts_{0};
  std::atomic<std::uint64_t> registrations_{0};
  std::atomic<std::uint64_t> deregistrations_{0};
  std::atomic<std::uint64_t> failures_{0};
};

static_assert(Backend<NullContext>);

}  // namespace mrc::backends

struct mrc_null_ctx final : mrc::backends::NullContext {
  using NullContext::NullContext;
};

namespace mrc::backends {
namespace {
// backend_ctx NULL: count into a context nobody reads, never fail. Constant-initialised and
// trivially destructible in effect, so it is usable from static constructors and destructors.
constinit NullContext g_default_context;
constexpr mrc_backend_t kNullOps = ops_for<NullContext>();
// What mrc_backend_null@MRCACHE_0 hands a 0.1 program: the same operations, 0.1's layout.
constexpr BackendOpsV0 kNullOpsV0 = ops_to_v0(kNullOps);
}  // namespace

NullContext *NullContext::resolve(void *opaque) noexcept {
  return opaque != nullptr ? static_cast<NullContext *>(static_cast<mrc_null_ctx *>(opaque))
                           : &g_default_context;
}

}  // namespace mrc::backends

namespace {

// A whole-string unsigned or double from the environment; false if unset or malformed.
// getenv: the environment is read at parameter set-up, like every MRC_* variable; callers do not
// change it concurrently.
bool env_unsigned(const char *name, unsigned long *out) {
  const char *text = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
  if (text == nullptr || *text == '\0' || *text == '-') return false;
  char *end = nullptr;
  errno = 0;
  const unsigned long value = std::strtoul(text, &end, 0);
  if (errno != 0 || *end != '\0') return false;
  *out = value;
  return true;
}

bool env_double(const char *name, double *out) {
  const char *text = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
  if (text == nullptr || *text == '\0') return false;
  char *end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (errno != 0 || *end != '\0' || !(value >= 0.0 && value <= 1.0)) return false;
  *out = value;
  return true;
}

}  // namespace

extern "C" {

// mrc_backend_t gained struct_size in 0.2: the getter exists as *_v2 (name@@MRCACHE_0.2) and
// as *_v0 (name@MRCACHE_0, the 0.1 layout); backends/backend_v0.h.
__asm__(".symver mrc_backend_null_v2, mrc_backend_null@@MRCACHE_0.2");
__asm__(".symver mrc_backend_null_v0, mrc_backend_null@MRCACHE_0");

const mrc_backend_t *mrc_backend_null_v2(void) { return &mrc::backends::kNullOps; }
const mrc::backends::BackendOpsV0 *mrc_backend_null_v0(void) { return &mrc::backends::kNullOpsV0; }

MRC_API void mrc_null_params_init(mrc_null_params_t *params) {
  if (params == nullptr) return;
  *params = mrc_null_params_t{.fail_rate = 0.0, .fail_every = 0, .seed = 0};
  env_double("MRC_NULL_FAIL_RATE", &params->fail_rate);
  env_unsigned("MRC_NULL_FAIL_EVERY", &params->fail_every);
  env_unsigned("MRC_NULL_FAIL_SEED", &params->seed);
}

MRC_API mrc_status_t mrc_null_ctx_create(const mrc_null_params_t *params, mrc_null_ctx_t **out) {
  using mrc::backends::fail;
  if (out == nullptr) return fail(MRC_ERR_INVALID, "null", "ctx_create without an output");
  mrc_null_params_t p;
  if (params != nullptr) {
    p = *params;
  } else {
    mrc_null_params_init(&p);
  }
  if (!(p.fail_rate >= 0.0 && p.fail_rate <= 1.0))
    return fail(MRC_ERR_INVALID, "null", "fail_rate %g is outside [0, 1]", p.fail_rate);
  auto *ctx = new (std::nothrow) mrc_null_ctx(p);
  if (ctx == nullptr) return fail(MRC_ERR_NO_MEMORY, "null", "cannot allocate a context");
  *out = ctx;
  return MRC_OK;
}

MRC_API void mrc_null_ctx_destroy(mrc_null_ctx_t *ctx) { delete ctx; }

MRC_API void mrc_null_ctx_counters(const mrc_null_ctx_t *ctx, uint64_t *registrations,
                                   uint64_t *deregistrations, uint64_t *failures) {
  if (ctx == nullptr) {
    if (registrations != nullptr) *registrations = 0;
    if (deregistrations != nullptr) *deregistrations = 0;
    if (failures != nullptr) *failures = 0;
    return;
  }
  ctx->counters(registrations, deregistrations, failures);
}

}  // extern "C"
