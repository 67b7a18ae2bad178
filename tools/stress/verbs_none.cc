// SPDX-License-Identifier: BSD-3-Clause
// A build without rdma-core (MRC_WITH_VERBS=OFF): no device, no rdma oracle.
#include "tools/stress/backend.h"
#include "tools/stress/oracle.h"

namespace stress {

VerbsDevice::~VerbsDevice() = default;

std::unique_ptr<VerbsDevice> open_verbs_device(const std::string &, int, std::string *error) {
  *error = "this build has no verbs support (configured with MRC_WITH_VERBS=OFF)";
  return nullptr;
}

std::unique_ptr<Oracle> make_rdma_oracle(VerbsDevice *, const Instrumented *, unsigned) {
  return nullptr;
}

}  // namespace stress
