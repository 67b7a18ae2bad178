// Which ranges churn: their cached registrations end by an event (munmap, mremap, madvise) before
// caching them paid, i.e. before gets used them again often enough that the registrations they
// saved outweigh the watch and the unmap's round trip to the monitor (Cache::caching_paid; a
// range never used again never pays). Caching such a range only made the application's munmap
// wait for the monitor. A miss there registers uncached (no watch, deregistered at the last put)
// instead, which costs what no cache costs. Every so often a miss of a churning range is cached
// anyway (a sample): one that pays ends the churn, and caching is back (docs/DESIGN.md, "Churn").
//
// SYNCHRONIZATION: the cache's mutex_ guards all of it (slow path only; the hit path never
// reads it). Keyed by the registration's first page, in a small direct-mapped table: a range
// that loses its entry to another starts learning again (it is cached meanwhile).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mrc {

class ChurnHints {
 public:
  // A cached region starting at `start` left the table by an event; `paid`: caching it saved
  // more than it cost (Cache::caching_paid).
  void on_event_removed(uintptr_t start, bool paid) noexcept {
    Entry &entry = entries_[slot(start)];
    if (entry.start != start) {
      if (paid) return;
      entry = Entry{start, 0, 0, kFirstSample};
    }
    if (paid) {
      entry.churns = 0;
      entry.sample_every = kFirstSample;
    } else if (entry.churns < kChurnsToSkip) {
      if (++entry.churns == kChurnsToSkip) entry.until_sample = next_gap(entry.sample_every);
    } else if (entry.sample_every < kLastSample) {
      entry.sample_every *= 2;  // the sample churned too: look less often
    }
  }

  // Whether a miss at `start` registers uncached (a counted skip), or caches (no churn known,
  // or a sample).
  bool skip_caching(uintptr_t start) noexcept {
    Entry &entry = entries_[slot(start)];
    if (entry.start != start || entry.churns < kChurnsToSkip) return false;
    if (--entry.until_sample != 0) return true;
    entry.until_sample = next_gap(entry.sample_every);
    return false;
  }

 private:
  // Two registrations in a row that churned make a range churning (one could be chance: the
  // buffer's last message).
  static constexpr uint16_t kChurnsToSkip = 2;
  // A churning range's misses cache one in sample_every on average: 16 at first, doubling while
  // the samples churn, up to 1024 (a sample costs a watch and an unmap's round trip to the
  // monitor). The gaps are drawn from [sample_every/2, 3*sample_every/2): a fixed period could
  // fall in step with the application's (always the last of a message's gets, never one that
  // pays).
  static constexpr uint16_t kFirstSample = 16;
  static constexpr uint16_t kLastSample = 1024;
  static constexpr size_t kEntries = 64;

  struct Entry {
    uintptr_t start = 0;
    uint16_t churns = 0;
    uint16_t until_sample = 0;  // misses left before the next sample (while churning)
    uint16_t sample_every = kFirstSample;
  };

  uint16_t next_gap(uint16_t sample_every) noexcept {
    random_ ^= random_ << 13;  // xorshift32: the draw only needs to break periods
    random_ ^= random_ >> 17;
    random_ ^= random_ << 5;
    return static_cast<uint16_t>(sample_every / 2 + random_ % sample_every);
  }

  static size_t slot(uintptr_t start) noexcept {  // Fibonacci hashing of the page number
    static_assert(kEntries == 64);
    return static_cast<size_t>(((start >> 12) * 0x9e3779b97f4a7c15ULL) >> (64 - 6));
  }

  Entry entries_[kEntries];
  uint32_t random_ = 0x9e3779b9;
};

}  // namespace mrc
