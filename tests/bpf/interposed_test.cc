// SPDX-License-Identifier: BSD-3-Clause
// A program whose libc mremap, munmap and madvise are interposed, as UCX 1.13's libucm does
// (its mremap drops the fifth argument, so every MREMAP_FIXED fails with EINVAL): the eBPF
// monitor's self-test proves the kernel's hooks by raw system calls, so it passes all the same.
// Skips, saying why, where the programs cannot run; MRC_BPF_REQUIRED=1 makes that a failure.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bpf/process_ring.h"

// The interposers: every call fails, as the broken ones do for the calls the self-test makes.
extern "C" void *mremap(void *, size_t, size_t, int, ...) {
  errno = EINVAL;
  return MAP_FAILED;
}
extern "C" int munmap(void *, size_t) {
  errno = EINVAL;
  return -1;
}
extern "C" int madvise(void *, size_t, int) {
  errno = EINVAL;
  return -1;
}

namespace mrc::bpf {
namespace {

TEST(Interposed, TheSelfTestUsesTheKernelNotLibc) {
  ASSERT_EQ(mremap(nullptr, 0, 0, 0), MAP_FAILED) << "the interposer is in place";
  ProcessRing *ring = nullptr;
  if (ProcessRing::open_own(ProcessRing::kDefaultRingBytes, &ring) != MRC_OK) {
    const std::string why = mrc_last_error();
    EXPECT_EQ(why.find("self-test"), std::string::npos) << why;
    const char *required = getenv("MRC_BPF_REQUIRED");
    if (required != nullptr && strcmp(required, "1") == 0) FAIL() << why;
    GTEST_SKIP() << "the programs cannot run here: " << why;
  }
  ring->close();
}

}  // namespace
}  // namespace mrc::bpf
