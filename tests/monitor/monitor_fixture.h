// SPDX-License-Identifier: BSD-3-Clause
// What the public monitor's tests share: a monitor opened over a recording notify.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "mrcache/monitor.h"

namespace mrc::monitor::test {

inline const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

struct Notified {
  uintptr_t start;
  uintptr_t end;
};

class MonitorTest : public ::testing::Test {
 public:
  mrc_monitor_t *monitor() const { return monitor_; }

 protected:
  void TearDown() override {
    if (monitor_ != nullptr) {
      EXPECT_EQ(mrc_monitor_close(monitor_), MRC_OK);
    }
    for (const Mapping &m : mappings_) {
      munmap(m.base, kPage);  // the guard pages
      munmap(m.base + (m.pages + 1) * kPage, kPage);
      if (!m.inside_gone) munmap(m.base + kPage, m.pages * kPage);
    }
  }
  // Opens monitor_ with `flags`; skips where no monitor can run.
  void open(unsigned flags) {
    mrc_monitor_params_t params;
    mrc_monitor_params_init(&params);
    params.notify = record;
    params.notify_arg = this;
    params.flags = flags;
    const mrc_status_t status = mrc_monitor_open(&params, &monitor_);
    if (status == MRC_ERR_UNSUPPORTED) GTEST_SKIP() << mrc_last_error();
    ASSERT_EQ(status, MRC_OK) << mrc_last_error();
  }
  // A mapping of its own (guard pages of another protection keep it from merging).
  char *map(size_t pages) {
    void *p = mmap(nullptr, (pages + 2) * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    mappings_.push_back({static_cast<char *>(p), pages, false});
    char *inside = static_cast<char *>(p) + kPage;
    if (mprotect(inside, pages * kPage, PROT_READ | PROT_WRITE) != 0) return nullptr;
    return inside;
  }
  // Unmaps what map() returned (the guard pages stay until TearDown).
  void unmap(char *inside) {
    for (Mapping &m : mappings_) {
      if (m.base + kPage == inside && !m.inside_gone) {
        ASSERT_EQ(munmap(inside, m.pages * kPage), 0);
        m.inside_gone = true;
        return;
      }
    }
    FAIL() << "not a mapping of this test";
  }
  std::vector<Notified> notified() {
    std::lock_guard<std::mutex> hold(mutex_);
    return notified_;
  }
  // Whether a notify covered [p, p+length).
  bool was_notified(const void *p, size_t length) {
    const auto start = reinterpret_cast<uintptr_t>(p);
    for (const Notified &n : notified()) {
      if (n.start <= start && start + length <= n.end) return true;
    }
    return false;
  }
  mrc_monitor_stats_t stats() {
    mrc_monitor_stats_t s{};
    EXPECT_EQ(mrc_monitor_stats(monitor_, &s), MRC_OK);
    return s;
  }

  mrc_monitor_t *monitor_ = nullptr;
  // Called from notify, on its thread, when set.
  void (*on_notify_)(MonitorTest *self, void *addr, size_t len) = nullptr;

 private:
  static void record(void *arg, void *addr, size_t len) {
    auto *self = static_cast<MonitorTest *>(arg);
    {
      std::lock_guard<std::mutex> hold(self->mutex_);
      const auto start = reinterpret_cast<uintptr_t>(addr);
      self->notified_.push_back({start, len == SIZE_MAX ? UINTPTR_MAX : start + len});
    }
    if (self->on_notify_ != nullptr) self->on_notify_(self, addr, len);
  }

  std::mutex mutex_;
  std::vector<Notified> notified_;
  struct Mapping {
    char *base;
    size_t pages;
    bool inside_gone;
  };
  std::vector<Mapping> mappings_;
};

}  // namespace mrc::monitor::test
