// SPDX-License-Identifier: BSD-3-Clause
#include "tools/ucx-rcache/loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

namespace mrc_tools {

namespace {

constexpr const char *kModule = "mrcache-ucx-rcache.so";

const MrcUcxRcacheApi *load() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  const std::string path = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
  const std::string candidates[] = {path.substr(0, path.rfind('/') + 1) + kModule,
                                    MRC_UCX_MODULE_BUILD_PATH,
                                    std::string(MRC_UCX_MODULE_INSTALL_DIR) + "/" + kModule};
  void *module = nullptr;
  for (const std::string &candidate : candidates) {
    if (candidate.empty() || module != nullptr) continue;
    module = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (module == nullptr) {
    throw std::runtime_error(std::string("ucx: no UCX module (") + dlerror() +
                             "): install libucx-dev and rebuild");
  }
  auto api_fn = reinterpret_cast<MrcUcxRcacheApiFn>(dlsym(module, "mrc_ucx_rcache_api"));
  if (api_fn == nullptr) throw std::runtime_error("ucx: the module has no API");
  return api_fn();
}

}  // namespace

UcxRcache::UcxRcache(const mrc_backend_t *engine, void *engine_ctx) : api_(load()) {
  char err[256] = "";
  rcache_ = api_->create(engine, engine_ctx, err, sizeof err);
  if (rcache_ == nullptr) throw std::runtime_error(std::string("ucx: ") + err);
}

UcxRcache::~UcxRcache() { api_->destroy(rcache_); }

void *UcxRcache::get(void *addr, size_t len) {
  char err[256] = "";
  void *region = api_->get(rcache_, addr, len, err, sizeof err);
  if (region == nullptr) throw std::runtime_error(err);
  return region;
}

}  // namespace mrc_tools
