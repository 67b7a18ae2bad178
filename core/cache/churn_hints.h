// SPDX-License-Identifier: BSD-3-Clause
// The churn policy: which ranges churn (their cached registrations end by an event before
// caching them paid), so that their misses register uncached, and what each costs
// (docs/DESIGN.md, "Churn").
//
// 1. The entries (what each range cost and how often it churned) change only under the cache's
//    mutex_, on the slow path: on_event_removed(), from the drain.
// 2. take_skip() from any thread, one CAS on the range's tickets word; tickets are published
//    under mutex_ (relaxed: they publish nothing but themselves).
// 3. Keyed by a registration's first page, direct-mapped: a range that loses its entry to
//    another starts learning again, and is cached meanwhile.
// 4. Off (MRC_FLAG_CACHE_CHURN): take_skip() is always false and nothing is learnt. Exactness
//    never depends on it: an uncached registration is in no table.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/cache/region.h"
#include "uffd/uffd.h"

namespace mrc {

class ChurnHints {
 public:
  // What a range's registrations and samples cost, in os::ticks(), as last measured.
  struct Costs {
    uint64_t registration;  // one registration (its deregistration is weighed the same)
    uint64_t sample;        // a sample that churns: its watch and its unmap's round trip
  };

  // Set once, before the cache is shared.
  void set_enabled(bool enabled) noexcept { enabled_ = enabled; }
  bool enabled() const noexcept { return enabled_; }

  // A region left the table by an event (an unmap, a remap, a madvise): only a cached
  // registration teaches, not a remembered failure.
  void on_event_removed(const Region &region) noexcept {
    if (!enabled_ || !region.has(Region::kRegistered)) return;
    on_event_removed(region.start, caching_paid(region),
                     {.registration = region.register_ticks,
                      .sample = region.watch_ticks + uffd::Monitor::round_trip_ticks()});
  }

  // Each get a region served after the one that registered it saved a registration and a
  // deregistration (weighed as twice the registration); the watches its misses made and a round
  // trip to the monitor per registration merged into it (each may have been a mapping of its
  // own, whose unmap waits) were the price.
  static bool caching_paid(const Region &region) noexcept {
    const uint64_t saved =
        uint64_t{region.uses.load(std::memory_order_relaxed)} * 2 * region.register_ticks;
    const uint64_t cost =
        region.watch_ticks + uint64_t{region.registrations} * uffd::Monitor::round_trip_ticks();
    return saved != 0 && saved >= cost;
  }

  // A cached region starting at `start` left the table by an event; `paid`: caching it saved
  // more than it cost (caching_paid); `costs`: its own.
  void on_event_removed(uintptr_t start, bool paid, Costs costs) noexcept {
    const size_t at = slot(start);
    Entry &entry = entries_[at];
    if (entry.start != start) {
      if (paid) return;
      entry = Entry{start, 0, kFirstSample};
      publish(at, start, 0);
    }
    if (paid) {
      entry.churns = 0;
      entry.sample_every = kFirstSample;
      publish(at, start, 0);
      return;
    }
    if (entry.churns < kChurnsToSkip) {
      if (++entry.churns < kChurnsToSkip) return;
    } else if (entry.sample_every < kLastSample) {
      entry.sample_every *= 2;  // the sample churned too: look less often
    }
    // The miss that ends the gap is the next sample.
    const uint16_t cap = gap_cap(costs);
    publish(at, start, std::min(next_gap(std::min(entry.sample_every, cap)), cap) - 1);
  }

  // Any thread: whether a get at `start` registers uncached, taking one of its range's tickets
  // (none: not churning, its sample is due or cached, or the policy is off). Cache::get asks first;
  // a miss that did not take one asks again under mutex_ (tickets may have been published
  // meanwhile).
  bool take_skip(uintptr_t start) noexcept {
    if (!enabled_) return false;
    std::atomic<uint64_t> &tickets = tickets_[slot(start)];
    uint64_t word = tickets.load(std::memory_order_relaxed);
    do {
      if ((word >> kTicketBits) != (start >> kPageShift) || (word & kTicketMask) == 0) return false;
    } while (!tickets.compare_exchange_weak(word, word - 1, std::memory_order_relaxed));
    return true;
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
  // The most a gap's uncached registrations (and deregistrations) may cost, in samples.
  static constexpr uint64_t kSamplesPerGap = 4;

  // The registrations whose cost (with their deregistrations) is kSamplesPerGap samples': the
  // longest gap worth its samples. At least 1.
  static uint16_t gap_cap(Costs costs) noexcept {
    if (costs.registration == 0) return kLastSample;  // not measured: the gaps alone decide
    const uint64_t cap = kSamplesPerGap * costs.sample / (2 * costs.registration);
    return static_cast<uint16_t>(std::clamp<uint64_t>(cap, 1, kLastSample));
  }

  struct Entry {
    uintptr_t start = 0;
    uint16_t churns = 0;
    uint16_t sample_every = kFirstSample;
  };

  // A tickets_ word: the range's page number above kTicketBits, its skips left below (at most
  // 3 * kLastSample / 2). Page numbers of user addresses (below 2^57) fit the 48 bits above.
  static constexpr unsigned kPageShift = 12;
  static constexpr unsigned kTicketBits = 16;
  static constexpr uint64_t kTicketMask = (uint64_t{1} << kTicketBits) - 1;
  static_assert(3 * kLastSample / 2 <= kTicketMask);

  void publish(size_t at, uintptr_t start, uint64_t skips) noexcept {
    tickets_[at].store(((uint64_t{start} >> kPageShift) << kTicketBits) | skips,
                       std::memory_order_relaxed);
  }

  // A draw from [sample_every/2, 3*sample_every/2), at least 1.
  uint16_t next_gap(uint16_t sample_every) noexcept {
    random_ ^= random_ << 13;  // xorshift32: the draw only needs to break periods
    random_ ^= random_ >> 17;
    random_ ^= random_ << 5;
    return static_cast<uint16_t>(std::max(1U, sample_every / 2U + random_ % sample_every));
  }

  static size_t slot(uintptr_t start) noexcept {  // Fibonacci hashing of the page number
    static_assert(kEntries == 64);
    return static_cast<size_t>(((start >> kPageShift) * 0x9e3779b97f4a7c15ULL) >> (64 - 6));
  }

  bool enabled_ = true;  // first: read by every exact get, beside the cache's own mode fields
  Entry entries_[kEntries];
  std::atomic<uint64_t> tickets_[kEntries] = {};
  uint32_t random_ = 0x9e3779b9;
};

}  // namespace mrc
