// SPDX-License-Identifier: BSD-3-Clause
// get and put without the mutex: the exact-mode probe, the lock-free lookup, taking a parked
// reference back or parking one, the CLOCK bit, the hit streak that earns parking, put over the
// bound, and the page-frame check of MRC_FLAG_VERIFY_PFN. A miss goes on in slow_path.cc.
//
// SYNCHRONIZATION: see cache.h
#include "core/cache/cache.h"

#include <algorithm>
#include <atomic>

#include "base/epoch.h"
#include "base/error.h"
#include "base/pagemap.h"
#include "base/thread_slot.h"
#include "core/cache/alignment.h"
#include "core/cache/log.h"

namespace mrc {
namespace {

constexpr unsigned kValidProt = MRC_PROT_READ | MRC_PROT_WRITE;

// A get refused for its arguments: the reason in mrc_last_error() (docs/DESIGN.md, "The C API
// contract"). Cold and out of line: the hit path only tests the arguments.
[[gnu::cold, gnu::noinline]] mrc_status_t refuse_get(uintptr_t address, size_t length,
                                                     size_t alignment, unsigned prot) noexcept {
  const char *why = "the range wraps around the address space";
  if (length == 0) {
    why = "the length is 0";
  } else if (prot == 0 || (prot & ~kValidProt) != 0) {
    why = "prot is not MRC_PROT_READ and/or MRC_PROT_WRITE";
  } else if (alignment != 0 && (!is_power_of_two(alignment) || alignment < kPageSize)) {
    why = "the alignment is not a power of two of at least the page size";
  }
  set_last_error("mrc_get: %s (addr %#lx, len %zu, alignment %zu, prot %#x)", why,
                 static_cast<unsigned long>(address), length, alignment, prot);
  return MRC_ERR_INVALID;
}

}  // namespace

mrc_status_t Cache::get(uintptr_t address, size_t length, size_t alignment, unsigned prot,
                        Region **out) noexcept {
  if (out == nullptr || length == 0 || prot == 0 || (prot & ~kValidProt) != 0) {
    return refuse_get(address, length, alignment, prot);
  }
  if (alignment != 0 && (!is_power_of_two(alignment) || alignment < kPageSize)) {
    return refuse_get(address, length, alignment, prot);
  }
  uintptr_t request_end = 0;
  if (__builtin_add_overflow(address, length, &request_end)) {
    return refuse_get(address, length, alignment, prot);
  }
  const uintptr_t align = std::max<uintptr_t>(alignment, alignment_);
  const uintptr_t start = address & ~(align - 1);
  uintptr_t end = 0;
  if (__builtin_add_overflow(request_end, align - 1, &end)) {
    return refuse_get(address, length, alignment, prot);
  }
  end &= ~(align - 1);
  if (__builtin_expect(verify_pfn_pages_ != 0, 0)) {
    // A hit's page-frame check that fails logs and takes mutex_ (verify_pfns) before the get is
    // done with the cache: its messages wait until it is (log.h).
    log::DeferScope defer_messages;
    return get_range(address, request_end, start, end, align - 1, prot, out);
  }
  return get_range(address, request_end, start, end, align - 1, prot, out);
}

mrc_status_t Cache::get_range(uintptr_t address, uintptr_t request_end, uintptr_t start,
                              uintptr_t end, uintptr_t align_mask, unsigned prot,
                              Region **out) noexcept {
  // A range that churns registers uncached, and an uncached registration is in no table: no
  // lookup, so no probe either (docs/DESIGN.md, "Churn"). Fast mode asks only after a miss.
  const auto takes_churn_ticket = [&] { return churn_.take_skip(start); };
  const auto register_uncached = [&] {
    return get_slow(start, end, align_mask, prot, uffd::Subscription::Unmaps::Read,
                    /*churning=*/true, out);
  };
  if (exact_ && takes_churn_ticket()) return register_uncached();
  // Exact mode: the probe comes after the get began and before the fast path's quiescent()
  // check or the slow path's drain (docs/DESIGN.md, "Exact under concurrent unmaps").
  const uffd::Subscription::Unmaps unmaps =
      exact_ ? subscription_->probe_unmaps() : uffd::Subscription::Unmaps::Read;
  if (unmaps == uffd::Subscription::Unmaps::Read &&
      get_fast(address, request_end, align_mask, prot, out)) {
    return MRC_OK;
  }
  if (!exact_ && takes_churn_ticket()) return register_uncached();
  // Fast mode probes too before a miss registers: its watch must not count on a watch entry an
  // unmap in flight is about to cut. The new mapping there would then never be registered with
  // the userfaultfd, and even unmaps that happen-before later gets would go unseen until that
  // unmap's event arrived (docs/DESIGN.md, "Fast mode").
  return get_slow(start, end, align_mask, prot, exact_ ? unmaps : subscription_->probe_unmaps(),
                  /*churning=*/false, out);
}

bool Cache::get_fast(uintptr_t address, uintptr_t request_end, uintptr_t align_mask, unsigned prot,
                     Region **out) noexcept {
  if (!subscription_->quiescent()) return false;
  const ThreadSlot &thread = this_thread_slot();
  ParkingLine *line = parking_.line_of(thread);
  Region *region = nullptr;
  bool taken_back = false;
  {
    EpochGuard guard;
    PgtRegion *found = table_.lookup(address);
    if (found == nullptr) return false;
    region = static_cast<Region *>(found);
    // Bounds and prot never change once a region is published in the table; the start check
    // also keeps a lookup that raced with a restructuring writer from handing out a neighbour.
    // Every region is aligned to alignment_, so only a larger requested alignment can fail the
    // last test: an OR and an AND of bounds already loaded.
    if (region->start > address || region->end < request_end || (region->prot & prot) != prot ||
        ((region->start | region->end) & align_mask) != 0) {
      return false;
    }
    if (line != nullptr &&
        Region::parks_for(region->flags.load(std::memory_order_relaxed), thread.index)) {
      taken_back = line->take_back(region);
    }
    if (!taken_back && !region->try_acquire()) return false;
  }
  uint32_t flags = region->flags.load(std::memory_order_acquire);
  if ((flags & (Region::kInvalid | Region::kFailed)) != 0) {
    release(region);
    return false;
  }
  region->mark_used();
  if (verify_pfn_pages_ != 0 && !verify_pfns(region)) {
    release(region);
    return false;
  }
  if (!taken_back && line != nullptr && !Region::parks_for(flags, thread.index) &&
      line->streak_reached(region, kPromoteAfter)) {
    promote(region);
  }
  hot_.add(thread, Counter::HitsFast);
  *out = region;
  return true;
}

void Cache::put(Region *region) noexcept {
  if (region->cache != this) {  // would park it where its cache never looks, or deregister it
    MRC_LOG_ERROR("cache {}: mrc_put of a region of cache {} ignored", name_, region->cache->name_);
    return;
  }
  const ThreadSlot &thread = this_thread_slot();
  hot_.add(thread, Counter::Puts);
  if (__builtin_expect(over_bound_.load(std::memory_order_relaxed), 0)) {
    put_over_bound(region);
    return;
  }
  if (thread.exclusive) {
    const Parked parked = park(thread.index, region);
    if (parked == Parked::Yes) return;
    if (__builtin_expect(parked == Parked::Refused, 0)) {
      refuse_put(region);  // outside park's guard: the log handler may wait for readers
      return;
    }
  }
  const Region::Drop drop = region->drop();
  if (drop == Region::Drop::Last) {
    release_last(region);
  } else if (__builtin_expect(drop == Region::Drop::Refused, 0)) {
    refuse_put(region);
  }
}

// mrc_put has no status to return: the refusal goes to the log at error level (mrcache.h).
void Cache::refuse_put(const Region *region) noexcept {
  MRC_LOG_ERROR(
      "cache {}: mrc_put of [{:#x}, {:#x}) refused: the caller holds no reference to it (put "
      "twice, or never got); nothing changed",
      name_, region->start, region->end);
}

// Every region was in use when the cache last went past its bound, so one of these puts is the
// first to leave an excess region unused: it trims at once rather than waiting for a miss.
void Cache::put_over_bound(Region *region) noexcept {
  const bool cached = region->has(Region::kInTable);  // our reference keeps the region alive
  uint64_t left = 0;
  const Region::Drop drop = region->drop(&left);
  if (drop == Region::Drop::Last) {
    release_last(region);
    return;
  }
  if (drop == Region::Drop::Refused) {
    refuse_put(region);
    return;
  }
  // Not read again after the drop: the region may be gone. left == 1 with a region removed in
  // between is someone else's reference; the trim then finds nothing, which is harmless.
  if (cached && left == 1) trim();
}

Cache::Parked Cache::park(unsigned owner, Region *region) noexcept {
  auto mine = [owner](uint32_t flags) { return Region::parks_for(flags, owner); };
  // A hint outside the guard (most puts are of regions never promoted); decided inside it.
  if (!mine(region->flags.load(std::memory_order_relaxed))) return Parked::No;
  ParkingLine &line = parking_.line(owner);
  Region *replaced = nullptr;
  {
    EpochGuard guard;
    if (!mine(region->flags.load(std::memory_order_relaxed))) return Parked::No;
    // Each slot is read once: a reclaimer that passed its wait for readers before this guard
    // began may empty a slot (CAS to null) at any moment, so what the scan saw is all there is
    // to decide on. Only this thread fills the line's slots.
    Region *seen[ParkingLine::kSlots];
    size_t empty = ParkingLine::kSlots;
    uint64_t parked_here = 0;
    for (size_t i = 0; i < ParkingLine::kSlots; ++i) {
      seen[i] = line.parked[i].load(std::memory_order_relaxed);
      if (seen[i] == nullptr && empty == ParkingLine::kSlots) empty = i;
      parked_here += seen[i] == region;
    }
    if (__builtin_expect(!holds_reference_to_park(region, parked_here), 0)) return Parked::Refused;
    if (empty != ParkingLine::kSlots) {
      line.parked[empty].store(region, std::memory_order_release);
      return Parked::Yes;
    }
    cache::testing::spin_in_park_window();
    // Full: the CLOCK hand picks a region not taken back since the hand last passed it.
    uint32_t victim = line.hand;
    while (line.reused[victim] != 0) {
      line.reused[victim] = 0;
      victim = (victim + 1) % ParkingLine::kSlots;
    }
    line.hand = (victim + 1) % ParkingLine::kSlots;
    replaced = seen[victim];
    // One being reclaimed stays: the reclaimer takes it out (and may be doing so now). One still
    // parkable is no reclaimer's: any that clears its flag from now on waits for this guard.
    if ((replaced->flags.load(std::memory_order_relaxed) & Region::kParkable) == 0) {
      return Parked::No;
    }
    line.parked[victim].store(region, std::memory_order_release);
  }
  release(replaced);
  return Parked::Yes;
}

// A put parks without a locked instruction, so drop()'s check never sees it: a second put of
// one reference would park a reference no one holds, and a later get would hand it out as a
// second holder of a single reference. The count holds at least the table's reference, every
// parked one and the caller's: one fewer is such a put. Only this line's parked references are
// counted (another line's, for a kAnyOwner region, make the count larger: such a put may go
// unseen, never a legitimate one refused). The count is read first (acquire): a count that
// already lost the table's reference (remove_locked's release decrement) shows kInTable clear.
bool Cache::holds_reference_to_park(const Region *region, uint64_t parked_here) noexcept {
  const auto count = static_cast<int64_t>(region->refcount.load(std::memory_order_acquire));
  const uint64_t table = region->has(Region::kInTable) ? 1 : 0;
  return count >= static_cast<int64_t>(table + parked_here + 1);
}

bool Cache::verify_pfns(Region *region) noexcept {
  if (os::pagemap::matches(region->start, region->pfns, region->pfn_count)) return true;
  hot_.add(Counter::PfnMismatches);
  MRC_LOG_DEBUG("cache {}: page frames of [{:#x}, {:#x}) changed; registering again", name_,
                region->start, region->end);
  Region *deferred = nullptr;
  {
    Lock lock(*this);
    if (!lock.acquire()) return false;  // the slow path then says why (MRC_ERR_BUSY)
    if (region->has(Region::kInTable)) {
      ++slow_.invalidations;
      remove_locked(region);
    }
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
  return false;
}

}  // namespace mrc
