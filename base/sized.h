// SPDX-License-Identifier: BSD-3-Clause
// The size rule of the C ABI's growing structs (include/mrcache/mrcache.h, top): shared by every
// entry point that takes a struct with a size, so that all of them accept and refuse alike.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace mrc {

// No struct of the API comes near this: a larger struct_size is an uninitialised field, and
// scanning its "tail" for zeros would read far past the caller's struct.
inline constexpr size_t kMaxStructSize = 4096;

// An input struct of `size` bytes at `in` over the library's `known` bytes at `out` (which
// holds the defaults): false, `out` unchanged, when size < min_size or when bytes past the
// library's struct are not zero (a field this library cannot honour).
inline bool sized_input_copy(void *out, size_t known, const void *in, size_t size,
                             size_t min_size) noexcept {
  if (size < min_size || size > kMaxStructSize) return false;
  const auto *bytes = static_cast<const unsigned char *>(in);
  for (size_t i = known; i < size; ++i) {
    if (bytes[i] != 0) return false;
  }
  std::memcpy(out, in, std::min(size, known));
  return true;
}

// Whether an output struct's `size` can be the caller's: above kMaxStructSize it is garbage, and
// zeroing that "tail" would write far past the caller's struct.
inline bool sized_output_fits(size_t size, size_t min_size) noexcept {
  return size >= min_size && size <= kMaxStructSize;
}

// An output struct: the caller's `size` bytes (sized_output_fits) receive what fits of the
// library's `known` bytes, and a tail the library does not know is zeroed.
inline void sized_output_copy(void *out, size_t size, const void *in, size_t known) noexcept {
  std::memcpy(out, in, std::min(size, known));
  if (size > known) std::memset(static_cast<unsigned char *>(out) + known, 0, size - known);
}

}  // namespace mrc
