// SPDX-License-Identifier: BSD-3-Clause
// A region: one registration of [start, end) in a cache, its flags and its reference count, and
// its life from allocation to recycling: RegionState, one state per row of the table in
// docs/DESIGN.md, "The life of a region" (where it sits, what marks it, which call moves it on).
//
// 1. Region::state() reads the state from the flags and the count; the states they cannot show
//    (Deferred to Retired, and Free) are recorded by enter(), in debug builds only.
// 2. Every call that moves a region checks, in debug builds, that it is in a state the move
//    leaves (expect()); a move the table lacks aborts. Release builds compile neither.
// 3. Fields marked "mutex_" are the cache's mutex_ holder's; flags are written under mutex_ or by
//    the one thread that finishes the region (cache.h, rule 3); the count is atomic.
// 4. A count marked kDead is never acquired again: the thread that set it ends the region.
// 5. Every move runs on an application thread inside a cache call, except
//    Cache::recycle_regions (a thread running the epoch domain's reclamation) and
//    CacheRegistry::after_in_child (a fork child's only thread); the monitor never touches one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "base/check.h"
#include "mrcache/mrcache.h"
#include "pgtable/pgtable.h"

struct mrc_region {};  // the C API's opaque handle; Region derives from it

namespace mrc {

class Cache;

// A completion callback of mrc_invalidate, run once after deregistration.
struct InvalidateCallback {
  void (*done)(void *);
  void *arg;
  InvalidateCallback *next;
};

// The states of the table in docs/DESIGN.md, "The life of a region", in its order.
enum class RegionState : uint8_t {
  Free,
  Failed,
  Cached,
  Parkable,
  Uncached,
  Invalidated,
  Deferred,
  Batched,
  Finished,
  Retiring,
  Retired,
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
                            // an uncached region waiting on dereg_batch_)
    kParkable = 1U << 8,    // in the table, and its owner's puts may park (parking_lines.h)
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
  // Gets served after the one that registered it, up to kMaxUses (then no more stores: a hot
  // region's line is only read). Relaxed, not an atomic add: a hit lost to a race only makes
  // the churn learner's estimate a little low (docs/DESIGN.md, "Churn").
  static constexpr uint8_t kMaxUses = 255;
  std::atomic<uint8_t> uses{0};
  // Registrations merged into this one, itself included (up to 255): each was watched, and each
  // may have been a mapping of its own, whose unmap waits for the monitor. With its uses and
  // watch_ticks, summed over what it absorbed, it is what the churn learner weighs (mutex_).
  uint8_t registrations = 0;

 private:
#ifndef NDEBUG
  // Debug builds: the state since the count ended (Deferred to Retired), or Free once the
  // storage went back to the pool, which no flag shows (enter()); kNotEnded before. In the byte
  // of padding after `registrations`: the size is the same in every build.
  static constexpr uint8_t kNotEnded = 0xff;
  uint8_t dead_state_ = kNotEnded;
#endif

 public:
  unsigned prot = 0;
  // The costs the churn learner weighs (os::ticks(), saturated), measured by register_locked:
  // the watches it and the regions it absorbed made, and the rest of its own registration
  // (backend reg included).
  uint32_t watch_ticks = 0;
  void *handle = nullptr;
  uint64_t key = 0;
  mrc_status_t failure = MRC_OK;  // for kFailed entries
  uint32_t register_ticks = 0;
  Cache *cache = nullptr;
  Region *lru_prev = nullptr;  // mutex_: the LRU ring (cached regions)
  Region *lru_next = nullptr;
  Region *live_prev = nullptr;  // mutex_: every region of the cache until it is retired
  Region *live_next = nullptr;
  Region *gc_next = nullptr;  // the deferred, dereg-batch and finished stacks, then the region pool
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
    uses.store(0, std::memory_order_relaxed);
    registrations = 0;
#ifndef NDEBUG
    dead_state_ = kNotEnded;
#endif
    prot = 0;
    watch_ticks = 0;
    handle = nullptr;
    key = 0;
    failure = MRC_OK;
    register_ticks = 0;
    cache = nullptr;
    lru_prev = lru_next = live_prev = live_next = gc_next = nullptr;
    callbacks = nullptr;
    pfns = nullptr;
    pfn_count = 0;
  }
  size_t length() const noexcept { return end - start; }
  // The state of the table, read from what marks it (relaxed loads: for checks and tests, by a
  // thread the region cannot change under). Flags 0 is fresh or reset storage. Once the count
  // is kDead only the stack a region is on tells Deferred, Batched, Finished, Retiring, Retired
  // and recycled Free storage apart: a debug build records those moves (enter()); a release
  // build goes on reading the flags, which show the state the count ended in (Invalidated or
  // Uncached; stale ones for recycled storage).
  RegionState state() const noexcept {
#ifndef NDEBUG
    if (dead_state_ != kNotEnded) return static_cast<RegionState>(dead_state_);
#endif
    const uint32_t marks = flags.load(std::memory_order_relaxed);
    if (marks == 0) return RegionState::Free;
    if ((marks & kUncached) != 0) return RegionState::Uncached;
    if ((marks & kInTable) == 0) return RegionState::Invalidated;
    if ((marks & kFailed) != 0) return RegionState::Failed;
    return (marks & kParkable) != 0 ? RegionState::Parkable : RegionState::Cached;
  }
  // A transition's check, debug builds only: aborts, naming the state, unless the region is in
  // one of `from` (the table's state before the move, or after it where the move is a store),
  // reporting the caller's line. Release builds compile nothing: not even state() is read.
  void expect(std::initializer_list<RegionState> from, const char *file = __builtin_FILE(),
              int line = __builtin_LINE()) const noexcept {
#ifndef NDEBUG
    const RegionState now = state();
    for (const RegionState allowed : from) {
      if (allowed == now) return;
    }
    static constexpr const char *kUnexpected[] = {
        "region in state Free",     "region in state Failed",   "region in state Cached",
        "region in state Parkable", "region in state Uncached", "region in state Invalidated",
        "region in state Deferred", "region in state Batched",  "region in state Finished",
        "region in state Retiring", "region in state Retired",
    };
    detail::check_failed(kUnexpected[static_cast<size_t>(now)], file, line,
                         "Region::expect (a move the state table does not have)");
#else
    (void)from;
    (void)file;
    (void)line;
#endif
  }
  // A move into a state the flags do not show (Deferred to Retired, after the count ended; Free,
  // storage back in the pool). Debug builds record it; release builds compile nothing.
  void enter(RegionState to) noexcept {
#ifndef NDEBUG
    MRC_DASSERT(to == RegionState::Free || (refcount.load(std::memory_order_relaxed) & kDead) != 0);
    dead_state_ = static_cast<uint8_t>(to);
#else
    (void)to;
#endif
  }
  // A get served by this region (fast or slow path): the CLOCK bit, and one more use.
  void mark_used() noexcept {
    if (!referenced.load(std::memory_order_relaxed)) {
      referenced.store(true, std::memory_order_relaxed);
    }
    const uint8_t used = uses.load(std::memory_order_relaxed);
    if (used < kMaxUses) uses.store(used + 1, std::memory_order_relaxed);
  }
  bool has(uint32_t flag) const noexcept {
    return (flags.load(std::memory_order_acquire) & flag) != 0;
  }
  // Under mutex_, or by the thread finishing the region: the only writers (rule 3).
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
  // How a drop of one reference ended (drop()).
  enum class Drop {
    Kept,     // others still hold references
    Last,     // the caller dropped the last one and must retire the region (kDead is set)
    Refused,  // the caller held none: nothing changed (see drop())
  };
  // Drops one reference. Last for the one caller that dropped the last reference; that costs one
  // locked instruction too: 1 -> kDead directly. When it returns Kept and `left` is given, *left
  // is the count this drop left (references of others, which may be gone by the time the caller
  // reads it).
  //
  // Refused, with the count as it was, when the drop would take the count below what others
  // provably hold: the table's own reference (kInTable with a count of 1: a second mrc_put of one
  // reference would otherwise end the registration the page table still hands out), a count
  // already zero, or a dead region. A legitimate drop is never refused: kInTable means the table
  // holds one reference besides the caller's, and remove_locked clears kInTable before it drops
  // the table's reference, so a drop that reads that decrement (acquire) sees the flag clear.
  // The check costs the hit path nothing: the comparison that tells "last reference" from "others
  // hold some" is one signed comparison with 2 on the loaded count (and on the decrement's old
  // value) instead of an equality with 1 (kDead is the sign bit, so a dead count is below 2
  // too); the flag is read only on the last-reference branch. Racing double puts can
  // still be refused in place of another thread's legitimate put; the count then stays right.
  Drop drop(uint64_t *left = nullptr) noexcept {
    uint64_t seen = refcount.load(std::memory_order_relaxed);
    if (__builtin_expect(static_cast<int64_t>(seen) < 2, 0)) {  // 0, 1 or dead: look closer
      if (seen != 1) return Drop::Refused;
      // Again with acquire (a load, not a fence: ThreadSanitizer does not model fences): a 1 left
      // by the remover's release decrement (remove_locked) shows its kInTable clear. Any other
      // value goes on to the decrement, which checks again.
      seen = refcount.load(std::memory_order_acquire);
      if (seen == 1) {
        if ((flags.load(std::memory_order_relaxed) & kInTable) != 0) return Drop::Refused;
        if (refcount.compare_exchange_strong(seen, kDead, std::memory_order_acq_rel,
                                             std::memory_order_relaxed)) {
          return Drop::Last;
        }
      }
    }
    const uint64_t before = refcount.fetch_sub(1, std::memory_order_acq_rel);
    if (__builtin_expect(static_cast<int64_t>(before) >= 2, 1)) {  // others hold references
      if (left != nullptr) *left = before - 1;
      return Drop::Kept;
    }
    if (before == 1 && (flags.load(std::memory_order_relaxed) & kInTable) == 0) {
      if (left != nullptr) *left = 0;
      uint64_t zero = 0;
      return refcount.compare_exchange_strong(zero, kDead, std::memory_order_acq_rel,
                                              std::memory_order_relaxed)
                 ? Drop::Last
                 : Drop::Kept;
    }
    // Only a racing misuse gets here (the count changed between the load and the decrement):
    // give the reference back.
    refcount.fetch_add(1, std::memory_order_relaxed);
    return Drop::Refused;
  }
  // drop() for the cache's own references (the table's, a parked one): true for Last. A parked
  // reference that a second put parked without holding it is Refused, and so harmless.
  bool drop_reference(uint64_t *left = nullptr) noexcept { return drop(left) == Drop::Last; }
};

static_assert(sizeof(Region) == 17 * sizeof(void *),
              "a field was added: reset it in Region::reset()");

}  // namespace mrc
