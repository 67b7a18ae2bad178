// SPDX-License-Identifier: BSD-3-Clause
#include "tools/stress/oracle.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tools/stress/backend.h"

namespace stress {

std::vector<uintptr_t> stamp_sites(uintptr_t start, size_t len, unsigned lane, unsigned count,
                                   Rng &rng) {
  std::vector<uintptr_t> sites;
  if (len < kStampBytes || count == 0) return sites;
  const size_t page = page_size();
  const uintptr_t end = start + len;
  const uintptr_t offset = (lane % kMaxLanes) * kLaneBytes;
  auto fits = [&](uintptr_t p) { return p + offset >= start && p + offset + kStampBytes <= end; };
  uintptr_t first = page_down(start);
  uintptr_t last = page_down(end - 1);
  if (!fits(first)) first += page;
  if (last >= first && !fits(last)) last -= page;
  if (last < first || !fits(first) || !fits(last)) return sites;
  const uint64_t pages = (last - first) / page + 1;
  if (pages <= count) {
    for (uintptr_t p = first; p <= last; p += page) sites.push_back(p + offset);
    return sites;
  }
  sites.push_back(first + offset);
  sites.push_back(last + offset);
  while (sites.size() < count) sites.push_back(first + rng.below(pages) * page + offset);
  return sites;
}

void make_stamp(unsigned lane, unsigned char out[kStampBytes]) {
  static std::atomic<uint64_t> sequence{0};
  const uint64_t seq = sequence.fetch_add(1, std::memory_order_relaxed) + 1;
  const uint64_t tag = 0x4d52435354000000ULL | (static_cast<uint64_t>(getpid()) << 8) | lane;
  std::memcpy(out, &tag, 8);
  std::memcpy(out + 8, &seq, 8);
}

std::string hex(const unsigned char *bytes, size_t len) {
  std::string out;
  char buf[4];
  for (size_t i = 0; i < len; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", bytes[i]);
    out += buf;
  }
  return out;
}

namespace {

// Writes the stamp into memory through a volatile pointer: the compiler must not keep it in a
// register or drop it; the kernel reads it through the pages the registration pinned.
void store_stamp(uintptr_t site, const unsigned char *stamp) {
  auto *dst = reinterpret_cast<volatile unsigned char *>(site);
  for (size_t i = 0; i < kStampBytes; ++i) dst[i] = stamp[i];
}

bool memory_holds(uintptr_t site, const unsigned char *stamp) {
  auto *src = reinterpret_cast<const volatile unsigned char *>(site);
  for (size_t i = 0; i < kStampBytes; ++i) {
    if (src[i] != stamp[i]) return false;
  }
  return true;
}

// ---- iouring -------------------------------------------------------------------------------

class IouringOracleThread final : public OracleThread {
 public:
  IouringOracleThread(mrc_iouring_ctx_t *ctx, const Instrumented *wrap, unsigned lane,
                      unsigned pages, int fd)
      : ctx_(ctx), wrap_(wrap), lane_(lane), pages_(pages), fd_(fd) {}
  ~IouringOracleThread() override { close(fd_); }

  CheckResult check(mrc_region_t *region, uintptr_t start, size_t len, Rng &rng) override {
    CheckResult result;
    void *handle = wrap_->inner_handle(mrc_region_handle(region));
    for (uintptr_t site : stamp_sites(start, len, lane_, pages_, rng)) {
      unsigned char stamp[kStampBytes];
      unsigned char found[kStampBytes] = {};
      make_stamp(lane_, stamp);
      store_stamp(site, stamp);
      size_t done = 0;
      const mrc_status_t status = mrc_iouring_ctx_write_fixed(
          ctx_, handle, fd_, reinterpret_cast<const void *>(site), kStampBytes, 0, &done);
      if (status != MRC_OK || done != kStampBytes) {
        result.kind = CheckResult::kError;
        result.address = site;
        result.detail =
            std::string("WRITE_FIXED through buffer ") + std::to_string(mrc_region_key(region)) +
            " failed: " + mrc_status_string(status) + " (" + mrc_backend_last_error() + ")";
        return result;
      }
      if (pread(fd_, found, kStampBytes, 0) != static_cast<ssize_t>(kStampBytes)) {
        result.kind = CheckResult::kError;
        result.address = site;
        result.detail = std::string("reading the oracle's memfd back: ") + strerrordesc_np(errno);
        return result;
      }
      ++result.pages;
      if (std::memcmp(found, stamp, kStampBytes) != 0) {
        result.address = site;
        if (!memory_holds(site, stamp)) {
          result.kind = CheckResult::kError;
          result.detail = "the worker's own lane changed under the check (harness bug)";
          return result;
        }
        result.kind = CheckResult::kStale;
        result.detail = "memory holds " + hex(stamp, kStampBytes) +
                        ", WRITE_FIXED through buffer " + std::to_string(mrc_region_key(region)) +
                        " wrote " + hex(found, kStampBytes);
        return result;
      }
    }
    if (result.pages == 0) result.kind = CheckResult::kUnchecked;
    return result;
  }

 private:
  mrc_iouring_ctx_t *ctx_;
  const Instrumented *wrap_;
  unsigned lane_, pages_;
  int fd_;
};

class IouringOracle final : public Oracle {
 public:
  IouringOracle(mrc_iouring_ctx_t *ctx, const Instrumented *wrap, unsigned pages)
      : ctx_(ctx), wrap_(wrap), pages_(pages) {}
  const char *name() const override { return "iouring"; }
  std::unique_ptr<OracleThread> thread(unsigned lane, std::string *error) override {
    const int fd = memfd_create("mrcache-stress-oracle", MFD_CLOEXEC);
    if (fd < 0) {
      *error = std::string("memfd_create: ") + strerrordesc_np(errno);
      return nullptr;
    }
    return std::make_unique<IouringOracleThread>(ctx_, wrap_, lane, pages_, fd);
  }

 private:
  mrc_iouring_ctx_t *ctx_;
  const Instrumented *wrap_;
  unsigned pages_;
};

// ---- pfn -----------------------------------------------------------------------------------

class PfnOracleThread final : public OracleThread {
 public:
  PfnOracleThread(const Instrumented *wrap, int fd, unsigned lane, unsigned pages)
      : wrap_(wrap), fd_(fd), lane_(lane), pages_(pages) {}

  CheckResult check(mrc_region_t *region, uintptr_t start, size_t len, Rng &rng) override {
    CheckResult result;
    const FrameRecord *record = wrap_->frames(mrc_region_handle(region));
    if (record == nullptr) {
      result.kind = CheckResult::kError;
      result.detail = "the region carries no frame record";
      return result;
    }
    for (uintptr_t site : stamp_sites(start, len, lane_, pages_, rng)) {
      unsigned char stamp[kStampBytes];
      make_stamp(lane_, stamp);
      store_stamp(site, stamp);  // the use: faults a zapped page back in
      uint64_t now = 0;
      if (!read_frames(fd_, page_down(site), page_size(), &now)) {
        result.kind = CheckResult::kError;
        result.address = site;
        result.detail = "reading /proc/self/pagemap failed";
        return result;
      }
      ++result.pages;
      const size_t index = (page_down(site) - record->start) / page_size();
      const uint64_t then = index < record->frames.size() ? record->frames[index] : ~uint64_t{0};
      if (now != then) {
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "the page is frame %#llx now; the registration (key %llu) recorded %#llx",
                      static_cast<unsigned long long>(now),
                      static_cast<unsigned long long>(mrc_region_key(region)),
                      static_cast<unsigned long long>(then));
        result.kind = CheckResult::kStale;
        result.address = site;
        result.detail = buf;
        return result;
      }
    }
    if (result.pages == 0) result.kind = CheckResult::kUnchecked;
    return result;
  }

 private:
  const Instrumented *wrap_;
  int fd_;
  unsigned lane_, pages_;
};

class PfnOracle final : public Oracle {
 public:
  PfnOracle(const Instrumented *wrap, int fd, unsigned pages)
      : wrap_(wrap), fd_(fd), pages_(pages) {}
  const char *name() const override { return "pfn"; }
  std::unique_ptr<OracleThread> thread(unsigned lane, std::string *) override {
    return std::make_unique<PfnOracleThread>(wrap_, fd_, lane, pages_);
  }

 private:
  const Instrumented *wrap_;
  int fd_;
  unsigned pages_;
};

// ---- none ----------------------------------------------------------------------------------

class NoOracleThread final : public OracleThread {
 public:
  CheckResult check(mrc_region_t *, uintptr_t, size_t, Rng &) override {
    return CheckResult{CheckResult::kUnchecked, 0, {}, 0};
  }
};

class NoOracle final : public Oracle {
 public:
  const char *name() const override { return "none"; }
  std::unique_ptr<OracleThread> thread(unsigned, std::string *) override {
    return std::make_unique<NoOracleThread>();
  }
};

}  // namespace

std::unique_ptr<Oracle> make_iouring_oracle(mrc_iouring_ctx_t *ctx, const Instrumented *wrap,
                                            unsigned check_pages) {
  return std::make_unique<IouringOracle>(ctx, wrap, check_pages);
}

std::unique_ptr<Oracle> make_pfn_oracle(const Instrumented *wrap, int pagemap_fd,
                                        unsigned check_pages) {
  return std::make_unique<PfnOracle>(wrap, pagemap_fd, check_pages);
}

std::unique_ptr<Oracle> make_no_oracle() { return std::make_unique<NoOracle>(); }

}  // namespace stress
