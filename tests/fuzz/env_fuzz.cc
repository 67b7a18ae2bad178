// SPDX-License-Identifier: BSD-3-Clause
// Fuzz target "env": the MRC_* environment parser. An input is lines "NAME=value" (a line
// "NAME" alone unsets it; a NUL ends a value, as it would in a real environment). Known names
// are the variables the library reads (docs/configuration.md); a line naming no known
// variable is skipped. Then:
//   - mrc_cache_params_init_checked must return MRC_OK or MRC_ERR_INVALID, and on
//     MRC_ERR_INVALID name a variable in its message;
//   - mrc_cache_params_init (unchecked) must agree: env_status set exactly when the checked
//     call refused, and mrc_cache_create must refuse such params;
//   - otherwise mrc_cache_create with the null backend (its context from mrc_null_params_init,
//     which reads MRC_NULL_FAIL_*) must succeed, and a get/put and the statistics must work.
// Every variable is unset again after each input.
//
// MRC_MONITOR and MRC_LOG_LEVEL are read once per process (the monitor starts once; the log
// level is cached), so only the first input of a run exercises them; MRC_TEST_DROP_EVENTS
// (a test switch that blinds the monitor) is left out.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mrcache/mrcache.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

constexpr const char *kVariables[] = {
    "MRC_MAX_REGIONS", "MRC_MAX_BYTES",      "MRC_MAX_UNRELEASED",  "MRC_PURGE_ON_FORK",
    "MRC_VERIFY_PFN",  "MRC_ORDERED_UNMAPS", "MRC_STATS",           "MRC_MONITOR",
    "MRC_LOG_LEVEL",   "MRC_NULL_FAIL_RATE", "MRC_NULL_FAIL_EVERY", "MRC_NULL_FAIL_SEED",
};

bool known(const std::string &name) {
  for (const char *v : kVariables) {
    if (name == v) return true;
  }
  return false;
}

void unset_all() {
  for (const char *v : kVariables) unsetenv(v);
}

void quiet_log(void *, mrc_log_level_t, const char *) {}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  mrc_set_log_handler(quiet_log, nullptr);
  unset_all();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = line.find('=');
    const std::string name = line.substr(0, eq);
    if (!known(name)) continue;
    if (eq == std::string::npos) {
      unsetenv(name.c_str());
    } else {
      const std::string value = line.substr(eq + 1);
      setenv(name.c_str(), value.c_str(), 1);  // c_str(): up to the first NUL, as execve would
    }
  }

  mrc_cache_params_t checked;
  char error[256];
  error[0] = '\0';
  const mrc_status_t status = mrc_cache_params_init_checked(&checked, error, sizeof error);
  if (status != MRC_OK && status != MRC_ERR_INVALID) {
    fuzz::fail("mrc_cache_params_init_checked returned %d", status);
  }
  if (status == MRC_ERR_INVALID && std::strstr(error, "MRC_") == nullptr) {
    fuzz::fail("mrc_cache_params_init_checked refused without naming a variable: '%s'", error);
  }
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  if ((params.env_status != MRC_OK) != (status != MRC_OK)) {
    fuzz::fail("mrc_cache_params_init's env_status %d disagrees with the checked call's %d",
               params.env_status, status);
  }

  mrc_null_params_t null_params;
  mrc_null_params_init(&null_params);
  mrc_null_ctx_t *null_ctx = nullptr;
  // "Malformed values are ignored" (backends.h): what init read must be acceptable.
  if (mrc_null_ctx_create(&null_params, &null_ctx) != MRC_OK) {
    fuzz::fail("mrc_null_ctx_create refused what mrc_null_params_init read (fail_rate %g)",
               null_params.fail_rate);
  }
  params.backend = mrc_backend_null();
  params.backend_ctx = null_ctx;
  mrc_cache_t *cache = nullptr;
  const mrc_status_t created = mrc_cache_create(&params, &cache);
  if (status != MRC_OK) {
    if (created == MRC_OK) fuzz::fail("mrc_cache_create accepted params whose env_status failed");
  } else if (created != MRC_OK) {
    fuzz::fail("mrc_cache_create refused params the checked parser accepted: %s",
               mrc_status_string(created));
  }
  if (cache != nullptr) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void *buf = mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) fuzz::fail("mmap failed");
    std::memset(buf, 1, 4 * page);
    for (int i = 0; i < 3; ++i) {
      mrc_region_t *region = nullptr;
      const mrc_status_t got = mrc_get(cache, buf, 4 * page, MRC_PROT_READ, &region);
      // Injected failures (MRC_NULL_FAIL_*) and tiny limits (MRC_MAX_BYTES=1) may refuse.
      if (got == MRC_OK) mrc_put(cache, region);
    }
    mrc_stats_t stats{};
    if (mrc_cache_stats(cache, &stats) != MRC_OK) fuzz::fail("mrc_cache_stats failed");
    mrc_cache_destroy(cache);
    munmap(buf, 4 * page);
  }
  mrc_null_ctx_destroy(null_ctx);
  unset_all();
  return 0;
}
