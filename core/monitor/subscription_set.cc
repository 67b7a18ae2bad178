// SPDX-License-Identifier: BSD-3-Clause
// The counted ranges of one public monitor (subscription_set.h).
#include "core/monitor/subscription_set.h"

#include <algorithm>
#include <new>

namespace mrc::monitor {

namespace {
constexpr size_t kFirstCapacity = 64;
}  // namespace

size_t SubscriptionSet::index_of(uintptr_t start, uintptr_t end) const noexcept {
  const Range *found = std::partition_point(items_, items_ + count_, [&](const Range &range) {
    return range.start < start || (range.start == start && range.end < end);
  });
  return static_cast<size_t>(found - items_);
}

size_t SubscriptionSet::first_candidate(uintptr_t start) const noexcept {
  const uintptr_t from = start > longest_ ? start - longest_ : 0;
  const Range *found = std::partition_point(
      items_, items_ + count_, [from](const Range &range) { return range.start < from; });
  return static_cast<size_t>(found - items_);
}

SubscriptionSet::Range *SubscriptionSet::find(uintptr_t start, uintptr_t end) noexcept {
  const size_t at = index_of(start, end);
  if (at < count_ && items_[at].start == start && items_[at].end == end) return &items_[at];
  return nullptr;
}

bool SubscriptionSet::insert(uintptr_t start, uintptr_t end) noexcept {
  if (count_ == capacity_) {
    const size_t grown = std::max(kFirstCapacity, 2 * capacity_);
    Range *fresh = new (std::nothrow) Range[grown];
    if (fresh == nullptr) return false;
    std::copy(items_, items_ + count_, fresh);
    delete[] items_;
    items_ = fresh;
    capacity_ = grown;
  }
  const size_t at = index_of(start, end);
  std::copy_backward(items_ + at, items_ + count_, items_ + count_ + 1);
  items_[at] = Range{start, end, 1};
  ++count_;
  longest_ = std::max(longest_, end - start);
  return true;
}

void SubscriptionSet::erase(Range *range) noexcept {
  std::copy(range + 1, items_ + count_, range);
  --count_;
}

bool SubscriptionSet::overlaps(uintptr_t start, uintptr_t end) const noexcept {
  for (size_t i = first_candidate(start); i < count_ && items_[i].start < end; ++i) {
    if (start < items_[i].end) return true;
  }
  return false;
}

}  // namespace mrc::monitor
