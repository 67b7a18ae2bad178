// SPDX-License-Identifier: BSD-3-Clause
// The pattern a message carries in every 8-byte word: its number, its (op, scenario) and the
// word's index mixed with the run's nonce. A word decodes as the current stamp, the stamp of an
// older message of this run (the bytes of memory that is gone: stale), or neither (corrupt).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fi_oracle {

struct Check {
  size_t ok_words = 0;
  size_t stale_words = 0;
  size_t corrupt_words = 0;
  uint64_t newest_stale_msg = 0;  // the most recent older message found
  uint64_t oldest_stale_msg = 0;
  size_t first_bad_offset = 0;  // byte offset of the first word that is not the current stamp
};

void stamp(void *buf, size_t size, uint64_t msg, uint8_t kind, uint32_t nonce);
Check check(const void *buf, size_t size, uint64_t msg, uint8_t kind, uint32_t nonce);
// A pattern no stamp decodes as (the receiver's buffers between messages).
void poison(void *buf, size_t size);

}  // namespace fi_oracle
