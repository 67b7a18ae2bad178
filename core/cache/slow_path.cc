// SPDX-License-Identifier: BSD-3-Clause
// The slow path: a get that missed (or found an unmap in flight) takes mutex_, applies the
// invalidation queue to the table (drain), and looks up, merges, watches and registers;
// removing a region from the table and purging the table are here too.
//
// SYNCHRONIZATION: see cache.h
#include "core/cache/cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <new>

#include "base/check.h"
#include "base/error.h"
#include "base/pagemap.h"
#include "base/proc_maps.h"
#include "base/ticks.h"
#include "core/cache/alignment.h"
#include "core/cache/log.h"

namespace mrc {
namespace {

// Regions handled per page-table walk while collecting overlaps (bounded stack space).
constexpr size_t kBatch = 32;

// Whether a registration failure lasts until the memory changes (the backend refuses this
// memory, or cannot register at all): only those are remembered. Running out of a resource
// (MRC_ERR_NO_MEMORY: RLIMIT_MEMLOCK, a full buffer table), a busy queue or an I/O error ends by
// itself, and remembering it would fail the range while a fresh one registers fine.
constexpr bool failure_lasts(mrc_status_t status) {
  return status == MRC_ERR_INVALID || status == MRC_ERR_UNSUPPORTED || status == MRC_ERR_BACKEND;
}

// Collects up to kBatch regions overlapping [from, to), in address order.
size_t collect_overlapping(const PageTable &table, uintptr_t from, uintptr_t to,
                           Region *(&out)[kBatch]) noexcept {
  size_t count = 0;
  table.for_each_overlapping(from, to, [&](PgtRegion *found) {
    if (count < kBatch) out[count++] = static_cast<Region *>(found);
  });
  return count;
}

// Whether the memory of [start, end) allows `prot` (its real protection, from the kernel).
bool memory_allows(uintptr_t start, uintptr_t end, unsigned prot) noexcept {
  for (uintptr_t address = start; address < end;) {
    os::Vma mapping{};
    if (os::query_vma(address, &mapping) != MRC_OK || mapping.start > address) return false;
    if ((prot & MRC_PROT_READ) != 0 && (mapping.prot & PROT_READ) == 0) return false;
    if ((prot & MRC_PROT_WRITE) != 0 && (mapping.prot & PROT_WRITE) == 0) return false;
    address = mapping.end;
  }
  return true;
}

}  // namespace

// register_locked's work in progress, handed from phase to phase.
struct Cache::Registration {
  // What is registered: the request, merged with the regions it absorbs.
  uintptr_t start;
  uintptr_t end;
  unsigned prot;
  // Weighed by the churn learner (a cached registration, learning on): then the os::ticks() at
  // the start and around the watch, and what the absorbed regions had cost and earned, which
  // the new region carries on (ChurnHints::caching_paid).
  bool timed;
  uint64_t began;
  uint64_t watch_began = 0;
  uint64_t watch_ended = 0;
  uint64_t absorbed_uses = 0;
  uint64_t absorbed_watch_ticks = 0;
  uint64_t absorbed_registrations = 0;
  Region *region = nullptr;
  bool watched = false;
  void *handle = nullptr;
  uint64_t key = 0;

  void absorb(const Region &absorbed) noexcept {
    absorbed_uses += absorbed.uses.load(std::memory_order_relaxed);
    absorbed_watch_ticks += absorbed.watch_ticks;
    absorbed_registrations += absorbed.registrations;
  }
};

mrc_status_t Cache::get_slow(uintptr_t start, uintptr_t end, uintptr_t align_mask, unsigned prot,
                             uffd::Subscription::Unmaps unmaps, bool churning,
                             Region **out) noexcept {
  // Messages wait until the get is done with the cache (log.h): get() returns what this returns.
  log::DeferScope defer_messages;
  // A backend's reg calling back holds mutex_ already; a callback that destroy runs would start
  // a registration destroy never ends (docs/DESIGN.md, "The C API contract", "User code").
  if (inside(this, Inside::Lock) || inside(this, Inside::Destroy)) {
    set_last_error("mrc_get: cache %s: a miss from inside its own %s", name_,
                   inside(this, Inside::Lock) ? "backend's reg" : "destroy's callbacks");
    return MRC_ERR_BUSY;
  }
  // An unmap in flight may have freed this memory before it was mapped again: wait until the
  // monitor has read it (outside mutex_: other slow paths need not wait too), and the drain
  // below applies it. When it outlasts the wait, or the kernel refuses the probe, no table
  // entry can be trusted for this get: it registers the memory as it is now, uncached.
  if (unmaps == uffd::Subscription::Unmaps::InFlight) {
    hot_.add(Counter::UnmapWaits);
    unmaps = subscription_->settle_unmaps();
  }
  const bool trusted = unmaps == uffd::Subscription::Unmaps::Read;
  if (unmaps == uffd::Subscription::Unmaps::InFlight) hot_.add(Counter::UnmapWaitsOutlasted);
  mrc_status_t status = MRC_OK;
  Region *hit = nullptr;
  // Whether a miss registers uncached: decided once per get (a retry after eviction keeps it).
  bool skip = churning;
  // Twice at most: when the backend ran out of resources and unused regions were evicted, their
  // deregistration runs after the unlock (never under mutex_), and the get starts again.
  for (bool first = true;; first = false) {
    bool evicted = false;
    Region *deferred = nullptr;
    {
      Lock lock(*this);
      if (!lock.acquire()) return MRC_ERR_BUSY;
      if (first) ++slow_.gets_slow;
      if (!trusted) {
        if (first) ++slow_.misses;
        status = register_locked(start, end, align_mask, prot, /*cacheable=*/false,
                                 first ? &evicted : nullptr, &hit);
      } else {
        // Finished regions wait a few slow paths (deregistered already; only their memory and
        // their watches wait): one exchange then takes them all.
        if (first && slow_.gets_slow % kReapEvery == 0) reap_finished_locked();
        drain_locked();
        status = MRC_OK;
        auto *region = churning ? nullptr : static_cast<Region *>(table_.lookup(start));
        if (region != nullptr && region->end >= end && (region->prot & prot) == prot &&
            ((region->start | region->end) & align_mask) == 0) {
          if (region->has(Region::kFailed)) {
            // A remembered failure: the memory has not changed since (no event removed it).
            ++slow_.registration_failures;
            status = region->failure;
          } else if (region->try_acquire()) {  // cannot fail: the table holds a reference
            region->mark_used();
            ++slow_.hits_slow;
            hit = region;
          }
        }
        if (status == MRC_OK && hit == nullptr) {
          // A range that churns registers uncached: no watch, so its munmap waits for no one
          // (docs/DESIGN.md, "Churn").
          if (first) {
            ++slow_.misses;
            if (!skip) skip = churn_.take_skip(start);
            if (skip) ++slow_.churn_skips;
            if (churning) ++slow_.churn_unprobed;
          }
          status = register_locked(start, end, align_mask, prot, /*cacheable=*/!skip,
                                   first ? &evicted : nullptr, &hit);
        }
      }
      deferred = take_deferred_locked();
    }
    finish_all(deferred);
    if (!evicted) break;
  }
  if (trusted) finish_dereg_batch();
  if (status == MRC_OK) *out = hit;
  return status;
}

void Cache::drain_locked() noexcept {
  uffd::DrainResult result = subscription_->drain([this](const uffd::Invalidation &record) {
    assert_held();  // drain calls back on this thread, under mutex_
    ++slow_.unmap_events;
    invalidate_range_locked(record.start, record.end);
  });
  switch (result) {
    case uffd::DrainResult::Ok: break;
    case uffd::DrainResult::Overflow:
      // Records were lost: nothing cached can be trusted. The next drain moves past the gap.
      MRC_LOG_INFO("cache {}: invalidation queue overflowed; purging every region", name_);
      ++slow_.purges;
      purge_locked(true);
      drain_locked();
      break;
    case uffd::DrainResult::Forked: {
      // In a forked child: every inherited region is already marked kForgotten (CacheRegistry).
      purge_locked(false);
      for_each_in_chain(dereg_batch_.take_all(), [this](Region *batched) {
        assert_held();  // called back on this thread, under mutex_
        retirement_.defer(batched);
      });
      break;
    }
  }
}

void Cache::invalidate_range_locked(uintptr_t start, uintptr_t end) noexcept {
  start &= ~(kPageSize - 1);
  end = (end + kPageSize - 1) & ~(kPageSize - 1);
  Region *batch[kBatch];
  for (size_t count; (count = collect_overlapping(table_, start, end, batch)) != 0;) {
    for (size_t i = 0; i < count; ++i) {
      ++slow_.invalidations;
      churn_.on_event_removed(*batch[i]);
      remove_locked(batch[i]);
    }
  }
}

void Cache::remove_locked(Region *region) noexcept {
  region->expect({RegionState::Failed, RegionState::Cached, RegionState::Parkable});
  MRC_CHECK(table_.remove(region) == MRC_OK);
  --table_entries_;
  // A removal may bring the cache back within its bound: the flag goes then, or puts would keep
  // trimming for nothing and not parking.
  const bool was_over = over_bound_.load(std::memory_order_relaxed);
  const uint32_t flags = region->flags.load(std::memory_order_relaxed);
  const bool registered = (flags & Region::kRegistered) != 0;
  if ((flags & Region::kParkable) != 0) unpark_locked(region);
  region->change_flags(Region::kInvalid, Region::kInTable);
  region->expect({RegionState::Invalidated});
  ring_.remove(region);
  if (registered) {
    --cached_regions_;
    cached_bytes_ -= region->length();
  }
  if (was_over && !over_bound_locked()) over_bound_.store(false, std::memory_order_relaxed);
  if (registered) {
    // Flagged before the table's reference goes: the last put may follow at once.
    region->change_flags(Region::kUnreleased);
    slow_.unreleased_bytes += region->length();
  }
  if (region->drop_reference()) retirement_.defer(region);
}

void Cache::purge_locked(bool deregister) noexcept {
  Region *batch[kBatch];
  for (size_t count; (count = collect_overlapping(table_, 0, ~uintptr_t{0}, batch)) != 0;) {
    for (size_t i = 0; i < count; ++i) {
      if (!deregister) batch[i]->change_flags(Region::kForgotten);
      remove_locked(batch[i]);
    }
  }
}

mrc_status_t Cache::purge(bool deregister) noexcept {
  log::DeferScope defer_messages;  // until the purge is done with the cache (log.h)
  Region *deferred = nullptr;
  {
    Lock lock(*this);
    if (!lock.acquire(/*wait=*/inside(this, Inside::Destroy))) return MRC_ERR_BUSY;
    purge_locked(deregister);
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
  // Nothing left waiting: every purged range unwatched, every region handed to the epoch domain.
  Lock lock(*this);
  if (!lock.acquire(/*wait=*/inside(this, Inside::Destroy))) return MRC_OK;  // at the next reap
  reap_finished_locked();
  retirement_.retire_batch(&Cache::recycle_regions);
  return MRC_OK;
}

void Cache::purge_before_fork() noexcept {
  Region *deferred = nullptr;
  {
    Lock lock(*this);
    if (!lock.acquire_unless_reg_runs()) return;
    purge_locked(/*deregister=*/true);
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
}

mrc_status_t Cache::register_locked(uintptr_t start, uintptr_t end, uintptr_t align_mask,
                                    unsigned prot, bool cacheable, bool *evicted,
                                    Region **out) noexcept {
  // What this costs, for the churn learner (ChurnHints::caching_paid): only cached registrations
  // are weighed.
  const bool timed = cacheable && churn_.enabled();
  Registration reg{
      .start = start, .end = end, .prot = prot, .timed = timed, .began = timed ? os::ticks() : 0};
  if (cacheable) merge_overlapping_locked(reg, align_mask);
  // The region's storage first: a registration that found none would need a dereg under
  // mutex_, where no backend call but reg runs.
  reg.region = pool_.allocate(recycled_);
  if (reg.region == nullptr) return MRC_ERR_NO_MEMORY;
  watch_locked(reg, cacheable);
  mrc_status_t status = register_with_backend_locked(reg);
  if (status == MRC_ERR_NO_MEMORY && evicted != nullptr && evict_unused_locked() != 0) {
    // Out of registration resources (a full buffer table, RLIMIT_MEMLOCK): what no one uses left
    // the table; the caller deregisters it after the lock and tries once more.
    give_back_locked(reg);
    *evicted = true;
    return status;
  }
  if (status != MRC_OK && (reg.start != start || reg.end != end || reg.prot != prot)) {
    status = register_request_alone_locked(reg, start, end, prot, status);
  }
  Region *region = reg.region;
  region->start = reg.start;
  region->end = reg.end;
  region->prot = reg.prot;
  region->cache = this;
  if (status != MRC_OK) return remember_failure_locked(reg, status);
  region->handle = reg.handle;
  region->key = reg.key;
  ++slow_.registrations;
  slow_.registered_bytes += region->length();
  ++slow_.size_histogram[63 - std::countl_zero(static_cast<uint64_t>(region->length()))];
  capture_pfns_locked(region);
  return publish_locked(reg, out);
}

// Every region overlapping the request leaves the table: merged into it when the memory allows
// the union's protection, otherwise (a remembered failure, retried now; or a region that cannot
// merge and cannot coexist) its users keep it. Adjacent regions stay apart (docs/DESIGN.md,
// "Merging"). A union is rounded out to the requested alignment (regions are aligned only to
// alignment_), which may reach further regions: the loop runs until nothing overlaps.
void Cache::merge_overlapping_locked(Registration &reg, uintptr_t align_mask) noexcept {
  Region *batch[kBatch];
  for (size_t count; (count = collect_overlapping(table_, reg.start, reg.end, batch)) != 0;) {
    for (size_t i = 0; i < count; ++i) {
      Region *region = batch[i];
      if (region->has(Region::kFailed)) {
        remove_locked(region);  // forgotten: this get asks the backend again
        continue;
      }
      // No overflow: table addresses are below 2^57, and get() refused an alignment whose
      // rounding of the request overflows.
      const uintptr_t union_start = std::min<uintptr_t>(reg.start, region->start) & ~align_mask;
      const uintptr_t union_end =
          (std::max<uintptr_t>(reg.end, region->end) + align_mask) & ~align_mask;
      const unsigned union_prot = reg.prot | region->prot;
      const bool widens = union_prot != region->prot || union_prot != reg.prot;
      if (!widens || memory_allows(union_start, union_end, union_prot)) {
        reg.start = union_start;
        reg.end = union_end;
        reg.prot = union_prot;
        reg.absorb(*region);
        ++slow_.merges;
      } else {
        ++slow_.invalidations;
      }
      remove_locked(region);
    }
  }
}

// Watch before registering: an unmap between the two is then seen (docs/DESIGN.md, "Watching").
void Cache::watch_locked(Registration &reg, bool cacheable) noexcept {
  reg.watch_began = reg.timed ? os::ticks() : 0;
  reg.watched =
      cacheable && uffd::watch(reg.start, reg.end - reg.start) == uffd::WatchResult::Watched;
  reg.watch_ended = reg.timed ? os::ticks() : 0;
}

mrc_status_t Cache::register_with_backend_locked(Registration &reg) noexcept {
  const mrc_status_t status = call_reg(reg.start, reg.end, reg.prot, &reg.handle, &reg.key);
  if (reg.timed) {
    Region *region = reg.region;
    reg.absorbed_watch_ticks += reg.watch_ended - reg.watch_began;
    region->watch_ticks = os::saturated_ticks(reg.absorbed_watch_ticks);
    region->register_ticks =
        os::saturated_ticks((reg.watch_began - reg.began) + (os::ticks() - reg.watch_ended));
    region->uses.store(
        static_cast<uint8_t>(std::min<uint64_t>(reg.absorbed_uses, Region::kMaxUses)),
        std::memory_order_relaxed);
    region->registrations =
        static_cast<uint8_t>(std::min<uint64_t>(reg.absorbed_registrations + 1, 255));
  }
  return status;
}

mrc_status_t Cache::register_request_alone_locked(Registration &reg, uintptr_t start, uintptr_t end,
                                                  unsigned prot, mrc_status_t status) noexcept {
  MRC_LOG_DEBUG(
      "cache {}: merged registration [{:#x}, {:#x}) failed ({}); trying the request "
      "alone",
      name_, reg.start, reg.end, mrc_status_string(status));
  if (reg.watched) uffd::unwatch(reg.start, reg.end - reg.start);
  reg.start = start;
  reg.end = end;
  reg.prot = prot;
  reg.watched = uffd::watch(start, end - start) == uffd::WatchResult::Watched;
  return call_reg(start, end, prot, &reg.handle, &reg.key);
}

void Cache::give_back_locked(Registration &reg) noexcept {
  if (reg.watched) uffd::unwatch(reg.start, reg.end - reg.start);
  pool_.give_back(reg.region);
}

mrc_status_t Cache::remember_failure_locked(Registration &reg, mrc_status_t status) noexcept {
  Region *region = reg.region;
  ++slow_.registration_failures;
  MRC_LOG_DEBUG("cache {}: {} failed to register [{:#x}, {:#x}): {}", name_, backend_.name,
                reg.start, reg.end, mrc_status_string(status));
  // Not remembered when nothing would tell us that the memory changed, or when the failure
  // may end without any change: the next get asks the backend again.
  if (!reg.watched || !failure_lasts(status)) {
    region->expect({RegionState::Free});
    give_back_locked(reg);
    return status;
  }
  // Remember the failure until the memory changes, so a retry storm never reaches the backend.
  region->failure = status;
  region->flags.store(Region::kFailed | Region::kInTable | Region::kWatched,
                      std::memory_order_relaxed);
  region->refcount.store(1, std::memory_order_relaxed);
  region->expect({RegionState::Failed});
  if (table_.insert(region) != MRC_OK) {  // no memory for table nodes: just do not remember
    give_back_locked(reg);                // never published: back to Free as it is
    return status;
  }
  ++table_entries_;
  retirement_.track(region);
  ring_.insert(region);
  evict_locked();
  return status;
}

void Cache::capture_pfns_locked(Region *region) noexcept {
  if (verify_pfn_pages_ == 0) return;
  region->pfn_count = std::min<size_t>(verify_pfn_pages_, region->length() / kPageSize);
  region->pfns = new (std::nothrow) uint64_t[region->pfn_count];
  if (region->pfns == nullptr ||
      !os::pagemap::read(region->start, region->pfns, region->pfn_count)) {
    delete[] region->pfns;
    region->pfns = nullptr;
    region->pfn_count = 0;
  }
}

mrc_status_t Cache::publish_locked(Registration &reg, Region **out) noexcept {
  Region *region = reg.region;
  retirement_.track(region);
  if (reg.watched) {
    // Complete before the insert publishes it (release) to fast-path readers. Inserted without
    // the CLOCK bit: a region earns its second chance by being used again.
    region->flags.store(Region::kRegistered | Region::kInTable | Region::kWatched,
                        std::memory_order_relaxed);
    region->refcount.store(2, std::memory_order_relaxed);  // the table's and the caller's
    // Overlaps were removed above, so the insert fails only for want of memory for table nodes
    // (or an address beyond the table's 57 bits): then the registration is handed out uncached.
    if (table_.insert(region) != MRC_OK) {
      uffd::unwatch(reg.start, reg.end - reg.start);
      reg.watched = false;
    }
  }
  if (!reg.watched) {
    ++slow_.uncacheable;
    region->flags.store(Region::kRegistered | Region::kUncached | Region::kInvalid,
                        std::memory_order_relaxed);
    region->refcount.store(1, std::memory_order_relaxed);
    region->expect({RegionState::Uncached});
    *out = region;
    return MRC_OK;
  }
  region->expect({RegionState::Cached});
  ++table_entries_;
  ++cached_regions_;
  cached_bytes_ += region->length();
  ring_.insert(region);
  evict_locked();
  *out = region;
  return MRC_OK;
}

}  // namespace mrc
