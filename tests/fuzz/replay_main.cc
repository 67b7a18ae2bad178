// SPDX-License-Identifier: BSD-3-Clause
// A main() for a fuzz target built without libFuzzer: runs LLVMFuzzerTestOneInput once on each
// file named, and on every file of each directory named. After --prefix=P, files found in the
// directories named next count only when their name starts with P (regressions/ holds every
// target's inputs, as <target>-<name>). Exits 0 when every input ran (a crash ends the program), 1
// when an argument could not be read, 2 on usage errors.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

namespace {

bool run_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return false;
  }
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>()};
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
  // A copy of exactly `size` bytes on the heap, as libFuzzer passes it: ASan sees a read past
  // the end.
  std::vector<uint8_t> data(bytes.begin(), bytes.end());
  (void)LLVMFuzzerTestOneInput(data.empty() ? nullptr : data.data(), data.size());
  return true;
}

}  // namespace

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::string prefix;
  size_t ran = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--prefix=", 0) == 0) {
      prefix = arg.substr(9);
      continue;
    }
    if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "usage: %s [--prefix=P] FILE|DIR...\n", argv[0]);
      return 2;
    }
    struct stat st {};
    if (stat(arg.c_str(), &st) != 0) {
      std::fprintf(stderr, "replay: no such file or directory: %s\n", arg.c_str());
      ok = false;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      ok = run_file(arg) && ok;
      ran += 1;
      continue;
    }
    std::vector<std::string> names;
    if (DIR *dir = opendir(arg.c_str())) {
      while (const dirent *entry = readdir(dir)) {
        const std::string name = entry->d_name;
        if (name[0] == '.' || name.rfind(prefix, 0) != 0) continue;
        names.push_back(name);
      }
      closedir(dir);
    }
    std::sort(names.begin(), names.end());  // a stable order: a failure names the same input
    for (const std::string &name : names) {
      ok = run_file(arg + "/" + name) && ok;
      ran += 1;
    }
  }
  std::printf("replay: %zu input(s) ran\n", ran);
  return ok ? 0 : 1;
}
