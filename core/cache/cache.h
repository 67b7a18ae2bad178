// SPDX-License-Identifier: BSD-3-Clause
// The registration cache: regions by address in a radix page table, registered through a
// backend, invalidated by the userfaultfd monitor.
//
// THE OBJECTS, each with its rules at its top: Region (region.h: one registration, its count,
// its flags and the table of its states), PageTable (pgtable/pgtable.h), ClockRing
// (clock_ring.h), ParkingLines and ReclaimMarks (parking_lines.h), ChurnHints (churn_hints.h),
// Retirement (retirement.h), DeregBatch (dereg_batch.h), RegionStack (region_stack.h),
// RegionPool (region_pool.h), SlowCounters, ShardedCounters and StatsReading (statistics.h,
// counters.h). Why the rules below hold: docs/DESIGN.md, "The cache's objects".
//
// SYNCHRONIZATION
// 1. mutex_ is taken only through Lock (reentry.h frames, log.h deferral). The objects marked
//    MRC_GUARDED_BY(mutex_) are used only by its holder; every *_locked function requires it.
// 2. The hit path (get_fast, put, park) takes no lock: quiescent() (acquire), then an EpochGuard
//    around the lookup and the reference (try_acquire, or the caller's parked one taken back).
// 3. Region::flags: written under mutex_, or by the one thread that finishes the region (plain
//    load + release store); read with acquire.
// 4. No user code runs under mutex_ but the backend's reg (call_reg). Deregistration and
//    callbacks run after the unlock, by the thread that ended the count (release_last, finish)
//    or took the deferred regions (take_deferred_locked, then finish_all).
// 5. A region whose count ended moves through one hand-off at a time: the deferred stack or
//    dereg_batch_, finished_, the retiring batch, the epoch domain, recycled_, pool_
//    (docs/DESIGN.md, "The life of a region").
// 6. Region memory is reused or freed only through the epoch domain.
// 7. In exact mode every get probes for unmaps in flight before it trusts the table.
// 8. reg_state_ (seq_cst) tells the fork prepare handler that mutex_'s holder runs reg.
// 9. over_bound_ (relaxed): stored under mutex_ only when it changes; read by every put.
//
// THE CODE. create.cc: creating and destroying a cache. fast_path.cc: get and put without the
// mutex. slow_path.cc: the slow path under mutex_ (drain, removal, purge, registration).
// parking.cc: promotion and taking parked references back. evict.cc: the bound and eviction.
// release.cc: dropping references, finishing and reaping regions. invalidate.cc:
// mrc_invalidate. stats.cc: statistics. lock.cc: Lock. fork_registry.h: the process's caches.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backends/backends.h"
#include "base/check.h"
#include "base/mutex.h"
#include "core/cache/churn_hints.h"
#include "core/cache/clock_ring.h"
#include "core/cache/counters.h"
#include "core/cache/dereg_batch.h"
#include "core/cache/parking_lines.h"
#include "core/cache/reentry.h"
#include "core/cache/region.h"
#include "core/cache/region_pool.h"
#include "core/cache/region_stack.h"
#include "core/cache/retirement.h"
#include "core/cache/statistics.h"
#include "mrcache/mrcache.h"
#include "pgtable/pgtable.h"
#include "uffd/uffd.h"

namespace mrc {

class Cache {
 public:
  Cache(const Cache &) = delete;
  Cache &operator=(const Cache &) = delete;

  [[nodiscard]] static mrc_status_t create(const mrc_cache_params_t &params, Cache **out) noexcept;
  // MRC_ERR_BUSY, nothing changed, from inside this cache (its lock, a callback of it, its own
  // destroy) and, with refuse_held, while the application holds a region (the 0.2 call); without
  // it (the 0.1 call) regions still held are deregistered anyway and become invalid.
  [[nodiscard]] static mrc_status_t destroy(Cache *cache, bool refuse_held) noexcept;

  [[nodiscard]] mrc_status_t get(uintptr_t address, size_t length, size_t alignment, unsigned prot,
                                 Region **out) noexcept;
  void put(Region *region) noexcept;
  [[nodiscard]] mrc_status_t invalidate(Region *region, void (*done)(void *), void *arg) noexcept;
  // These and get (when it misses), invalidate and purge return MRC_ERR_BUSY where taking
  // mutex_ could deadlock (Lock::acquire).
  [[nodiscard]] mrc_status_t stats(mrc_stats_t *out) noexcept;
  int stats_json(char *buffer, size_t length) noexcept;

  // Forgets every cached region; with deregister=false the backend is not called (fork child).
  [[nodiscard]] mrc_status_t purge(bool deregister) noexcept;
  // MRC_FLAG_PURGE_ON_FORK, from the fork prepare handler: purges unless a thread runs reg
  // (waiting for it could wait for this fork).
  void purge_before_fork() noexcept;

  const char *name() const noexcept { return name_; }

 private:
  Cache() = default;
  ~Cache();

  // mutex_, with this thread's frame (reentry.h) and its log messages deferred until the unlock
  // (log.h): no user code runs under it but the backend's reg. acquire() blocks, except where
  // blocking could deadlock: false when this thread holds mutex_ already (reg calling back into
  // its cache), and only a try when it holds another cache's mutex (reg using another cache:
  // two such regs, each in a cache the other wants, would wait for each other). wait=true
  // always blocks (destroy after its checks, the fork handler).
  // A scoped capability made unlocked: the analysis sees mutex_ held after an acquire that
  // returned true, until release() or the end of the scope.
  class MRC_SCOPED_CAPABILITY Lock {
   public:
    explicit Lock(Cache &cache) noexcept MRC_EXCLUDES(cache.mutex_) : cache_(cache) {}
    ~Lock() MRC_RELEASE() {
      if (held_) release();
    }
    Lock(const Lock &) = delete;
    Lock &operator=(const Lock &) = delete;
    [[nodiscard]] bool acquire(bool wait = false) noexcept MRC_TRY_ACQUIRE(true);
    // For the fork prepare handler: waits for mutex_ unless its holder runs reg (false).
    [[nodiscard]] bool acquire_unless_reg_runs() noexcept MRC_TRY_ACQUIRE(true);
    void release() noexcept MRC_RELEASE();

   private:
    void enter() noexcept;
    Cache &cache_;
    InsideFrame frame_{};
    bool held_ = false;
  };
  // Tells the analysis that this thread holds mutex_ where it cannot follow the lock: in a
  // callback that runs under it, or where this thread's frames say so (reentry.h; checked in
  // debug builds).
  void assert_held() const noexcept MRC_ASSERT_CAPABILITY(mutex_) {
    MRC_DASSERT(inside(this, Inside::Lock));
  }
  // Whether the application holds a region (a reference that is not the table's or parked);
  // takes parked references back. Regions whose count ended go on the deferred stack.
  bool held_locked() noexcept MRC_REQUIRES(mutex_);

  // get() after its checks: [start, end) is [address, request_end) rounded out to the alignment.
  [[gnu::always_inline]] inline mrc_status_t get_range(uintptr_t address, uintptr_t request_end,
                                                       uintptr_t start, uintptr_t end,
                                                       uintptr_t align_mask, unsigned prot,
                                                       Region **out) noexcept;
  // align_mask: the requested alignment (at least alignment_) minus one. A region serves a get
  // only when both its bounds are aligned to it.
  bool get_fast(uintptr_t address, uintptr_t request_end, uintptr_t align_mask, unsigned prot,
                Region **out) noexcept;
  // Parks the caller's reference to region in the line of slot `owner` (the caller's). No: the
  // caller must release it. Refused: the caller holds no reference (holds_reference_to_park),
  // nothing changed, and the caller logs it (refuse_put).
  enum class Parked : uint8_t { Yes, No, Refused };
  Parked park(unsigned owner, Region *region) noexcept;
  static bool holds_reference_to_park(const Region *region, uint64_t parked_here) noexcept;
  // put() while over_bound_ is set: releases without parking and trims when the region is left
  // unused.
  [[gnu::noinline]] void put_over_bound(Region *region) noexcept;
  // A put refused by Region::drop or park (the caller held no reference): logged, nothing
  // changed.
  [[gnu::cold, gnu::noinline]] void refuse_put(const Region *region) noexcept;
  // Takes mutex_: evicts back to the bound, then finishes what that released.
  void trim() noexcept;
  void promote(Region *region) noexcept;
  // The backend's reg, under mutex_, with reg_state_ kRegRunning around it (docs/DESIGN.md,
  // "Fork while reg runs").
  mrc_status_t call_reg(uintptr_t start, uintptr_t end, unsigned prot, void **handle,
                        uint64_t *key) noexcept MRC_REQUIRES(mutex_);
  // The fork prepare handler's take of mutex_: true once taken, false when its holder runs reg
  // (reg_state_ is kRegForking then).
  bool lock_or_skip_for_fork() noexcept MRC_TRY_ACQUIRE(true, mutex_);
  // churning: the get took one of its range's churn tickets (ChurnHints::take_skip), and
  // registers uncached with no lookup (and no probe before: unmaps is Read).
  mrc_status_t get_slow(uintptr_t start, uintptr_t end, uintptr_t align_mask, unsigned prot,
                        uffd::Subscription::Unmaps unmaps, bool churning, Region **out) noexcept;
  bool verify_pfns(Region *region) noexcept;

  // Under mutex_.
  void drain_locked() noexcept MRC_REQUIRES(mutex_);
  void invalidate_range_locked(uintptr_t start, uintptr_t end) noexcept MRC_REQUIRES(mutex_);
  void remove_locked(Region *region) noexcept MRC_REQUIRES(mutex_);
  bool over_bound_locked() const noexcept MRC_REQUIRES(mutex_);
  void evict_locked() noexcept MRC_REQUIRES(mutex_);
  size_t evict_unused_locked() noexcept MRC_REQUIRES(mutex_);
  // Registers [start, end) merged with the regions it overlaps, watched and in the table; with
  // cacheable=false exactly the request, handed out uncached (deregistered at its last put).
  // When the backend is out of resources and `evicted` is given, evicts every unused region and
  // sets *evicted (MRC_ERR_NO_MEMORY): the caller deregisters them after the lock and retries.
  mrc_status_t register_locked(uintptr_t start, uintptr_t end, uintptr_t align_mask, unsigned prot,
                               bool cacheable, bool *evicted, Region **out) noexcept
      MRC_REQUIRES(mutex_);
  // register_locked's phases, in the order it runs them (slow_path.cc); a Registration carries
  // the range, the costs, the region, the watch and the backend's handle from one to the next.
  struct Registration;
  // Takes every overlapping region out of the table, widening the request over those it absorbs.
  void merge_overlapping_locked(Registration &reg, uintptr_t align_mask) noexcept
      MRC_REQUIRES(mutex_);
  // Watches the range before reg (a cacheable one only), timed for the churn learner.
  void watch_locked(Registration &reg, bool cacheable) noexcept MRC_REQUIRES(mutex_);
  // The backend's reg, and what this registration and those it absorbed cost, on the region.
  mrc_status_t register_with_backend_locked(Registration &reg) noexcept MRC_REQUIRES(mutex_);
  // A merged registration failed: the request alone, watched again, may still register.
  mrc_status_t register_request_alone_locked(Registration &reg, uintptr_t start, uintptr_t end,
                                             unsigned prot, mrc_status_t status) noexcept
      MRC_REQUIRES(mutex_);
  // A registration that ends here: its watch goes, its storage back to the pool (Free).
  void give_back_locked(Registration &reg) noexcept MRC_REQUIRES(mutex_);
  // A failure that lasts until the memory changes stays in the table (Failed); returns status.
  mrc_status_t remember_failure_locked(Registration &reg, mrc_status_t status) noexcept
      MRC_REQUIRES(mutex_);
  // MRC_FLAG_VERIFY_PFN: the page frames a hit compares with (verify_pfns).
  void capture_pfns_locked(Region *region) noexcept MRC_REQUIRES(mutex_);
  // Into the table, the ring and the live list (Cached), or handed out Uncached when unwatched.
  mrc_status_t publish_locked(Registration &reg, Region **out) noexcept MRC_REQUIRES(mutex_);

  void purge_locked(bool deregister) noexcept MRC_REQUIRES(mutex_);
  // Clears kParkable and takes back region's parked references: at once from the caller's own
  // line, else later by reclaim_parked_locked() from the owner's (parking_lines.h). Regions
  // whose count then ends go on the deferred stack.
  void unpark_locked(Region *region) noexcept MRC_REQUIRES(mutex_);
  void reclaim_parked_locked() noexcept MRC_REQUIRES(mutex_);
  // Clears kParkable on every cached region and reclaims what was parked (eviction needs the
  // regions no one really uses). Returns whether any region was parkable.
  bool unpark_all_locked() noexcept MRC_REQUIRES(mutex_);

  // Dropping references. A region whose count reached zero is finished outside mutex_ (on the
  // put path, or after the lock for those on the deferred stack) and pushed on finished_, then
  // unlinked from the live list and retired by reap_finished_locked.
  void release(Region *region) noexcept;
  void release_last(Region *region) noexcept;  // the count reached zero (kDead): ours to end
  // Reclaims parked references (they may end counts), then hands over the deferred stack.
  Region *take_deferred_locked() noexcept MRC_REQUIRES(mutex_);
  void finish_all(Region *list) noexcept;
  void finish(Region *region) noexcept;
  void end_registration(Region *region, bool deregister) noexcept;
  void reap_finished_locked() noexcept MRC_REQUIRES(mutex_);
  void finish_dereg_batch() noexcept;
  // The epoch domain's reclaim callback (any thread): a retired batch's storage onto recycled_.
  static void recycle_regions(void *chain) noexcept;
  // Takes mutex_: drains, finishes what that released, and reads the figures (statistics.h).
  mrc_status_t read_stats(StatsReading *reading) noexcept;

  char name_[64] = "mrcache";
  backends::CheckedOps backend_{};  // the caller's ops, completed with not-supported defaults
  void *backend_ctx_ = nullptr;
  size_t max_regions_ = 0;
  size_t max_bytes_ = 0;
  // Set (relaxed) under mutex_ when eviction left the cache past max_regions/max_bytes (every
  // region in use), cleared under mutex_ once it is back within them; read relaxed by put. Stored
  // only when it changes: the line is read by every put.
  std::atomic<bool> over_bound_{false};
  unsigned flags_ = 0;
  bool exact_ = true;  // no MRC_FLAG_ORDERED_UNMAPS: every get probes for unmaps in flight
  ChurnHints churn_;   // its entries under mutex_, its tickets any thread (churn_hints.h)
  size_t verify_pfn_pages_ = 0;
  size_t alignment_ = 4096;
  bool print_stats_ = false;

  uffd::Subscription *subscription_ = nullptr;
  PageTable table_;

  // It guards what is marked MRC_GUARDED_BY (docs/DESIGN.md, "Contracts the compiler checks").
  // The Region fields marked "mutex_" belong to another class, where the analysis cannot name
  // this lock: they stay comments, as table_'s and churn_'s do (they have lock-free readers).
  Mutex mutex_;
  ClockRing ring_ MRC_GUARDED_BY(mutex_);             // the cached regions, and the CLOCK hand
  size_t table_entries_ MRC_GUARDED_BY(mutex_) = 0;   // regions in the table, failures too
  size_t cached_regions_ MRC_GUARDED_BY(mutex_) = 0;  // registered regions in the table
  size_t cached_bytes_ MRC_GUARDED_BY(mutex_) = 0;

  // The end of a region's life: the lists under mutex_, and the stacks that regions ended
  // without it reach them through.
  Retirement retirement_ MRC_GUARDED_BY(mutex_);
  DeregBatch dereg_batch_;  // last puts whose deregistration waits for a batch (max_unreleased)
  RegionStack finished_;    // finished, waiting for reap_finished_locked
  static constexpr uint64_t kReapEvery = 8;  // slow-path gets per reap of finished_
  RegionPool pool_ MRC_GUARDED_BY(mutex_);
  RegionStack recycled_;  // retired storage the epoch domain handed back, for pool_

  // A region earns kParkable after this many consecutive fast-path hits by one thread: the
  // reclaim at its removal costs a membarrier, which a region used once should not pay.
  static constexpr uint32_t kPromoteAfter = 8;
  ParkingLines parking_;
  ReclaimMarks reclaim_marks_ MRC_GUARDED_BY(mutex_);  // owners' lines unpark_locked marked

  ShardedCounters hot_;                         // what changes outside mutex_
  SlowCounters slow_ MRC_GUARDED_BY(mutex_){};  // the rest

  Cache *fork_next_ = nullptr;  // the process's list of caches (fork handling)
  // Set by the fork prepare handler when the forking thread holds mutex_ (a fork inside reg):
  // the handlers then neither take nor release it. CacheRegistry::mutex().
  bool fork_held_ = false;
  // Set by the fork prepare handler when another thread holding mutex_ runs reg (reg_state_ is
  // then kRegForking: docs/DESIGN.md, "Fork while reg runs"): the parent's handler lets that
  // thread go on, the child's re-creates mutex_. CacheRegistry::mutex().
  bool fork_skipped_ = false;
  static constexpr uint32_t kRegIdle = 0, kRegRunning = 1, kRegForking = 2;
  std::atomic<uint32_t> reg_state_{kRegIdle};
  friend struct CacheRegistry;
  friend struct CacheTesting;  // testing.cc: what core/cache/testing.h shows tests of a cache
};

}  // namespace mrc
