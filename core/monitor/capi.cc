// SPDX-License-Identifier: BSD-3-Clause
// The public monitor's C API (include/mrcache/monitor.h): argument checks and translation to
// mrc::monitor::Client. Nothing here throws.
#include <cstdarg>
#include <cstring>

#include "base/error.h"
#include "base/sized.h"
#include "core/monitor/client.h"
#include "mrcache/monitor.h"

struct mrc_monitor {};  // opaque to C; the object behind it is an mrc::monitor::Client

namespace {

[[gnu::cold, gnu::noinline]] __attribute__((format(printf, 1, 2))) mrc_status_t invalid(
    const char *format, ...) noexcept {
  va_list args;
  va_start(args, format);
  mrc::set_last_error_v(format, args);
  va_end(args);
  return MRC_ERR_INVALID;
}

mrc::monitor::Client *to_client(mrc_monitor_t *monitor) {
  return reinterpret_cast<mrc::monitor::Client *>(monitor);
}

// [addr, addr+len) as [*start, *end): false when empty or past the end of the address space.
bool to_range(const void *addr, size_t len, uintptr_t *start, uintptr_t *end) {
  *start = reinterpret_cast<uintptr_t>(addr);
  return len != 0 && !__builtin_add_overflow(*start, len, end);
}

}  // namespace

extern "C" {

void mrc_monitor_params_init(mrc_monitor_params_t *params) {
  if (params == nullptr) return;
  std::memset(params, 0, sizeof *params);
  params->struct_size = sizeof *params;
}

mrc_status_t mrc_monitor_open(const mrc_monitor_params_t *params, mrc_monitor_t **out) {
  if (params == nullptr || out == nullptr) {
    return invalid("mrc_monitor_open: %s is NULL", params == nullptr ? "params" : "out");
  }
  mrc_monitor_params_t known;
  mrc_monitor_params_init(&known);
  if (!mrc::sized_input_copy(&known, sizeof known, params, params->struct_size, sizeof known)) {
    return invalid(
        "mrc_monitor_open: struct_size %zu is not a mrc_monitor_params_t (call "
        "mrc_monitor_params_init; %zu bytes, and a larger struct's tail must be zero)",
        params->struct_size, sizeof known);
  }
  if (known.notify == nullptr) return invalid("mrc_monitor_open: params->notify is NULL");
  constexpr unsigned kKnownFlags = MRC_MONITOR_DELIVERY_THREAD | MRC_MONITOR_ONE_SHOT;
  if ((known.flags & ~kKnownFlags) != 0) {
    return invalid("mrc_monitor_open: unknown flags %#x", known.flags & ~kKnownFlags);
  }
  mrc::monitor::Client *client = nullptr;
  const mrc_status_t status = mrc::monitor::Client::open(known, &client);
  if (status == MRC_OK) *out = reinterpret_cast<mrc_monitor_t *>(client);
  return status;
}

mrc_status_t mrc_monitor_close(mrc_monitor_t *monitor) {
  if (monitor == nullptr) return invalid("mrc_monitor_close: monitor is NULL");
  return to_client(monitor)->close();
}

mrc_status_t mrc_monitor_subscribe(mrc_monitor_t *monitor, const void *addr, size_t len) {
  uintptr_t start = 0, end = 0;
  if (monitor == nullptr) return invalid("mrc_monitor_subscribe: monitor is NULL");
  if (!to_range(addr, len, &start, &end)) {
    return invalid("mrc_monitor_subscribe: [%p, +%zu) is empty or wraps", addr, len);
  }
  return to_client(monitor)->subscribe(start, end);
}

mrc_status_t mrc_monitor_unsubscribe(mrc_monitor_t *monitor, const void *addr, size_t len) {
  uintptr_t start = 0, end = 0;
  if (monitor == nullptr) return invalid("mrc_monitor_unsubscribe: monitor is NULL");
  if (!to_range(addr, len, &start, &end)) {
    return invalid("mrc_monitor_unsubscribe: [%p, +%zu) is empty or wraps", addr, len);
  }
  return to_client(monitor)->unsubscribe(start, end);
}

int mrc_monitor_valid(mrc_monitor_t *monitor, const void *addr, size_t len) {
  uintptr_t start = 0, end = 0;
  if (monitor == nullptr || !to_range(addr, len, &start, &end)) return 0;
  return to_client(monitor)->valid(start, end) ? 1 : 0;
}

mrc_status_t mrc_monitor_deliver(mrc_monitor_t *monitor, size_t *delivered) {
  if (monitor == nullptr) return invalid("mrc_monitor_deliver: monitor is NULL");
  return to_client(monitor)->deliver(delivered);
}

mrc_status_t mrc_monitor_stats_sized(mrc_monitor_t *monitor, mrc_monitor_stats_t *stats,
                                     size_t size) {
  if (monitor == nullptr || stats == nullptr) {
    return invalid("mrc_monitor_stats: %s is NULL", monitor == nullptr ? "monitor" : "stats");
  }
  if (!mrc::sized_output_fits(size, MRC_MONITOR_STATS_SIZE_0_3)) {
    return invalid(
        "mrc_monitor_stats: size %zu is not a mrc_monitor_stats_t (at least %zu, at "
        "most %zu)",
        size, static_cast<size_t>(MRC_MONITOR_STATS_SIZE_0_3), mrc::kMaxStructSize);
  }
  mrc_monitor_stats_t all{};
  to_client(monitor)->stats(&all);
  mrc::sized_output_copy(stats, size, &all, sizeof all);
  return MRC_OK;
}

}  // extern "C"
