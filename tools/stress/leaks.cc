// SPDX-License-Identifier: BSD-3-Clause
// The leak check of the process (leaks.h).
#include "tools/stress/leaks.h"

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace stress {
namespace {

// "tid name, ..." of every thread of the process.
std::string describe_threads() {
  std::string out;
  DIR *dir = opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (dirent *entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    out += (out.empty() ? "" : ", ") + std::string(entry->d_name) + " " + name;
  }
  closedir(dir);
  return out;
}

// The descriptors opened since the start. The library keeps up to four /proc/self/maps
// descriptors for the life of the process (base/proc_maps.cc: PROCMAP_QUERY needs an open maps
// file): those are listed in *kept, not counted as leaks.
std::vector<OpenFile> new_files(const Baseline &before, std::vector<OpenFile> *kept) {
  std::vector<OpenFile> added;
  const std::string maps = "/proc/" + std::to_string(getpid()) + "/maps";
  for (const OpenFile &file : list_fds()) {
    bool known = false;
    for (const OpenFile &old : before.files)
      known = known || (old.fd == file.fd && old.target == file.target);
    if (known) continue;
    if (file.target == maps && kept->size() < 4) {
      kept->push_back(file);
    } else {
      added.push_back(file);
    }
  }
  return added;
}

}  // namespace

Baseline take_baseline() { return Baseline{take_snapshot(), list_fds()}; }

std::vector<std::string> process_leaks(const Baseline &before, std::vector<std::string> *notes) {
  std::vector<std::string> leaks;
  ProcessSnapshot after;
  std::vector<OpenFile> added, kept;
  for (int attempt = 0; attempt < 100; ++attempt) {
    after = take_snapshot();
    kept.clear();
    added = new_files(before, &kept);
    if (after.vm_pin_kib <= before.snapshot.vm_pin_kib &&
        after.vm_lck_kib <= before.snapshot.vm_lck_kib && added.empty() &&
        after.threads <= before.snapshot.threads) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto compare = [&](const char *what, long then, long now, const char *unit) {
    if (now > then) {
      leaks.push_back(std::string(what) + ": " + std::to_string(then) + unit + " at start, " +
                      std::to_string(now) + unit + " at the end");
    }
  };
  compare("VmPin", before.snapshot.vm_pin_kib, after.vm_pin_kib, " kB");
  compare("VmLck", before.snapshot.vm_lck_kib, after.vm_lck_kib, " kB");
  int allowed_threads = before.snapshot.threads;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // The sanitizer's runtime starts a background thread of its own, lazily.
  if (after.threads == allowed_threads + 1) {
    ++allowed_threads;
    notes->push_back("one extra thread at the end: the sanitizer runtime's (not counted)");
  }
#endif
  compare("threads", allowed_threads, after.threads, "");
  if (after.threads > allowed_threads) leaks.push_back("threads now: " + describe_threads());
  for (const OpenFile &file : added) {
    leaks.push_back("open file: fd " + std::to_string(file.fd) + " -> " + file.target);
  }
  if (!kept.empty()) {
    notes->push_back("the library keeps " + std::to_string(kept.size()) +
                     " /proc/self/maps descriptor(s) open for the life of the process "
                     "(base/proc_maps.cc); not counted as leaks");
  }
  return leaks;
}

}  // namespace stress
