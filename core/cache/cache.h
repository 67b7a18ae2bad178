// SPDX-License-Identifier: BSD-3-Clause
// The registration cache: regions by address in a radix page table, registered through a
// backend, invalidated by the userfaultfd monitor.
//
// SYNCHRONIZATION
// - mutex_ guards the page table's writer side, the LRU ring, the live list, the slow-path
//   statistics (plain integers) and every Region field marked "mutex_". One slow-path thread at
//   a time. Region::flags are written only under mutex_ or by the one thread that finishes the
//   region (plain load + release store, no read-modify-write); readers load them with acquire.
// - Fast path (get_fast, any thread, no lock): subscription_->quiescent() (acquire: pairs with the
//   monitor's release of `pending` and with this cache's release of its cursor in drain) →
//   EpochGuard → page-table lookup (acquire loads of child pointers, pairs with the writer's
//   release stores) → the reference: taken back from this thread's parking line when the region
//   is kParkable and parked there (no locked instruction), else Region::try_acquire (one
//   fetch_add; a count marked kDead is never used) → flags check (an invalid region is put back
//   and the slow path runs) → CLOCK bit (a relaxed store, only when it was clear).
//   Because the cursor is released only after the removals of a batch are applied, a thread
//   that sees the queue drained also sees those regions gone.
// - A region that leaves the table (or was never in it: uncached) is linked nowhere but the
//   live list (mutex_). The last put finishes it without any lock (deregistration, callbacks)
//   and pushes it on finished_ (release CAS; the finisher's last write to it); a later holder
//   of mutex_ takes the whole stack (acquire exchange: every push before it is visible), unlinks
//   each region from the live list and retires it, unwatching its range and handing it to the
//   epoch domain in batches. So a reap costs what it retires, however many regions out of the
//   table are still held.
//   Region memory is recycled (pool) or freed only through the epoch domain, so a fast-path reader
//   holding a stale pointer never touches reused memory.
// - Deregistration runs outside mutex_ (the backend may munmap, whose event the monitor reads;
//   nothing here waits for the monitor while holding the mutex except drain's bounded wait for
//   `pending`, and the monitor never waits for anything).
// - User code and mutex_ (docs/DESIGN.md, "The C API contract", "User code"). mutex_ is taken
//   only through Lock, which records it in the thread's frames (reentry.h) and defers the
//   thread's log messages to after the unlock (log.h). The only user code under it is the
//   backend's reg (register_locked); a region whose count ends under it goes on deferred_ (also
//   a put from inside reg: release_last), finished after the unlock by the same thread. Calls
//   back from reg that need mutex_ are refused (Lock::acquire, get_slow). dereg and invalidate
//   callbacks run inside an Inside::Callback frame, destroy inside Inside::Destroy: destroy from
//   them, and a get from destroy's callbacks, are refused.
// - Fork while another thread runs reg. reg_state_ is kRegRunning while the mutex_ holder is
//   inside the backend's reg (call_reg), when it touches no cache state. The fork prepare handler
//   does not wait for such a mutex_ (reg may fork, or create a cache, and wait for this fork):
//   it CASes kRegRunning to kRegForking and copies the cache as it is; call_reg, when reg
//   returns, CASes kRegRunning back to kRegIdle and waits (futex) while it finds kRegForking,
//   which the parent's handler ends. The child re-creates the mutex its missing holder left
//   locked (fork_registry.cc). reg_state_: seq_cst; written by the mutex_ holder and the
//   handlers of a fork.
// - The unmap window. The kernel queues an UNMAP event only after the VMA is gone, so for a few
//   microseconds another thread can map new memory at that address while the old region is
//   still in the table (and its range still counts as watched). In exact mode (the default)
//   get() closes it: it probes the kernel's count of changes in flight (one ioctl) before the
//   fast path's quiescent() or the slow path's drain, and a get that finds one in flight waits
//   for it outside mutex_ (or, past a bounded wait, registers the request uncached). With
//   MRC_FLAG_ORDERED_UNMAPS only a miss probes (before it watches and registers), and only gets
//   ordered after the unmap returned are exact: the unmapping thread returns only after the
//   monitor read the event, so such a get sees the record published or `pending` raised
//   (docs/DESIGN.md, "Fast mode").
// - Parked references (the hit path without a locked instruction). A region marked kParkable has
//   one owner, a thread slot, in the same flags word (so one load reads both). The owner's put
//   keeps the reference in its ParkingLine instead of decrementing the count; its next get of
//   the region takes it back. Both are plain stores to the owner's own line, inside an
//   EpochGuard, after reading kParkable and the owner (relaxed) in that guard; other threads use
//   the count. kParkable and the owner are set and cleared only under mutex_: set, with the
//   owner, once a thread hit the region kPromoteAfter times in a row; the owner becomes
//   kAnyOwner (every thread parks) when a second thread does; cleared when the region leaves the
//   table (or for all of them, when eviction finds parked regions in its way). Whoever clears it
//   takes the parked references back before releasing mutex_ (unpark_locked): from its own line
//   directly when it is the single owner (nothing else writes that line); else it marks the
//   owner's line (every line for kAnyOwner), and
//   reclaim_parked_locked() runs EpochDomain::wait_for_readers() (every guard that could have
//   read kParkable set has ended; every later one reads it clear), then a CAS takes each parked
//   reference of a region without kParkable out of the marked lines and drops it. So after that
//   no line holds such a region, and none can until it is promoted again. That CAS may empty a
//   slot of a line whose owner is parking at that moment (its guard began after the wait): a
//   put decides from one read of each slot (park). A parked reference is a real one: the region
//   stays alive, and counts as in use, until taken back or reclaimed.
//   Lines are indexed by the thread's exclusive counter slot (threads sharing slots do not park);
//   a slot's next thread inherits its line, and with it the ownership of what is parked there.
// - Over the bound. When every cached region is in use, eviction leaves the cache past
//   max_regions/max_bytes and sets over_bound_ (relaxed, under mutex_); it is cleared under
//   mutex_ once removals bring the cache back within the bound. put reads it relaxed (a load of a
//   line that is only read while the cache stays within its bound): when set, the put does not
//   park (a parked reference would keep the region looking used), releases its reference with
//   fetch_sub, and when that left only the table's reference (and the region was in the table at
//   the put, read under the caller's reference), takes mutex_ and evicts back to the bound; the
//   evicted regions are finished after the lock. A put that read a stale clear flag only delays
//   the trim to the next miss or trim (the bound was never a hard one while regions are held).
// - Statistics: what changes outside mutex_ (hits, puts, ended registrations) goes to per-thread
//   shards (core/cache/counters.h), the rest are plain integers under mutex_. stats() drains the
//   invalidation queue under mutex_ first, as a slow path does (so an unmap that returned before
//   the call is counted), finishes the regions that released outside the lock, then takes the
//   figures under mutex_ again.
//
// THE CODE. region.h: a region, its flags, its count and its life (the state table);
// parking_line.h: a thread's parked references; fork_registry.h: the process's caches, for fork.
// create.cc: creating and destroying a cache. fast_path.cc: get and put without the mutex.
// slow_path.cc: the slow path under mutex_ (drain, removal, purge, registration). parking.cc:
// promotion and taking parked references back. evict.cc: the bound and eviction. release.cc:
// dropping references, finishing and reaping regions. region_pool.cc: region memory.
// invalidate.cc: mrc_invalidate. stats.cc: statistics. lock.cc and reentry.h: Lock, and which
// cache's lock or callback the thread is inside.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backends/backends.h"
#include "base/check.h"
#include "base/mutex.h"
#include "core/cache/churn_hints.h"
#include "core/cache/counters.h"
#include "core/cache/parking_line.h"
#include "core/cache/reentry.h"
#include "core/cache/region.h"
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
  // takes parked references back. Under mutex_; regions whose count ended go on deferred_.
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
  void count_streak(ParkingLine &line, Region *region) noexcept;
  // put() while over_bound_ is set: releases without parking and trims when the region is left
  // unused.
  [[gnu::noinline]] void put_over_bound(Region *region) noexcept;
  // A put refused by Region::drop or park (the caller held no reference): logged, nothing
  // changed.
  [[gnu::cold, gnu::noinline]] void refuse_put(const Region *region) noexcept;
  // Takes mutex_: evicts back to the bound, then finishes what that released.
  void trim() noexcept;
  void promote(Region *region) noexcept;
  // The backend's reg, under mutex_, with reg_state_ kRegRunning around it (SYNCHRONIZATION).
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
  // Whether a cached region's reuses saved more than its watch and its unmap cost.
  static bool caching_paid(const Region &region) noexcept;
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
  // The LRU ring through lru_prev/lru_next (head lru_hand_). Inserted just behind the head: the
  // last one a walk from the head reaches. Static, so no REQUIRES (it cannot name mutex_): they
  // change only the ring passed in, and passing lru_hand_ by reference needs mutex_ (checked).
  static void ring_insert_locked(Region *&head, Region *region) noexcept;
  static void ring_remove_locked(Region *&head, Region *region) noexcept;

  void purge_locked(bool deregister) noexcept MRC_REQUIRES(mutex_);
  // Clears kParkable and takes back region's parked references: at once from the caller's own
  // line, else later by reclaim_parked_locked() from the owner's (see SYNCHRONIZATION). Regions
  // whose count then ends go on deferred_.
  void unpark_locked(Region *region) noexcept MRC_REQUIRES(mutex_);
  void reclaim_parked_locked() noexcept MRC_REQUIRES(mutex_);
  // Clears kParkable on every cached region and reclaims what was parked (eviction needs the
  // regions no one really uses). Returns whether any region was parkable.
  bool unpark_all_locked() noexcept MRC_REQUIRES(mutex_);
  void live_insert_locked(Region *region) noexcept MRC_REQUIRES(mutex_);

  // Dropping references. A region whose count reached zero is finished outside mutex_ (on the
  // put path, or after the lock for those collected on deferred_) and pushed on finished_, then
  // unlinked from the live list and retired by reap_finished_locked.
  void release(Region *region) noexcept;
  void release_last(Region *region) noexcept;  // the count reached zero (kDead): ours to end
  void defer_locked(Region *region) noexcept MRC_REQUIRES(mutex_);
  Region *take_deferred_locked() noexcept MRC_REQUIRES(mutex_);
  void finish_all(Region *list) noexcept;
  void finish(Region *region) noexcept;
  void end_registration(Region *region, bool deregister) noexcept;
  void reap_finished_locked() noexcept MRC_REQUIRES(mutex_);
  void retire_batch_locked() noexcept MRC_REQUIRES(mutex_);
  void unlink_live_locked(Region *region) noexcept MRC_REQUIRES(mutex_);
  void finish_dereg_batch() noexcept;
  // Region memory: the epoch domain's reclaim callback (any thread) pushes each retired batch
  // on recycled_; mutex_ holders allocate from free_regions_ and refill it from recycled_ in one
  // exchange.
  Region *allocate_region_locked() noexcept MRC_REQUIRES(mutex_);
  void free_region_locked(Region *region) noexcept MRC_REQUIRES(mutex_);
  static void recycle_regions(void *chain) noexcept;

  char name_[64] = "mrcache";
  backends::CheckedOps backend_{};  // the caller's ops, completed with not-supported defaults
  void *backend_ctx_ = nullptr;
  size_t max_regions_ = 0;
  size_t max_bytes_ = 0;
  size_t max_unreleased_ = 0;
  // Set (relaxed) under mutex_ when eviction left the cache past max_regions/max_bytes (every
  // region in use), cleared under mutex_ once it is back within them; read relaxed by put. Stored
  // only when it changes: the line is read by every put.
  std::atomic<bool> over_bound_{false};
  unsigned flags_ = 0;
  bool exact_ = true;        // no MRC_FLAG_ORDERED_UNMAPS: every get probes for unmaps in flight
  bool learn_churn_ = true;  // no MRC_FLAG_CACHE_CHURN: misses of churning ranges go uncached
  ChurnHints churn_;         // mutex_, but its tickets (take_skip) any thread
  size_t verify_pfn_pages_ = 0;
  size_t alignment_ = 4096;
  bool print_stats_ = false;

  uffd::Subscription *subscription_ = nullptr;
  PageTable table_;

  // It guards the fields marked GUARDED_BY (docs/DESIGN.md, "Contracts the compiler checks").
  // The Region fields marked "mutex_" belong to another class, where the analysis cannot name
  // this lock: they stay comments, as table_ and churn_ do (they have lock-free readers).
  Mutex mutex_;
  Region *lru_hand_ MRC_GUARDED_BY(mutex_) = nullptr;   // the CLOCK hand over the cached regions
  Region *live_head_ MRC_GUARDED_BY(mutex_) = nullptr;  // every region not yet retired
  size_t table_entries_ MRC_GUARDED_BY(mutex_) = 0;     // regions in the table, failures too
  size_t cached_regions_ MRC_GUARDED_BY(mutex_) = 0;    // registered regions in the table
  size_t cached_bytes_ MRC_GUARDED_BY(mutex_) = 0;
  Region *deferred_ MRC_GUARDED_BY(mutex_) = nullptr;  // count reached zero under the lock
  // Last put of invalid regions whose deregistration waits for a batch (max_unreleased).
  std::atomic<Region *> dereg_batch_{nullptr};
  std::atomic<uint64_t> dereg_batch_bytes_{0};
  std::atomic<Region *> finished_{nullptr};  // finished, not yet retired (SYNCHRONIZATION)
  // mutex_: unlinked from the live list, retired to the epoch domain in batches (one object
  // per batch).
  static constexpr size_t kRetireBatch = 32;
  static constexpr uint64_t kReapEvery = 8;  // slow-path gets per reap of finished_
  Region *retiring_[kRetireBatch] MRC_GUARDED_BY(mutex_) = {};
  size_t retiring_count_ MRC_GUARDED_BY(mutex_) = 0;

  // A region earns kParkable after this many consecutive fast-path hits by one thread: the
  // reclaim at its removal costs a membarrier, which a region used once should not pay.
  static constexpr uint32_t kPromoteAfter = 8;
  static constexpr size_t kLines = kThreadSlots;
  static_assert(kLines <= Region::kAnyOwner);
  // Owners' lines marked by unpark_locked.
  uint64_t lines_to_reclaim_[kLines / 64] MRC_GUARDED_BY(mutex_) = {};
  ParkingLine parking_[kLines];

  ShardedCounters hot_;
  // Slow-path statistics, mutex_. Totals that also fall outside the lock are a mutex_ sum here
  // minus a sharded counter (registered bytes, unreleased bytes).
  struct SlowStats {
    uint64_t gets_slow, hits_slow, misses, merges, unmap_events, invalidations, registrations,
        evictions, registration_failures, uncacheable, purges;
    uint64_t churn_skips;       // misses registered uncached because their range churns
    uint64_t churn_unprobed;    // of them, taken at the get's start: no probe, no lookup
    uint64_t registered_bytes;  // ever registered; minus Counter::EndedBytes = still registered
    uint64_t unreleased_bytes;  // ever left the table referenced; plus Counter::UnreleasedBytes
                                // minus Counter::ReleasedBytes = still waiting
    uint64_t size_histogram[64];
  } slow_ MRC_GUARDED_BY(mutex_){};
  std::atomic<uint64_t> pfn_mismatches_{0};  // counted on the fast path, outside mutex_

  static constexpr size_t kFreeRegionsMax = 4096;  // beyond it, region memory goes back to malloc
  std::atomic<Region *> recycled_{nullptr};
  Region *free_regions_ MRC_GUARDED_BY(mutex_) = nullptr;
  size_t free_count_ MRC_GUARDED_BY(mutex_) = 0;

  Cache *fork_next_ = nullptr;  // the process's list of caches (fork handling)
  // Set by the fork prepare handler when the forking thread holds mutex_ (a fork inside reg):
  // the handlers then neither take nor release it. CacheRegistry::mutex().
  bool fork_held_ = false;
  // Set by the fork prepare handler when another thread holding mutex_ runs reg (reg_state_ is
  // then kRegForking, see SYNCHRONIZATION): the parent's handler lets that thread go on, the
  // child's re-creates mutex_. CacheRegistry::mutex().
  bool fork_skipped_ = false;
  static constexpr uint32_t kRegIdle = 0, kRegRunning = 1, kRegForking = 2;
  std::atomic<uint32_t> reg_state_{kRegIdle};
  friend struct CacheRegistry;
  friend struct CacheTesting;  // testing.cc: what core/cache/testing.h shows tests of a cache
};

}  // namespace mrc
