// SPDX-License-Identifier: BSD-3-Clause
// The run's shared state: reporting errors and log messages, and what a lack of memory means.
#include "tools/stress/run.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

namespace stress {

std::atomic<bool> g_interrupted{false};
std::atomic<pid_t> g_parent_pid{0};
Run *g_run = nullptr;

void log_handler(void *, mrc_log_level_t level, const char *message) {
  const char *name = level == MRC_LOG_ERROR ? "error" : level == MRC_LOG_WARN ? "warn" : "info";
  if (getpid() != g_parent_pid.load(std::memory_order_relaxed) || g_run == nullptr) {
    // A fork child: the parent's output lock may have been held by another thread at fork.
    dprintf(STDERR_FILENO, "mrcache %s (child %d): %s\n", name, getpid(), message);
    return;
  }
  if (level == MRC_LOG_ERROR) g_run->log_errors.fetch_add(1, std::memory_order_relaxed);
  if (level == MRC_LOG_WARN) g_run->log_warnings.fetch_add(1, std::memory_order_relaxed);
  g_run->out->line(std::string("mrcache ") + name + ": " + message, true);
}

void on_invalidated(void *arg) {
  static_cast<Run *>(arg)->invalidate_callbacks.fetch_add(1, std::memory_order_relaxed);
}

bool says_no_memory(const std::string &text) {
  return text.find(strerrordesc_np(ENOMEM)) != std::string::npos ||
         text.find(mrc_status_string(MRC_ERR_NO_MEMORY)) != std::string::npos;
}

std::string address_space_reached() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return "";
  return "address-space limit RLIMIT_AS=" + format_size(limit.rlim_cur) + " reached (`ulimit -v`)";
}

void add_error(Run &run, std::string text) {
  if (says_no_memory(text)) {
    run.no_memory_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string limit = address_space_reached();
    if (!limit.empty()) text += " [" + limit + "]";
  }
  std::lock_guard lock(run.report_mutex);
  if (run.errors.size() < kMaxReports) {
    run.errors.push_back(text);
    run.out->line("error: " + text, true);
  }
}

std::string prot_name(unsigned prot) {
  std::string s;
  s += (prot & MRC_PROT_READ) != 0 ? 'r' : '-';
  s += (prot & MRC_PROT_WRITE) != 0 ? 'w' : '-';
  return s;
}

std::string range_text(uintptr_t start, size_t len) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%#lx, +%s)", static_cast<unsigned long>(start),
                format_size(len).c_str());
  return buf;
}

std::string address_space_note() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return "";
  return "; RLIMIT_AS is " + format_size(limit.rlim_cur) +
         " (`ulimit -v`): too small for this run? (fewer --threads/--slots, a smaller --max-size, "
         "or a higher limit)";
}

void guarded(void (*body)(Run &, unsigned), Run &run, unsigned index) {
  try {
    body(run, index);
  } catch (const std::exception &e) {
    {
      std::lock_guard lock(run.report_mutex);
      if (run.resource_failure.empty()) run.resource_failure = e.what();
    }
    run.stop.store(true, std::memory_order_relaxed);
  }
}

}  // namespace stress
