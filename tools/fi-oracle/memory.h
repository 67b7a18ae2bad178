// SPDX-License-Identifier: BSD-3-Clause
// The sender's buffer and the scenarios that change the memory under it (config.h, Scenario).
#pragma once

#include <cstddef>
#include <thread>

#include "tools/fi-oracle/config.h"

namespace fi_oracle {

class SendBuffer {
 public:
  explicit SendBuffer(size_t size);
  ~SendBuffer();
  SendBuffer(const SendBuffer &) = delete;
  SendBuffer &operator=(const SendBuffer &) = delete;

  // A fresh buffer of the kind `scenario` works on (malloc for kFree, an anonymous private
  // mapping otherwise); the old one is released through libc.
  void reset(Scenario scenario);
  // Changes the memory under the buffer. True when the buffer is at the same address afterwards,
  // on new memory (false: the address was not reused, or malloc served the buffer from the
  // heap, and the message tests nothing). For kRace the unmapping
  // thread may still be inside munmap when this returns; finish() joins it.
  bool change(Scenario scenario);
  void finish();

  char *data() const { return data_; }

 private:
  void release();
  bool remap_race();

  size_t size_;
  size_t map_len_;  // size rounded up to pages (mapping kinds)
  char *data_ = nullptr;
  bool malloced_ = false;
  std::thread unmapper_;
};

// The mmap threshold the sender sets so that a buffer of `size` bytes is mmapped by malloc.
void set_malloc_mmap_threshold(size_t size);

}  // namespace fi_oracle
