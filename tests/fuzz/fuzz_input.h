// SPDX-License-Identifier: BSD-3-Clause
// Reads a fuzz input as a stream of choices. Past the end every read returns 0, so any input,
// however short, is a complete program. (libFuzzer's FuzzedDataProvider is clang's only: the
// targets also build with GCC, for the replay tests.)
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fuzz {

class Input {
 public:
  Input(const uint8_t *data, size_t size) : data_(data), size_(size) {}

  bool done() const { return pos_ >= size_; }
  size_t remaining() const { return done() ? 0 : size_ - pos_; }

  uint8_t byte() { return done() ? 0 : data_[pos_++]; }
  uint16_t u16() { return static_cast<uint16_t>(byte() | (byte() << 8)); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) | (static_cast<uint32_t>(u16()) << 16); }
  uint64_t u64() { return static_cast<uint64_t>(u32()) | (static_cast<uint64_t>(u32()) << 32); }
  // [0, n); 0 when n is 0.
  uint32_t below(uint32_t n) { return n == 0 ? 0 : u32() % n; }
  uint8_t small_below(uint8_t n) { return n == 0 ? 0 : static_cast<uint8_t>(byte() % n); }
  bool flag() { return (byte() & 1) != 0; }
  // Up to `max` bytes into out; returns how many were copied.
  size_t bytes(void *out, size_t max) {
    const size_t n = max < remaining() ? max : remaining();
    if (n != 0) std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return n;
  }

 private:
  const uint8_t *data_;
  size_t size_;
  size_t pos_ = 0;
};

// A failed invariant of a harness: print and abort, which libFuzzer (and ctest) report as a
// crash with the input that caused it.
[[noreturn]] inline void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
inline void fail(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::fputs("fuzz harness: ", stderr);
  std::vfprintf(stderr, fmt, args);
  std::fputc('\n', stderr);
  va_end(args);
  std::abort();
}

}  // namespace fuzz
