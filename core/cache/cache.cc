#include "core/cache/cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

#include "base/check.h"
#include "base/epoch.h"
#include "base/pagemap.h"
#include "base/proc_maps.h"
#include "core/cache/config.h"
#include "core/cache/log.h"

namespace mrc {
namespace {

constexpr uintptr_t kPageSize = uintptr_t{1} << PageTable::kPageShift;
constexpr unsigned kValidProt = MRC_PROT_READ | MRC_PROT_WRITE;
// Regions handled per page-table walk while collecting overlaps (bounded stack space).
constexpr size_t kBatch = 32;

constexpr bool is_power_of_two(size_t value) { return value != 0 && (value & (value - 1)) == 0; }

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

// ---- the process's caches, for fork ----------------------------------------------------------

// Keeps fork safe: prepare takes every cache mutex (after purging caches that asked for it) so
// that the child never inherits a mutex held by a thread that does not exist there.
struct CacheRegistry {
  static std::mutex &mutex() {
    static std::mutex m;
    return m;
  }
  static Cache *&head() {
    static Cache *h = nullptr;
    return h;
  }
  static void add(Cache *cache) {
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(&prepare, &after, &after_in_child); });
    std::lock_guard lock(mutex());
    cache->fork_next_ = head();
    head() = cache;
  }
  static void remove(Cache *cache) {
    std::lock_guard lock(mutex());
    for (Cache **link = &head(); *link != nullptr; link = &(*link)->fork_next_) {
      if (*link == cache) {
        *link = cache->fork_next_;
        return;
      }
    }
  }
  static void prepare() {
    mutex().lock();
    for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
      if ((cache->flags_ & MRC_FLAG_PURGE_ON_FORK) != 0) cache->purge(true);
      cache->mutex_.lock();
    }
  }
  static void after() {
    for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
      cache->mutex_.unlock();
    }
    mutex().unlock();
  }
  // The parent owns every registration the child inherited: mark them all before any child
  // thread can put one (this handler runs while the child has a single thread). The table is
  // emptied at the child's first drain (DrainResult::Forked).
  static void after_in_child() {
    for (Cache *cache = head(); cache != nullptr; cache = cache->fork_next_) {
      for (Region *region = cache->live_head_; region != nullptr; region = region->live_next) {
        region->change_flags(Region::kForgotten);
      }
      for (size_t i = 0; i < cache->retiring_count_; ++i) {
        cache->retiring_[i]->change_flags(Region::kForgotten);  // their watches were the parent's
      }
    }
    after();
  }
};

// ---- creation ---------------------------------------------------------------------------------

mrc_status_t Cache::create(const mrc_cache_params_t &params, Cache **out) noexcept {
  if (out == nullptr) return MRC_ERR_INVALID;
  constexpr unsigned kKnownFlags =
      MRC_FLAG_PURGE_ON_FORK | MRC_FLAG_VERIFY_PFN | MRC_FLAG_ORDERED_UNMAPS;
  if ((params.flags & ~kKnownFlags) != 0) {
    return MRC_ERR_INVALID;
  }
  if (params.alignment != 0 &&
      (!is_power_of_two(params.alignment) || params.alignment < kPageSize)) {
    return MRC_ERR_INVALID;
  }
  if (params.name != nullptr && std::strlen(params.name) >= sizeof(name_)) return MRC_ERR_INVALID;
  mrc_backend_t backend{};
  // A plugin may leave operations out: they get not-supported defaults, never NULL checks here.
  if (mrc_backend_complete(params.backend != nullptr ? params.backend : mrc_backend_null(),
                           &backend) != MRC_OK) {
    return MRC_ERR_INVALID;
  }

  Cache *cache = new (std::nothrow) Cache();
  if (cache == nullptr) return MRC_ERR_NO_MEMORY;
  if (params.name != nullptr) std::snprintf(cache->name_, sizeof(cache->name_), "%s", params.name);
  cache->backend_ = backend;
  cache->backend_ctx_ = params.backend_ctx;
  cache->max_regions_ = params.max_regions;
  cache->max_bytes_ = params.max_bytes;
  cache->max_unreleased_ = params.max_unreleased;
  cache->flags_ = params.flags;
  cache->exact_ = (params.flags & MRC_FLAG_ORDERED_UNMAPS) == 0;
  cache->alignment_ = params.alignment != 0 ? params.alignment : kPageSize;
  cache->print_stats_ = config::stats_at_destroy();
  if ((params.flags & MRC_FLAG_VERIFY_PFN) != 0) {
    char why[160];
    if (!os::pagemap::available(why, sizeof why)) {
      MRC_LOG_WARN("cache {}: PFN verification disabled: {}", cache->name_, why);
      cache->flags_ &= ~static_cast<unsigned>(MRC_FLAG_VERIFY_PFN);
    } else {
      cache->verify_pfn_pages_ = params.verify_pfn_pages != 0 ? params.verify_pfn_pages : 1;
    }
  }
  mrc_status_t status = uffd::subscribe(&cache->consumer_);
  if (status != MRC_OK) {
    delete cache;
    return status;
  }
  CacheRegistry::add(cache);
  MRC_LOG_DEBUG("cache {} created (backend {}, monitor {})", cache->name_, backend.name,
                cache->consumer_->mode() == MRC_MONITOR_UNCACHED ? "uncached" : "watching");
  *out = cache;
  return MRC_OK;
}

Cache::~Cache() {
  if (consumer_ != nullptr) uffd::unsubscribe(consumer_);
}

void Cache::destroy(Cache *cache) noexcept {
  if (cache == nullptr) return;
  CacheRegistry::remove(cache);
  cache->purge(true);  // reclaims every parked reference too: only cached regions are parked
  for (const ParkingLine &line : cache->parking_) {
    for (const std::atomic<Region *> &slot : line.parked) {
      MRC_DASSERT(slot.load(std::memory_order_relaxed) == nullptr);
    }
  }
  cache->collect_garbage();
  // Whatever is left is still referenced by the application: deregister it anyway.
  size_t in_use = 0;
  Region *leftover = nullptr;
  {
    std::lock_guard lock(cache->mutex_);
    cache->reap_finished_locked();
    leftover = cache->live_head_;
  }
  for (Region *region = leftover; region != nullptr; region = region->live_next) {
    ++in_use;
    region->refcount.store(Region::kDead, std::memory_order_relaxed);
    cache->finish(region);  // pushes it on finished_; the live list is walked, not changed
  }
  {
    std::lock_guard lock(cache->mutex_);
    cache->reap_finished_locked();
    cache->retire_batch_locked();
  }
  if (in_use != 0) {
    MRC_LOG_WARN("cache {} destroyed with {} region(s) still in use; they were deregistered",
                 cache->name_, in_use);
  }
  if (cache->print_stats_) {
    char buffer[4096];
    if (cache->stats_json(buffer, sizeof buffer) > 0) std::fprintf(stderr, "%s\n", buffer);
  }
  epoch_domain().synchronize();  // every retired region is back in the pool
  for (Region *list : {cache->free_regions_, cache->recycled_.exchange(nullptr)}) {
    while (list != nullptr) {
      Region *next = list->gc_next;
      delete list;
      list = next;
    }
  }
  delete cache;
}

// ---- get / put --------------------------------------------------------------------------------

mrc_status_t Cache::get(uintptr_t address, size_t length, size_t alignment, unsigned prot,
                        Region **out) noexcept {
  if (out == nullptr || length == 0 || prot == 0 || (prot & ~kValidProt) != 0) {
    return MRC_ERR_INVALID;
  }
  if (alignment != 0 && (!is_power_of_two(alignment) || alignment < kPageSize)) {
    return MRC_ERR_INVALID;
  }
  uintptr_t request_end = 0;
  if (__builtin_add_overflow(address, length, &request_end)) return MRC_ERR_INVALID;
  const uintptr_t align = std::max<uintptr_t>(alignment, alignment_);
  const uintptr_t start = address & ~(align - 1);
  uintptr_t end = 0;
  if (__builtin_add_overflow(request_end, align - 1, &end)) return MRC_ERR_INVALID;
  end &= ~(align - 1);

  // Exact mode: the probe comes after the get began and before the fast path's quiescent()
  // check or the slow path's drain (docs/DESIGN.md, "Exact under concurrent unmaps").
  const uffd::Subscription::Unmaps unmaps =
      exact_ ? consumer_->probe_unmaps() : uffd::Subscription::Unmaps::Read;
  if (unmaps == uffd::Subscription::Unmaps::Read &&
      get_fast(address, request_end, align - 1, prot, out)) {
    return MRC_OK;
  }
  return get_slow(start, end, align - 1, prot, unmaps, out);
}

bool Cache::get_fast(uintptr_t address, uintptr_t request_end, uintptr_t align_mask, unsigned prot,
                     Region **out) noexcept {
  if (!consumer_->quiescent()) return false;
  const ThreadSlot &thread = this_thread_slot();
  ParkingLine *line = thread.exclusive ? &parking_[thread.index] : nullptr;
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
      for (size_t i = 0; i < ParkingLine::kSlots; ++i) {
        if (line->parked[i].load(std::memory_order_relaxed) == region) {
          line->parked[i].store(nullptr, std::memory_order_relaxed);
          line->reused[i] = 1;
          taken_back = true;
          break;
        }
      }
    }
    if (!taken_back && !region->try_acquire()) return false;
  }
  uint32_t flags = region->flags.load(std::memory_order_acquire);
  if ((flags & (Region::kInvalid | Region::kFailed)) != 0) {
    release(region);
    return false;
  }
  if (!region->referenced.load(std::memory_order_relaxed)) {
    region->referenced.store(true, std::memory_order_relaxed);
  }
  if (verify_pfn_pages_ != 0 && !verify_pfns(region)) {
    release(region);
    return false;
  }
  if (!taken_back && line != nullptr && !Region::parks_for(flags, thread.index)) {
    count_streak(*line, region);
  }
  hot_.add(thread, Counter::HitsFast);
  *out = region;
  return true;
}

void Cache::count_streak(ParkingLine &line, Region *region) noexcept {
  if (line.streak_region != region) {
    line.streak_region = region;
    line.streak = 1;
  } else if (++line.streak >= kPromoteAfter) {
    line.streak = 0;  // tried again after as many hits if the promotion does not take
    promote(region);
  }
}

// The caller holds a reference, so the region is alive; it must still be cached. The caller's
// slot is exclusive (it has a line). A second thread's promotion makes every thread an owner.
void Cache::promote(Region *region) noexcept {
  const unsigned me = this_thread_slot().index;
  std::lock_guard lock(mutex_);
  const uint32_t flags = region->flags.load(std::memory_order_relaxed);
  if ((flags & (Region::kInTable | Region::kInvalid | Region::kFailed)) != Region::kInTable) return;
  if ((flags & Region::kParkable) == 0) {
    MRC_DASSERT((flags & Region::kOwnerMask) == 0);  // cleared with kParkable
    region->change_flags(Region::kParkable | (me << Region::kOwnerShift));
  } else if (!Region::parks_for(flags, me)) {
    region->change_flags(Region::kOwnerMask);  // all ones: kAnyOwner
  }
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
  if (thread.exclusive && park(thread.index, region)) return;
  release(region);
}

// Every region was in use when the cache last went past its bound, so one of these puts is the
// first to leave an excess region unused: it trims at once rather than waiting for a miss.
void Cache::put_over_bound(Region *region) noexcept {
  const bool cached = region->has(Region::kInTable);  // our reference keeps the region alive
  uint64_t left = 0;
  if (region->drop_reference(&left)) {
    release_last(region);
    return;
  }
  // Not read again after the drop: the region may be gone. left == 1 with a region removed in
  // between is someone else's reference; the trim then finds nothing, which is harmless.
  if (cached && left == 1) trim();
}

void Cache::trim() noexcept {
  Region *deferred = nullptr;
  {
    std::lock_guard lock(mutex_);
    evict_locked();
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
}

bool Cache::park(unsigned owner, Region *region) noexcept {
  auto mine = [owner](uint32_t flags) { return Region::parks_for(flags, owner); };
  // A hint outside the guard (most puts are of regions never promoted); decided inside it.
  if (!mine(region->flags.load(std::memory_order_relaxed))) return false;
  ParkingLine &line = parking_[owner];
  Region *replaced = nullptr;
  {
    EpochGuard guard;
    if (!mine(region->flags.load(std::memory_order_relaxed))) return false;
    for (std::atomic<Region *> &slot : line.parked) {
      if (slot.load(std::memory_order_relaxed) == nullptr) {
        slot.store(region, std::memory_order_release);
        return true;
      }
    }
    // Full: the CLOCK hand picks a region not taken back since the hand last passed it.
    uint32_t victim = line.hand;
    while (line.reused[victim] != 0) {
      line.reused[victim] = 0;
      victim = (victim + 1) % ParkingLine::kSlots;
    }
    line.hand = (victim + 1) % ParkingLine::kSlots;
    replaced = line.parked[victim].load(std::memory_order_relaxed);
    // One being reclaimed stays: the reclaimer takes it out (and may be waiting for this guard).
    if ((replaced->flags.load(std::memory_order_relaxed) & Region::kParkable) == 0) return false;
    line.parked[victim].store(region, std::memory_order_release);
  }
  release(replaced);
  return true;
}

bool Cache::verify_pfns(Region *region) noexcept {
  if (os::pagemap::matches(region->start, region->pfns, region->pfn_count)) return true;
  pfn_mismatches_.fetch_add(1, std::memory_order_relaxed);  // rare: a locked add is fine
  MRC_LOG_DEBUG("cache {}: page frames of [{:#x}, {:#x}) changed; registering again", name_,
                region->start, region->end);
  Region *deferred = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (region->has(Region::kInTable)) {
      ++slow_.invalidations;
      remove_locked(region);
    }
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
  return false;
}

mrc_status_t Cache::get_slow(uintptr_t start, uintptr_t end, uintptr_t align_mask, unsigned prot,
                             uffd::Subscription::Unmaps unmaps, Region **out) noexcept {
  // An unmap in flight may have freed this memory before it was mapped again: wait until the
  // monitor has read it (outside mutex_: other slow paths need not wait too), and the drain
  // below applies it. When it outlasts the wait, or the kernel refuses the probe, no table
  // entry can be trusted for this get: it registers the memory as it is now, uncached.
  if (unmaps == uffd::Subscription::Unmaps::InFlight) {
    hot_.add(Counter::UnmapWaits);
    unmaps = consumer_->settle_unmaps();
  }
  mrc_status_t status = MRC_OK;
  Region *hit = nullptr;
  Region *deferred = nullptr;
  if (unmaps != uffd::Subscription::Unmaps::Read) {
    if (unmaps == uffd::Subscription::Unmaps::InFlight) hot_.add(Counter::UnmapWaitsOutlasted);
    {
      std::lock_guard lock(mutex_);
      ++slow_.gets_slow;
      ++slow_.misses;
      status = register_locked(start, end, align_mask, prot, /*cacheable=*/false, &hit);
      deferred = take_deferred_locked();
    }
    finish_all(deferred);
    if (status == MRC_OK) *out = hit;
    return status;
  }
  {
    std::lock_guard lock(mutex_);
    ++slow_.gets_slow;
    // Finished regions wait a few slow paths (deregistered already; only their memory and their
    // watches wait): one exchange then takes them all.
    if (slow_.gets_slow % kReapEvery == 0) reap_finished_locked();
    drain_locked();
    auto *region = static_cast<Region *>(table_.lookup(start));
    if (region != nullptr && region->end >= end && (region->prot & prot) == prot &&
        ((region->start | region->end) & align_mask) == 0) {
      if (region->has(Region::kFailed)) {
        // A remembered failure: the memory has not changed since (no event removed it).
        ++slow_.registration_failures;
        status = region->failure;
      } else if (region->try_acquire()) {  // cannot fail: the table holds a reference
        region->referenced.store(true, std::memory_order_relaxed);
        ++slow_.hits_slow;
        hit = region;
      }
    }
    if (status == MRC_OK && hit == nullptr) {
      ++slow_.misses;
      status = register_locked(start, end, align_mask, prot, /*cacheable=*/true, &hit);
    }
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
  collect_garbage();
  if (status == MRC_OK) *out = hit;
  return status;
}

// ---- the slow path under mutex_ -------------------------------------------------------------

void Cache::drain_locked() noexcept {
  uffd::DrainResult result = consumer_->drain([this](const uffd::Invalidation &record) {
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
      Region *garbage = garbage_.exchange(nullptr, std::memory_order_acquire);
      while (garbage != nullptr) {
        Region *next = garbage->gc_next;
        defer_locked(garbage);
        garbage = next;
      }
      garbage_bytes_.store(0, std::memory_order_relaxed);
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
      remove_locked(batch[i]);
    }
  }
}

void Cache::remove_locked(Region *region) noexcept {
  MRC_CHECK(table_.remove(region) == MRC_OK);
  --table_entries_;
  // A removal may bring the cache back within its bound: the flag goes then, or puts would keep
  // trimming for nothing and not parking.
  const bool was_over = over_bound_.load(std::memory_order_relaxed);
  const uint32_t flags = region->flags.load(std::memory_order_relaxed);
  const bool registered = (flags & Region::kRegistered) != 0;
  if ((flags & Region::kParkable) != 0) unpark_locked(region);
  region->change_flags(Region::kInvalid, Region::kInTable);
  ring_remove_locked(lru_hand_, region);
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
  if (region->drop_reference()) defer_locked(region);
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

void Cache::purge(bool deregister) noexcept {
  Region *deferred = nullptr;
  {
    std::lock_guard lock(mutex_);
    purge_locked(deregister);
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
  // Nothing left waiting: every purged range unwatched, every region handed to the epoch domain.
  std::lock_guard lock(mutex_);
  reap_finished_locked();
  retire_batch_locked();
}

bool Cache::over_bound_locked() const noexcept {
  return (max_regions_ != 0 && table_entries_ > max_regions_) ||
         (max_bytes_ != 0 && cached_bytes_ > max_bytes_);
}

void Cache::evict_locked() noexcept {
  // CLOCK: two passes clear every reference bit, a third finds any unused region left. A region
  // that only parked references hold is not in use: when such regions are in the way, their
  // references are reclaimed and the hand goes round once more.
  bool skipped_parkable = false;
  for (int round = 0; round < 2 && over_bound_locked(); ++round) {
    if (round == 1 && !(skipped_parkable && unpark_all_locked())) break;
    size_t budget = 3 * table_entries_;
    while (over_bound_locked() && lru_hand_ != nullptr && budget-- != 0) {
      Region *region = lru_hand_;
      lru_hand_ = region->lru_next;
      if (region->refcount.load(std::memory_order_acquire) != 1) {  // in use: never
        skipped_parkable = skipped_parkable || region->has(Region::kParkable);
        continue;
      }
      if (region->referenced.load(std::memory_order_relaxed) && !region->has(Region::kFailed)) {
        region->referenced.store(false, std::memory_order_relaxed);
        continue;
      }
      ++slow_.evictions;
      remove_locked(region);
    }
  }
  // Still past the bound: every region left is in use, and the put that frees one trims.
  if (over_bound_locked() && !over_bound_.load(std::memory_order_relaxed)) {
    over_bound_.store(true, std::memory_order_relaxed);
  }
}

// Evicts every cached region no one holds; returns how many. Their deregistration runs at once
// (not after the lock) because the caller retries a registration that needs the resources.
size_t Cache::evict_unused_locked() noexcept {
  unpark_all_locked();  // out of resources: what is only parked is not in use
  size_t evicted = 0;
  Region *region = lru_hand_;
  // Each step visits a different entry of the ring as it was: removals keep the others' order.
  for (size_t budget = table_entries_; region != nullptr && budget-- != 0;) {
    Region *next = region->lru_next;
    if (region->refcount.load(std::memory_order_acquire) == 1 && !region->has(Region::kFailed)) {
      ++slow_.evictions;
      remove_locked(region);
      ++evicted;
    }
    region = lru_hand_ != nullptr ? next : nullptr;
  }
  Region *deferred = deferred_;
  deferred_ = nullptr;
  while (deferred != nullptr) {
    Region *next = deferred->gc_next;
    if (deferred->has(Region::kRegistered) && !deferred->has(Region::kForgotten)) {
      end_registration(deferred, true);
    }
    deferred->gc_next = deferred_;  // the rest of finish() runs after the lock
    deferred_ = deferred;
    deferred = next;
  }
  return evicted;
}

mrc_status_t Cache::register_locked(uintptr_t start, uintptr_t end, uintptr_t align_mask,
                                    unsigned prot, bool cacheable, Region **out) noexcept {
  // Merge with every overlapping or adjacent region whose protection the memory allows. A union
  // is rounded out to the requested alignment (regions are aligned only to alignment_), which
  // may reach further regions: the loop runs until nothing changes.
  uintptr_t merged_start = start;
  uintptr_t merged_end = end;
  unsigned merged_prot = prot;
  Region *batch[kBatch];
  while (cacheable) {
    const uintptr_t from = merged_start != 0 ? merged_start - 1 : 0;
    const uintptr_t to = merged_end != ~uintptr_t{0} ? merged_end + 1 : merged_end;
    bool changed = false;
    size_t count = collect_overlapping(table_, from, to, batch);
    for (size_t i = 0; i < count; ++i) {
      Region *region = batch[i];
      const bool overlaps = region->start < merged_end && region->end > merged_start;
      if (region->has(Region::kFailed)) {
        if (overlaps) {
          remove_locked(region);  // retried now: forget the old failure
          changed = true;
        }
        continue;
      }
      const uintptr_t union_start = std::min<uintptr_t>(merged_start, region->start) & ~align_mask;
      // No overflow: table addresses are below 2^57, and get() refused an alignment whose
      // rounding of the request overflows.
      const uintptr_t union_end =
          (std::max<uintptr_t>(merged_end, region->end) + align_mask) & ~align_mask;
      const unsigned union_prot = merged_prot | region->prot;
      const bool widens = union_prot != region->prot || union_prot != merged_prot;
      if (!widens || memory_allows(union_start, union_end, union_prot)) {
        merged_start = union_start;
        merged_end = union_end;
        merged_prot = union_prot;
        ++slow_.merges;
        remove_locked(region);
        changed = true;
      } else if (overlaps) {
        // Cannot merge and cannot coexist: it leaves the table, its users keep it.
        ++slow_.invalidations;
        remove_locked(region);
        changed = true;
      }
    }
    if (!changed) break;
  }

  // Watch before registering: an unmap between the two is then seen (docs/DESIGN.md).
  bool watched = cacheable &&
                 uffd::watch(merged_start, merged_end - merged_start) == uffd::WatchResult::Watched;
  void *handle = nullptr;
  uint64_t key = 0;
  mrc_status_t status = backend_.reg(backend_ctx_, reinterpret_cast<void *>(merged_start),
                                     merged_end - merged_start, merged_prot, &handle, &key);
  if (status == MRC_ERR_NO_MEMORY && evict_unused_locked() != 0) {
    // Out of registration resources (a full buffer table, RLIMIT_MEMLOCK): give back what no
    // one uses and try once more.
    status = backend_.reg(backend_ctx_, reinterpret_cast<void *>(merged_start),
                          merged_end - merged_start, merged_prot, &handle, &key);
  }
  if (status != MRC_OK && (merged_start != start || merged_end != end || merged_prot != prot)) {
    MRC_LOG_DEBUG(
        "cache {}: merged registration [{:#x}, {:#x}) failed ({}); trying the request "
        "alone",
        name_, merged_start, merged_end, mrc_status_string(status));
    if (watched) uffd::unwatch(merged_start, merged_end - merged_start);
    merged_start = start;
    merged_end = end;
    merged_prot = prot;
    watched = uffd::watch(start, end - start) == uffd::WatchResult::Watched;
    status = backend_.reg(backend_ctx_, reinterpret_cast<void *>(start), end - start, prot, &handle,
                          &key);
  }

  Region *region = allocate_region_locked();
  if (region == nullptr) {
    if (status == MRC_OK) backend_.dereg(backend_ctx_, handle);
    if (watched) uffd::unwatch(merged_start, merged_end - merged_start);
    return MRC_ERR_NO_MEMORY;
  }
  region->start = merged_start;
  region->end = merged_end;
  region->prot = merged_prot;
  region->cache = this;

  if (status != MRC_OK) {
    ++slow_.registration_failures;
    MRC_LOG_DEBUG("cache {}: {} failed to register [{:#x}, {:#x}): {}", name_, backend_.name,
                  merged_start, merged_end, mrc_status_string(status));
    // Not remembered when nothing would tell us that the memory changed, or when the failure
    // may end without any change: the next get asks the backend again.
    if (!watched || !failure_lasts(status)) {
      if (watched) uffd::unwatch(merged_start, merged_end - merged_start);
      free_region_locked(region);
      return status;
    }
    // Remember the failure until the memory changes, so a retry storm never reaches the backend.
    region->failure = status;
    region->flags.store(Region::kFailed | Region::kInTable | Region::kWatched,
                        std::memory_order_relaxed);
    region->refcount.store(1, std::memory_order_relaxed);
    if (table_.insert(region) != MRC_OK) {  // no memory for table nodes: just do not remember
      uffd::unwatch(merged_start, merged_end - merged_start);
      free_region_locked(region);
      return status;
    }
    ++table_entries_;
    live_insert_locked(region);
    ring_insert_locked(lru_hand_, region);
    evict_locked();
    return status;
  }

  region->handle = handle;
  region->key = key;
  ++slow_.registrations;
  slow_.registered_bytes += region->length();
  ++slow_.size_histogram[63 - std::countl_zero(static_cast<uint64_t>(region->length()))];
  if (verify_pfn_pages_ != 0) {
    region->pfn_count = std::min<size_t>(verify_pfn_pages_, region->length() / kPageSize);
    region->pfns = new (std::nothrow) uint64_t[region->pfn_count];
    if (region->pfns == nullptr ||
        !os::pagemap::read(region->start, region->pfns, region->pfn_count)) {
      delete[] region->pfns;
      region->pfns = nullptr;
      region->pfn_count = 0;
    }
  }
  live_insert_locked(region);
  if (watched) {
    // Complete before the insert publishes it (release) to fast-path readers. Inserted without
    // the CLOCK bit: a region earns its second chance by being used again.
    region->flags.store(Region::kRegistered | Region::kInTable | Region::kWatched,
                        std::memory_order_relaxed);
    region->refcount.store(2, std::memory_order_relaxed);  // the table's and the caller's
    // Overlaps were removed above, so the insert fails only for want of memory for table nodes
    // (or an address beyond the table's 57 bits): then the registration is handed out uncached.
    if (table_.insert(region) != MRC_OK) {
      uffd::unwatch(merged_start, merged_end - merged_start);
      watched = false;
    }
  }
  if (!watched) {
    ++slow_.uncacheable;
    region->flags.store(Region::kRegistered | Region::kUncached | Region::kInvalid,
                        std::memory_order_relaxed);
    region->refcount.store(1, std::memory_order_relaxed);
    *out = region;
    return MRC_OK;
  }
  ++table_entries_;
  ++cached_regions_;
  cached_bytes_ += region->length();
  ring_insert_locked(lru_hand_, region);
  evict_locked();
  *out = region;
  return MRC_OK;
}

void Cache::ring_insert_locked(Region *&head, Region *region) noexcept {
  if (head == nullptr) {
    region->lru_prev = region->lru_next = region;
    head = region;
    return;
  }
  region->lru_next = head;
  region->lru_prev = head->lru_prev;
  head->lru_prev->lru_next = region;
  head->lru_prev = region;
}

void Cache::ring_remove_locked(Region *&head, Region *region) noexcept {
  if (region->lru_next == region) {
    head = nullptr;
  } else {
    region->lru_prev->lru_next = region->lru_next;
    region->lru_next->lru_prev = region->lru_prev;
    if (head == region) head = region->lru_next;
  }
  region->lru_prev = region->lru_next = nullptr;
}

void Cache::live_insert_locked(Region *region) noexcept {
  region->live_prev = nullptr;
  region->live_next = live_head_;
  if (live_head_ != nullptr) live_head_->live_prev = region;
  live_head_ = region;
}

// ---- releasing --------------------------------------------------------------------------------

void Cache::release(Region *region) noexcept {
  if (region->drop_reference()) release_last(region);
}

void Cache::release_last(Region *region) noexcept {
  const uint32_t flags = region->flags.load(std::memory_order_acquire);
  if (max_unreleased_ != 0 && (flags & Region::kRegistered) != 0 &&
      (flags & Region::kForgotten) == 0) {
    // Deferred: deregistration is batched until max_unreleased bytes wait or the slow path runs.
    if ((flags & Region::kUnreleased) == 0) {  // uncached: never left a table, counted from now
      region->change_flags(Region::kUnreleased);
      hot_.add(Counter::UnreleasedBytes, region->length());
    }
    Region *head = garbage_.load(std::memory_order_relaxed);
    do {
      region->gc_next = head;
    } while (!garbage_.compare_exchange_weak(head, region, std::memory_order_release,
                                             std::memory_order_relaxed));
    if (garbage_bytes_.fetch_add(region->length(), std::memory_order_relaxed) + region->length() >
        max_unreleased_) {
      collect_garbage();
    }
    return;
  }
  finish(region);
}

void Cache::collect_garbage() noexcept {
  if (garbage_.load(std::memory_order_relaxed) == nullptr) return;
  Region *garbage = garbage_.exchange(nullptr, std::memory_order_acquire);
  while (garbage != nullptr) {
    Region *next = garbage->gc_next;
    garbage_bytes_.fetch_sub(garbage->length(), std::memory_order_relaxed);
    finish(garbage);
    garbage = next;
  }
}

void Cache::unlink_live_locked(Region *region) noexcept {
  if (region->live_prev != nullptr) {
    region->live_prev->live_next = region->live_next;
  } else if (live_head_ == region) {
    live_head_ = region->live_next;
  }
  if (region->live_next != nullptr) region->live_next->live_prev = region->live_prev;
  region->live_prev = region->live_next = nullptr;
}

void Cache::defer_locked(Region *region) noexcept {
  region->gc_next = deferred_;
  deferred_ = region;
}

Region *Cache::take_deferred_locked() noexcept {
  reclaim_parked_locked();
  Region *deferred = deferred_;
  deferred_ = nullptr;
  return deferred;
}

void Cache::unpark_locked(Region *region) noexcept {
  const uint32_t flags = region->flags.load(std::memory_order_relaxed);
  const unsigned owner = Region::owner_of(flags);
  region->change_flags(0, Region::kParkable | Region::kOwnerMask);
  const ThreadSlot &thread = this_thread_slot();
  if (owner == Region::kAnyOwner) {
    for (uint64_t &word : lines_to_reclaim_) word = ~uint64_t{0};
    return;
  }
  if (!thread.exclusive || thread.index != owner) {
    lines_to_reclaim_[owner / 64] |= uint64_t{1} << (owner % 64);
    return;
  }
  // Our own line: only this thread stores to it, and no other thread takes from it without
  // mutex_, which we hold.
  for (std::atomic<Region *> &slot : parking_[owner].parked) {
    if (slot.load(std::memory_order_relaxed) != region) continue;
    slot.store(nullptr, std::memory_order_relaxed);
    if (region->drop_reference()) defer_locked(region);
  }
}

void Cache::reclaim_parked_locked() noexcept {
  bool marked = false;
  for (uint64_t word : lines_to_reclaim_) marked = marked || word != 0;
  if (!marked) return;
  epoch_domain().wait_for_readers();
  for (size_t word = 0; word < kLines / 64; ++word) {
    for (uint64_t bits = std::exchange(lines_to_reclaim_[word], 0); bits != 0; bits &= bits - 1) {
      for (std::atomic<Region *> &slot :
           parking_[word * 64 + static_cast<size_t>(std::countr_zero(bits))].parked) {
        // A parked region is this cache's and referenced: alive. One whose flag is clear can no
        // longer be taken back or parked by its owner (the wait above), only by this CAS.
        Region *region = slot.load(std::memory_order_acquire);
        if (region == nullptr || region->has(Region::kParkable)) continue;
        if (slot.compare_exchange_strong(region, nullptr, std::memory_order_acq_rel,
                                         std::memory_order_relaxed) &&
            region->drop_reference()) {
          defer_locked(region);
        }
      }
    }
  }
}

bool Cache::unpark_all_locked() noexcept {
  bool any = false;
  Region *region = lru_hand_;
  for (size_t budget = table_entries_; region != nullptr && budget-- != 0;
       region = region->lru_next) {
    if (region->has(Region::kParkable)) {
      unpark_locked(region);
      any = true;
    }
  }
  reclaim_parked_locked();
  return any;
}

void Cache::finish_all(Region *list) noexcept {
  while (list != nullptr) {
    Region *next = list->gc_next;
    finish(list);
    list = next;
  }
}

// Deregisters (unless `deregister` is false: a fork child forgets what the parent owns). By the
// region's only owner: under mutex_ for deferred regions, or the finishing thread.
void Cache::end_registration(Region *region, bool deregister) noexcept {
  if (deregister) {
    backend_.dereg(backend_ctx_, region->handle);
    hot_.add(Counter::Deregistrations);
  }
  hot_.add(Counter::EndedBytes, region->length());
  region->change_flags(0, Region::kRegistered);
}

// The end of a region: its count is zero and it is out of the table, so no one can add a
// callback any more. Never under mutex_ (the backend may munmap). No lock: a later holder of
// mutex_ takes it from finished_ and retires it (reap_finished_locked).
void Cache::finish(Region *region) noexcept {
  const uint32_t flags = region->flags.load(std::memory_order_acquire);
  const bool forgotten = (flags & Region::kForgotten) != 0;
  if ((flags & Region::kUnreleased) != 0) hot_.add(Counter::ReleasedBytes, region->length());
  if ((flags & Region::kRegistered) != 0) end_registration(region, !forgotten);
  for (InvalidateCallback *callback = region->callbacks; callback != nullptr;) {
    InvalidateCallback *next = callback->next;
    callback->done(callback->arg);
    delete callback;
    callback = next;
  }
  region->callbacks = nullptr;
  delete[] region->pfns;
  region->pfns = nullptr;
  // The last write: a reaper may retire it once it is on the stack. Release: pairs with the
  // reaper's exchange (later pushes continue the release sequence).
  Region *head = finished_.load(std::memory_order_relaxed);
  do {
    region->gc_next = head;
  } while (!finished_.compare_exchange_weak(head, region, std::memory_order_release,
                                            std::memory_order_relaxed));
}

// Every finished region leaves the live list and goes to the epoch domain (in batches), which
// recycles its memory once no fast-path reader can still hold it.
void Cache::reap_finished_locked() noexcept {
  if (finished_.load(std::memory_order_relaxed) == nullptr) return;
  // Acquire: every finisher's writes to the regions it pushed are visible.
  Region *region = finished_.exchange(nullptr, std::memory_order_acquire);
  while (region != nullptr) {
    Region *next = region->gc_next;
    unlink_live_locked(region);
    if (retiring_count_ == kRetireBatch) retire_batch_locked();
    retiring_[retiring_count_++] = region;
    region = next;
  }
}

// Unwatching waits for the batch too: a watch left a little longer costs nothing (the range stays
// registered), and a batch's last watches of mappings take the monitor's registry lock once.
void Cache::retire_batch_locked() noexcept {
  if (retiring_count_ == 0) return;
  uffd::WatchRange watched[kRetireBatch];
  size_t count = 0;
  for (size_t i = 0; i < retiring_count_; ++i) {
    const Region *region = retiring_[i];
    const uint32_t flags = region->flags.load(std::memory_order_relaxed);
    if ((flags & Region::kWatched) != 0 && (flags & Region::kForgotten) == 0) {
      watched[count++] = {region->start, region->length()};
    }
  }
  if (count != 0) uffd::unwatch_many(watched, count);
  // One object for the epoch domain: the batch chained through gc_next, recycled in one push.
  Region *chain = nullptr;
  for (size_t i = 0; i < retiring_count_; ++i) {
    retiring_[i]->gc_next = chain;
    chain = retiring_[i];
  }
  epoch_domain().retire(chain, &Cache::recycle_regions);
  retiring_count_ = 0;
}

Region *Cache::allocate_region_locked() noexcept {
  if (free_regions_ == nullptr && recycled_.load(std::memory_order_relaxed) != nullptr) {
    for (Region *region = recycled_.exchange(nullptr, std::memory_order_acquire);
         region != nullptr;) {
      Region *next = region->gc_next;
      free_region_locked(region);
      region = next;
    }
  }
  Region *region = free_regions_;
  if (region == nullptr) return new (std::nothrow) Region();
  free_regions_ = region->gc_next;
  --free_count_;
  region->reset();  // Region is trivially destructible: its storage is reused as it is
  return region;
}

void Cache::free_region_locked(Region *region) noexcept {
  if (free_count_ == kFreeRegionsMax) {
    delete region;
    return;
  }
  region->gc_next = free_regions_;
  free_regions_ = region;
  ++free_count_;
}

// The epoch domain's reclaim callback for a chain of regions: no lock (it may run on any thread,
// under any lock).
void Cache::recycle_regions(void *chain) noexcept {
  auto *first = static_cast<Region *>(chain);
  Region *last = first;
  while (last->gc_next != nullptr) last = last->gc_next;
  Cache *cache = first->cache;
  Region *head = cache->recycled_.load(std::memory_order_relaxed);
  do {
    last->gc_next = head;
  } while (!cache->recycled_.compare_exchange_weak(head, first, std::memory_order_release,
                                                   std::memory_order_relaxed));
}

// ---- invalidate, statistics ---------------------------------------------------------------------

mrc_status_t Cache::invalidate(Region *region, void (*done)(void *), void *arg) noexcept {
  if (region == nullptr || region->cache != this || region->has(Region::kFailed)) {
    return MRC_ERR_INVALID;
  }
  InvalidateCallback *callback = nullptr;
  Region *deferred = nullptr;
  if (done != nullptr) {
    callback = new (std::nothrow) InvalidateCallback{done, arg, nullptr};
    if (callback == nullptr) return MRC_ERR_NO_MEMORY;
  }
  {
    std::lock_guard lock(mutex_);
    if (callback != nullptr) {
      callback->next = region->callbacks;
      region->callbacks = callback;
    }
    if (region->has(Region::kInTable)) {
      ++slow_.invalidations;
      remove_locked(region);
    }
    deferred = take_deferred_locked();
  }
  finish_all(deferred);
  return MRC_OK;
}

void Cache::stats(mrc_stats_t *out) noexcept {
  SlowStats slow{};
  mrc_stats_t stats{};
  uint64_t ended_bytes = 0;
  uint64_t released_bytes = 0;
  uint64_t unreleased_uncached = 0;
  {
    std::unique_lock lock(mutex_);
    // True when read: an unmap that returned before this call is applied and counted now (like
    // a slow path would), and what it released is deregistered before the figures are taken.
    drain_locked();
    if (Region *deferred = take_deferred_locked(); deferred != nullptr) {
      lock.unlock();  // deregistration never runs under mutex_
      finish_all(deferred);
      lock.lock();
    }
    // The sharded sums under the lock too: what they subtract was then added before (under the
    // lock), so the differences never go below zero.
    slow = slow_;
    stats.regions = cached_regions_;
    ended_bytes = hot_.sum(Counter::EndedBytes);
    released_bytes = hot_.sum(Counter::ReleasedBytes);
    unreleased_uncached = hot_.sum(Counter::UnreleasedBytes);
  }
  stats.hits_fast = hot_.sum(Counter::HitsFast);
  stats.gets = stats.hits_fast + slow.gets_slow;
  stats.puts = hot_.sum(Counter::Puts);
  stats.hits_slow = slow.hits_slow;
  stats.misses = slow.misses;
  stats.merges = slow.merges;
  stats.unmap_events = slow.unmap_events;
  stats.invalidations = slow.invalidations;
  stats.registrations = slow.registrations;
  stats.deregistrations = hot_.sum(Counter::Deregistrations);
  stats.evictions = slow.evictions;
  stats.registered_bytes = slow.registered_bytes - ended_bytes;
  stats.registration_failures = slow.registration_failures;
  stats.uncacheable = slow.uncacheable;
  stats.pfn_mismatches = pfn_mismatches_.load(std::memory_order_relaxed);
  stats.purges = slow.purges;
  // Uncached regions count in and out outside the lock: a sum may see the out before the in.
  const uint64_t unreleased = slow.unreleased_bytes + unreleased_uncached;
  stats.unreleased_bytes = unreleased > released_bytes ? unreleased - released_bytes : 0;
  *out = stats;
}

int Cache::stats_json(char *buffer, size_t length) noexcept {
  mrc_stats_t s{};
  stats(&s);
  uint64_t histogram[64];
  {
    std::lock_guard lock(mutex_);
    std::memcpy(histogram, slow_.size_histogram, sizeof histogram);
  }
  fmt::memory_buffer text;
  auto out = std::back_inserter(text);
  fmt::format_to(out,
                 "{{\"name\":\"{}\",\"backend\":\"{}\",\"gets\":{},\"hits_fast\":{},"
                 "\"hits_slow\":{},\"misses\":{},\"merges\":{},\"unmap_events\":{},"
                 "\"invalidations\":{},\"puts\":{},\"registrations\":{},"
                 "\"deregistrations\":{},\"evictions\":{},\"regions\":{},"
                 "\"registered_bytes\":{},\"registration_failures\":{},\"uncacheable\":{},"
                 "\"pfn_mismatches\":{},\"purges\":{},\"unreleased_bytes\":{},"
                 "\"exact\":{},\"unmap_waits\":{},\"unmap_waits_outlasted\":{},"
                 "\"size_histogram\":{{",
                 name_, backend_.name != nullptr ? backend_.name : "", s.gets, s.hits_fast,
                 s.hits_slow, s.misses, s.merges, s.unmap_events, s.invalidations, s.puts,
                 s.registrations, s.deregistrations, s.evictions, s.regions, s.registered_bytes,
                 s.registration_failures, s.uncacheable, s.pfn_mismatches, s.purges,
                 s.unreleased_bytes, exact_, hot_.sum(Counter::UnmapWaits),
                 hot_.sum(Counter::UnmapWaitsOutlasted));
  bool first = true;
  for (unsigned bucket = 0; bucket < 64; ++bucket) {
    const uint64_t count = histogram[bucket];
    if (count == 0) continue;
    fmt::format_to(out, "{}\"{}\":{}", first ? "" : ",", uint64_t{1} << bucket, count);
    first = false;
  }
  fmt::format_to(out, "}}}}");
  const size_t size = text.size();
  if (buffer != nullptr && length != 0) {
    const size_t copied = std::min(size, length - 1);
    std::memcpy(buffer, text.data(), copied);
    buffer[copied] = '\0';
  }
  return static_cast<int>(size);
}

}  // namespace mrc
