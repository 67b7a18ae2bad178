// The calling thread's last error. SYNCHRONIZATION: see error.h (thread-local, nothing shared).
#include "base/error.h"

#include <cstdio>

#include "mrcache/mrcache.h"

namespace mrc {
namespace {
thread_local char tls_last_error[kLastErrorSize];
}  // namespace

void set_last_error(const char *format, ...) noexcept {
  std::va_list args;
  va_start(args, format);
  set_last_error_v(format, args);
  va_end(args);
}

void set_last_error_v(const char *format, std::va_list args) noexcept {
  std::vsnprintf(tls_last_error, sizeof tls_last_error, format, args);
}

void clear_last_error() noexcept { tls_last_error[0] = '\0'; }

const char *last_error() noexcept { return tls_last_error; }

}  // namespace mrc

extern "C" {

const char *mrc_last_error(void) { return mrc::last_error(); }

}  // extern "C"
