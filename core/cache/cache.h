// The registration cache: regions by address in a radix page table, registered through a
// backend, invalidated by the userfaultfd monitor.
//
// SYNCHRONIZATION
// - mutex_ guards the page table's writer side, the LRU ring, the live list, the slow-path
//   statistics (plain integers) and every Region field marked "mutex_". One slow-path thread at
//   a time. Region::flags are written only under mutex_ or by the one thread that finishes the
//   region (plain load + release store, no read-modify-write); readers load them with acquire.
// - Fast path (get_fast, any thread, no lock): consumer_->quiescent() (acquire: pairs with the
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
// - The unmap window. The kernel queues an UNMAP event only after the VMA is gone, so for a few
//   microseconds another thread can map new memory at that address while the old region is
//   still in the table (and its range still counts as watched). In exact mode (the default)
//   get() closes it: it probes the kernel's count of changes in flight (one ioctl) before the
//   fast path's quiescent() or the slow path's drain, and a get that finds one in flight waits
//   for it outside mutex_ (or, past a bounded wait, registers the request uncached). With
//   MRC_FLAG_ORDERED_UNMAPS there is no probe, and only gets ordered after the unmap returned
//   are exact: the unmapping thread returns only after the monitor read the event, so such a
//   get sees the record published or `pending` raised (docs/DESIGN.md).
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
//   no line holds such a region, and none can until it is promoted again. A parked reference is
//   a real one: the region stays alive, and counts as in use, until taken back or reclaimed.
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
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/cache/counters.h"
#include "mrcache/mrcache.h"
#include "pgtable/pgtable.h"
#include "uffd/uffd.h"

struct mrc_region {};  // the C API's opaque handle; Region derives from it

namespace mrc {

class Cache;

// A completion callback of mrc_invalidate, run once after deregistration.
struct InvalidateCallback {
  void (*done)(void *);
  void *arg;
  InvalidateCallback *next;
};

struct Region : PgtRegion, mrc_region {
  enum Flags : uint32_t {
    kInTable = 1U << 0,     // reachable through the page table (holds one reference)
    kInvalid = 1U << 1,     // no longer handed out; deregistered at the last reference
    kRegistered = 1U << 2,  // the backend holds a registration (handle, key valid)
    kFailed = 1U << 3,      // a remembered registration failure (negative entry)
    kUncached = 1U << 4,    // never in the table: deregistered at the last put
    kForgotten = 1U << 5,   // inherited across fork: freed without deregistration
    kWatched = 1U << 6,     // the range is watched by the monitor (unwatch at the end)
    kUnreleased = 1U << 7,  // counted in unreleased bytes (left the table referenced, or
                            // an uncached region waiting on garbage_)
    kParkable = 1U << 8,    // in the table, and its owner's puts may park (SYNCHRONIZATION)
  };
  // The owner of a kParkable region: a thread slot index, or kAnyOwner once a second thread
  // earned it too; in the flags word above its bits.
  static constexpr unsigned kOwnerShift = 16;
  static constexpr uint32_t kOwnerMask = 0xffU << kOwnerShift;
  static constexpr unsigned kAnyOwner = 0xff;
  static constexpr unsigned owner_of(uint32_t flags) noexcept {
    return (flags & kOwnerMask) >> kOwnerShift;
  }
  // Whether the thread of slot `index` may park this region (given its flags).
  static constexpr bool parks_for(uint32_t flags, unsigned index) noexcept {
    return (flags & kParkable) != 0 && (owner_of(flags) == index || owner_of(flags) == kAnyOwner);
  }

  // References: the table's (while kInTable) and one per get. kDead is set once, by the thread
  // whose release found the count at zero; a region whose count has kDead is never acquired.
  static constexpr uint64_t kDead = uint64_t{1} << 63;
  std::atomic<uint64_t> refcount{0};
  std::atomic<uint32_t> flags{0};
  std::atomic<bool> referenced{false};  // CLOCK bit: used since the eviction hand last passed
  unsigned prot = 0;
  void *handle = nullptr;
  uint64_t key = 0;
  mrc_status_t failure = MRC_OK;  // for kFailed entries
  Cache *cache = nullptr;
  Region *lru_prev = nullptr;  // mutex_: the LRU ring (cached regions)
  Region *lru_next = nullptr;
  Region *live_prev = nullptr;  // mutex_: every region of the cache until it is retired
  Region *live_next = nullptr;
  Region *gc_next = nullptr;  // the deferred, garbage and finished stacks, then the region pool
  InvalidateCallback *callbacks = nullptr;  // mutex_
  uint64_t *pfns = nullptr;                 // page frames recorded at registration
  size_t pfn_count = 0;

  // A fresh region in recycled storage: every field as a new Region has it. Field by field, not
  // `new (this) Region()`: GCC zeroes the whole object with `rep stos`, whose start-up cost was
  // a twentieth of a miss. The static_assert below the class catches a field added without
  // a line here.
  void reset() noexcept {
    start = end = 0;
    refcount.store(0, std::memory_order_relaxed);
    flags.store(0, std::memory_order_relaxed);
    referenced.store(false, std::memory_order_relaxed);
    prot = 0;
    handle = nullptr;
    key = 0;
    failure = MRC_OK;
    cache = nullptr;
    lru_prev = lru_next = live_prev = live_next = gc_next = nullptr;
    callbacks = nullptr;
    pfns = nullptr;
    pfn_count = 0;
  }
  size_t length() const noexcept { return end - start; }
  bool has(uint32_t flag) const noexcept {
    return (flags.load(std::memory_order_acquire) & flag) != 0;
  }
  // Under mutex_, or by the thread finishing the region: the only writers (see SYNCHRONIZATION).
  void change_flags(uint32_t set, uint32_t clear = 0) noexcept {
    flags.store((flags.load(std::memory_order_relaxed) | set) & ~clear, std::memory_order_release);
  }
  // One locked instruction. An increment from zero (the count fell to zero but its releaser
  // has not set kDead yet) is a valid resurrection: that releaser's CAS then fails and the
  // caller, finding the region invalid, becomes the one to release it. Pairs with release's
  // acq_rel decrement: a successful acquire sees every flag set before the references dropped.
  bool try_acquire() noexcept {
    return (refcount.fetch_add(1, std::memory_order_acquire) & kDead) == 0;
  }
  // True for the one caller that dropped the last reference and must retire the region. The
  // last reference costs one locked instruction too: 1 -> kDead directly.
  // When it returns false and `left` is given, *left is the count this drop left (references of
  // others, which may be gone by the time the caller reads it).
  bool drop_reference(uint64_t *left = nullptr) noexcept {
    uint64_t one = 1;
    if (refcount.load(std::memory_order_relaxed) == 1 &&
        refcount.compare_exchange_strong(one, kDead, std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
      return true;
    }
    const uint64_t before = refcount.fetch_sub(1, std::memory_order_acq_rel);
    if (left != nullptr) *left = before - 1;
    if (before != 1) return false;
    uint64_t zero = 0;
    return refcount.compare_exchange_strong(zero, kDead, std::memory_order_acq_rel,
                                            std::memory_order_relaxed);
  }
};

static_assert(sizeof(Region) == 17 * sizeof(void *),
              "a field was added: reset it in Region::reset()");

// One thread's parked references in one cache (see SYNCHRONIZATION). `parked` is written by the
// owning thread with plain stores, inside a guard or (as the mutex_ holder) under mutex_, and by
// another mutex_ holder with a CAS; the rest only by the owner.
struct alignas(64) ParkingLine {
  static constexpr size_t kSlots = 4;
  std::atomic<Region *> parked[kSlots] = {};
  uint8_t reused[kSlots] = {};  // CLOCK bits: taken back since the hand last passed
  uint32_t hand = 0;
  const Region *streak_region = nullptr;  // identity only: the region hit last, unparked
  uint32_t streak = 0;                    // consecutive hits on it
};

class Cache {
 public:
  Cache(const Cache &) = delete;
  Cache &operator=(const Cache &) = delete;

  [[nodiscard]] static mrc_status_t create(const mrc_cache_params_t &params, Cache **out) noexcept;
  static void destroy(Cache *cache) noexcept;

  [[nodiscard]] mrc_status_t get(uintptr_t address, size_t length, size_t alignment, unsigned prot,
                                 Region **out) noexcept;
  void put(Region *region) noexcept;
  [[nodiscard]] mrc_status_t invalidate(Region *region, void (*done)(void *), void *arg) noexcept;
  void stats(mrc_stats_t *out) noexcept;
  int stats_json(char *buffer, size_t length) noexcept;

  // Forgets every cached region; with deregister=false the backend is not called (fork child).
  void purge(bool deregister) noexcept;

  const char *name() const noexcept { return name_; }

 private:
  Cache() = default;
  ~Cache();

  // align_mask: the requested alignment (at least alignment_) minus one. A region serves a get
  // only when both its bounds are aligned to it.
  bool get_fast(uintptr_t address, uintptr_t request_end, uintptr_t align_mask, unsigned prot,
                Region **out) noexcept;
  // Parks the caller's reference to region in the line of slot `owner` (the caller's); false
  // when the caller must release it.
  bool park(unsigned owner, Region *region) noexcept;
  void count_streak(ParkingLine &line, Region *region) noexcept;
  // put() while over_bound_ is set: releases without parking and trims when the region is left
  // unused.
  [[gnu::noinline]] void put_over_bound(Region *region) noexcept;
  // Takes mutex_: evicts back to the bound, then finishes what that released.
  void trim() noexcept;
  void promote(Region *region) noexcept;
  mrc_status_t get_slow(uintptr_t start, uintptr_t end, uintptr_t align_mask, unsigned prot,
                        uffd::Subscription::Unmaps unmaps, Region **out) noexcept;
  bool verify_pfns(Region *region) noexcept;

  // Under mutex_.
  void drain_locked() noexcept;
  void invalidate_range_locked(uintptr_t start, uintptr_t end) noexcept;
  void remove_locked(Region *region) noexcept;
  bool over_bound_locked() const noexcept;
  void evict_locked() noexcept;
  size_t evict_unused_locked() noexcept;
  // Registers [start, end) merged with its neighbours, watched and in the table; with
  // cacheable=false exactly the request, handed out uncached (deregistered at its last put).
  mrc_status_t register_locked(uintptr_t start, uintptr_t end, uintptr_t align_mask, unsigned prot,
                               bool cacheable, Region **out) noexcept;
  // The LRU ring through lru_prev/lru_next (head lru_hand_). Inserted just behind the head: the
  // last one a walk from the head reaches.
  static void ring_insert_locked(Region *&head, Region *region) noexcept;
  static void ring_remove_locked(Region *&head, Region *region) noexcept;

  void purge_locked(bool deregister) noexcept;
  // Clears kParkable and takes back region's parked references: at once from the caller's own
  // line, else later by reclaim_parked_locked() from the owner's (see SYNCHRONIZATION). Regions
  // whose count then ends go on deferred_.
  void unpark_locked(Region *region) noexcept;
  void reclaim_parked_locked() noexcept;
  // Clears kParkable on every cached region and reclaims what was parked (eviction needs the
  // regions no one really uses). Returns whether any region was parkable.
  bool unpark_all_locked() noexcept;
  void live_insert_locked(Region *region) noexcept;

  // Dropping references. A region whose count reached zero is finished outside mutex_ (on the
  // put path, or after the lock for those collected on deferred_) and pushed on finished_, then
  // unlinked from the live list and retired by reap_finished_locked.
  void release(Region *region) noexcept;
  void release_last(Region *region) noexcept;  // the count reached zero (kDead): ours to end
  void defer_locked(Region *region) noexcept;
  Region *take_deferred_locked() noexcept;
  void finish_all(Region *list) noexcept;
  void finish(Region *region) noexcept;
  void end_registration(Region *region, bool deregister) noexcept;
  void reap_finished_locked() noexcept;
  void retire_batch_locked() noexcept;
  void unlink_live_locked(Region *region) noexcept;
  void collect_garbage() noexcept;
  // Region memory: the epoch domain's reclaim callback (any thread) pushes each retired batch
  // on recycled_; mutex_ holders allocate from free_regions_ and refill it from recycled_ in one
  // exchange.
  Region *allocate_region_locked() noexcept;
  void free_region_locked(Region *region) noexcept;
  static void recycle_regions(void *chain) noexcept;

  char name_[64] = "mrcache";
  mrc_backend_t backend_{};  // the caller's ops, completed with not-supported defaults
  void *backend_ctx_ = nullptr;
  size_t max_regions_ = 0;
  size_t max_bytes_ = 0;
  size_t max_unreleased_ = 0;
  // Set (relaxed) under mutex_ when eviction left the cache past max_regions/max_bytes (every
  // region in use), cleared under mutex_ once it is back within them; read relaxed by put. Stored
  // only when it changes: the line is read by every put.
  std::atomic<bool> over_bound_{false};
  unsigned flags_ = 0;
  bool exact_ = true;  // no MRC_FLAG_ORDERED_UNMAPS: every get probes for unmaps in flight
  size_t verify_pfn_pages_ = 0;
  size_t alignment_ = 4096;
  bool print_stats_ = false;

  uffd::Subscription *consumer_ = nullptr;
  PageTable table_;

  std::mutex mutex_;
  Region *lru_hand_ = nullptr;   // mutex_: the CLOCK hand over the ring of cached regions
  Region *live_head_ = nullptr;  // mutex_: list of every region not yet retired
  size_t table_entries_ = 0;     // mutex_: regions in the table, failures included
  size_t cached_regions_ = 0;    // mutex_: registered regions in the table
  size_t cached_bytes_ = 0;      // mutex_
  Region *deferred_ = nullptr;   // mutex_: count reached zero under the lock
  std::atomic<Region *> garbage_{nullptr};  // last put of invalid regions (max_unreleased)
  std::atomic<uint64_t> garbage_bytes_{0};
  std::atomic<Region *> finished_{nullptr};  // finished, not yet retired (SYNCHRONIZATION)
  // mutex_: unlinked from the live list, retired to the epoch domain in batches (one object
  // per batch).
  static constexpr size_t kRetireBatch = 32;
  static constexpr uint64_t kReapEvery = 8;  // slow-path gets per reap of finished_
  Region *retiring_[kRetireBatch] = {};
  size_t retiring_count_ = 0;

  // A region earns kParkable after this many consecutive fast-path hits by one thread: the
  // reclaim at its removal costs a membarrier, which a region used once should not pay.
  static constexpr uint32_t kPromoteAfter = 8;
  static constexpr size_t kLines = kThreadSlots;
  static_assert(kLines <= Region::kAnyOwner);
  uint64_t lines_to_reclaim_[kLines / 64] = {};  // mutex_: owners' lines marked by unpark_locked
  ParkingLine parking_[kLines];

  ShardedCounters hot_;
  // Slow-path statistics, mutex_. Totals that also fall outside the lock are a mutex_ sum here
  // minus a sharded counter (registered bytes, unreleased bytes).
  struct SlowStats {
    uint64_t gets_slow, hits_slow, misses, merges, unmap_events, invalidations, registrations,
        evictions, registration_failures, uncacheable, purges;
    uint64_t registered_bytes;  // ever registered; minus Counter::EndedBytes = still registered
    uint64_t unreleased_bytes;  // ever left the table referenced; plus Counter::UnreleasedBytes
                                // minus Counter::ReleasedBytes = still waiting
    uint64_t size_histogram[64];
  } slow_{};
  std::atomic<uint64_t> pfn_mismatches_{0};  // counted on the fast path, outside mutex_

  static constexpr size_t kFreeRegionsMax = 4096;  // beyond it, region memory goes back to malloc
  std::atomic<Region *> recycled_{nullptr};
  Region *free_regions_ = nullptr;  // mutex_
  size_t free_count_ = 0;           // mutex_

  Cache *fork_next_ = nullptr;  // the process's list of caches (fork handling)
  friend struct CacheRegistry;
};

}  // namespace mrc
