// SPDX-License-Identifier: BSD-3-Clause
// The calling thread's last error (error.h).
//
// The text lives on the heap, allocated at a thread's first error and freed when it exits, not in
// a thread-local array: libmrcache's thread-local block must stay small enough for a dlopen
// (docs/DESIGN.md, "C ABI": a library with initial-exec thread-locals is loaded into glibc's
// static TLS surplus, about 1.5 KiB for every such library a process dlopens).
#include "base/error.h"

#include <cstdio>
#include <cstdlib>

#include "mrcache/mrcache.h"

namespace mrc {
namespace {

// Owns the thread's text; its destructor runs at thread exit.
struct LastError {
  char *text = nullptr;
  bool lost = false;  // a reason could not be kept (no memory for the text)
  LastError() = default;
  LastError(const LastError &) = delete;
  LastError &operator=(const LastError &) = delete;
  ~LastError() { std::free(text); }
};
thread_local LastError tls_last_error;

}  // namespace

void set_last_error(const char *format, ...) noexcept {
  std::va_list args;
  va_start(args, format);
  set_last_error_v(format, args);
  va_end(args);
}

void set_last_error_v(const char *format, std::va_list args) noexcept {
  LastError &error = tls_last_error;
  if (error.text == nullptr) {
    error.text = static_cast<char *>(std::malloc(kLastErrorSize));
    error.lost = error.text == nullptr;
    if (error.lost) return;
  }
  std::vsnprintf(error.text, kLastErrorSize, format, args);
}

void clear_last_error() noexcept {
  LastError &error = tls_last_error;
  error.lost = false;
  if (error.text != nullptr) error.text[0] = '\0';
}

const char *last_error() noexcept {
  const LastError &error = tls_last_error;
  if (error.lost) return "the reason was lost: no memory to keep it";
  return error.text != nullptr ? error.text : "";
}

}  // namespace mrc

extern "C" {

const char *mrc_last_error(void) { return mrc::last_error(); }

}  // extern "C"
