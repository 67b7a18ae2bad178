// SPDX-License-Identifier: BSD-3-Clause
// Status strings and the library version: the C API's vocabulary.
#include "mrcache/mrcache.h"

extern "C" {

const char *mrc_status_string(mrc_status_t status) {
  switch (status) {
    case MRC_OK: return "success";
    case MRC_ERR_INVALID: return "invalid argument";
    case MRC_ERR_NO_MEMORY: return "out of memory or registration resources";
    case MRC_ERR_BUSY: return "resource busy";
    case MRC_ERR_UNSUPPORTED: return "not supported here";
    case MRC_ERR_BACKEND: return "registration backend failed";
    case MRC_ERR_EXISTS: return "already exists";
    case MRC_ERR_NOT_FOUND: return "not found";
    case MRC_ERR_IO: return "I/O error";
  }
  return "unknown status";
}

const char *mrc_version(void) {
#define MRC_STR2(x) #x
#define MRC_STR(x) MRC_STR2(x)
  return MRC_STR(MRC_VERSION_MAJOR) "." MRC_STR(MRC_VERSION_MINOR) "." MRC_STR(MRC_VERSION_PATCH);
}

}  // extern "C"
