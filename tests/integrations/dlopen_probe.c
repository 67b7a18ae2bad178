// SPDX-License-Identifier: BSD-3-Clause
/* Loads libmrcache.so with dlopen, as a plugin of a runtime does (libmrcache-fi.so, an MPI
 * component): its thread-local block must fit glibc's static TLS surplus. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    printf("dlopen failed: %s\n", dlerror());
    return 1;
  }
  const char *(*version)(void) = (const char *(*)(void))dlsym(library, "mrc_version");
  if (version == NULL) return 1;
  printf("loaded libmrcache %s\n", version());
  return 0;
}
