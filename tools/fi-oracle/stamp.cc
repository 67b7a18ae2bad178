// SPDX-License-Identifier: BSD-3-Clause
#include "tools/fi-oracle/stamp.h"

#include <cstring>

namespace fi_oracle {
namespace {

constexpr unsigned kMsgShift = 40;  // 24 bits of message number
constexpr unsigned kKindShift = 32;

uint32_t mix(size_t index, uint32_t nonce) {
  return static_cast<uint32_t>(index) * 0x9e3779b1u ^ nonce;
}

uint64_t word(uint64_t msg, uint8_t kind, size_t index, uint32_t nonce) {
  return msg << kMsgShift | uint64_t{kind} << kKindShift | mix(index, nonce);
}

}  // namespace

void stamp(void *buf, size_t size, uint64_t msg, uint8_t kind, uint32_t nonce) {
  auto *bytes = static_cast<unsigned char *>(buf);
  for (size_t i = 0; i < size / 8; ++i) {
    uint64_t w = word(msg, kind, i, nonce);
    std::memcpy(bytes + i * 8, &w, 8);
  }
}

Check check(const void *buf, size_t size, uint64_t msg, uint8_t kind, uint32_t nonce) {
  Check out;
  const auto *bytes = static_cast<const unsigned char *>(buf);
  bool first = true;
  for (size_t i = 0; i < size / 8; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes + i * 8, 8);
    if (w == word(msg, kind, i, nonce)) {
      ++out.ok_words;
      continue;
    }
    if (first) {
      out.first_bad_offset = i * 8;
      first = false;
    }
    uint64_t old = w >> kMsgShift;
    if (static_cast<uint32_t>(w) == mix(i, nonce) && old >= 1 && old < msg) {
      ++out.stale_words;
      if (old > out.newest_stale_msg) out.newest_stale_msg = old;
      if (out.oldest_stale_msg == 0 || old < out.oldest_stale_msg) out.oldest_stale_msg = old;
    } else {
      ++out.corrupt_words;
    }
  }
  return out;
}

void poison(void *buf, size_t size) { std::memset(buf, 0xa5, size); }

}  // namespace fi_oracle
