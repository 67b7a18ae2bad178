// SPDX-License-Identifier: BSD-3-Clause
// The ranges one public monitor is subscribed to, each counted: a sorted array of distinct
// [start, end) ranges that may overlap one another (a runtime registers overlapping buffers).
// What the delivery thread asks of it: which ranges overlap a change that was read.
//
// SYNCHRONIZATION: none of its own; its owner (Client) holds its subscriptions mutex around
// every call.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mrc::monitor {

class SubscriptionSet {
 public:
  struct Range {
    uintptr_t start;
    uintptr_t end;
    uint64_t count;
  };

  SubscriptionSet() = default;
  SubscriptionSet(const SubscriptionSet &) = delete;
  SubscriptionSet &operator=(const SubscriptionSet &) = delete;
  ~SubscriptionSet() { delete[] items_; }

  size_t size() const noexcept { return count_; }
  // The range [start, end) exactly, or nullptr.
  Range *find(uintptr_t start, uintptr_t end) noexcept;
  // Adds [start, end) with a count of 1. REQUIRES: find() returned nullptr. False when out of
  // memory (nothing changed).
  [[nodiscard]] bool insert(uintptr_t start, uintptr_t end) noexcept;
  // Removes the range find() returned.
  void erase(Range *range) noexcept;
  // Whether any range overlaps [start, end).
  bool overlaps(uintptr_t start, uintptr_t end) const noexcept;
  // Removes every range that overlaps [start, end), calling gone(const Range &) for each
  // before it goes; returns how many went.
  template <class Gone>
  size_t erase_overlapping(uintptr_t start, uintptr_t end, Gone &&gone) noexcept;
  // Removes every range, calling gone(const Range &) for each.
  template <class Gone>
  void clear(Gone &&gone) noexcept;

 private:
  // Index of the first range that may overlap a range starting at `start`: no range before it
  // ends above `start`, as none is longer than longest_.
  size_t first_candidate(uintptr_t start) const noexcept;
  size_t index_of(uintptr_t start, uintptr_t end) const noexcept;  // insertion point

  Range *items_ = nullptr;
  size_t count_ = 0;
  size_t capacity_ = 0;
  uintptr_t longest_ = 0;  // never shrinks: a bound, not the maximum
};

template <class Gone>
size_t SubscriptionSet::erase_overlapping(uintptr_t start, uintptr_t end, Gone &&gone) noexcept {
  size_t kept = first_candidate(start);
  size_t erased = 0;
  for (size_t i = kept; i < count_; ++i) {
    const Range &range = items_[i];
    if (range.start < end && start < range.end) {
      gone(static_cast<const Range &>(range));
      ++erased;
    } else {
      items_[kept++] = range;
    }
  }
  count_ = kept;
  return erased;
}

template <class Gone>
void SubscriptionSet::clear(Gone &&gone) noexcept {
  for (size_t i = 0; i < count_; ++i) gone(static_cast<const Range &>(items_[i]));
  count_ = 0;
}

}  // namespace mrc::monitor
