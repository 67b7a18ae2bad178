// SPDX-License-Identifier: BSD-3-Clause
// Epoch-based reclamation: memory that lock-free readers may still be looking at is freed only
// after every reader that could have seen it has left its critical section.
//
// SYNCHRONIZATION
//
// Actors.
//   Readers: any thread, inside an EpochGuard (nestable, any number per thread). A reader only
//     loads shared data; it never blocks, takes no lock and makes no system call on the fast
//     path (the first guard of a thread in a domain registers a slot under the domain mutex).
//   Retirers: any thread except the uffd monitor (reclaim callbacks may free registered memory,
//     and an munmap on the monitor thread would wait for the monitor itself). A retirer first
//     unlinks an object so that no reader starting later can reach it, then calls retire().
//   Reclaimers: whichever thread calls retire(), poll() or synchronize(); reclaim callbacks run on
//     that thread, outside the domain mutex, and may call retire() again. They must not take a
//     lock the retiring thread may hold (retire() can run callbacks of earlier objects).
//
// Reader slots (detail::EpochSlot, one cache line each, owned by one thread at a time).
//   seq: even = outside any guard, odd = inside one. Only the owner writes it; reclaimers read
//     it. The owner's outermost guard stores seq+1 on entry and seq+1 again on exit, so every
//     critical section has a distinct odd value: a reclaimer that saw value v and later sees any
//     other value knows that critical section v has ended (no ABA: the count never repeats).
//   depth: nesting count, touched only by the owner.
//   The slot registry (chunks of slots, in_use flags, grace-period snapshots) is guarded by the
//   domain mutex; chunks are appended with a release store of `next` and never freed before the
//   domain, so wait_for_readers() walks them without the mutex (acquire loads).
//   A thread gets a slot lazily on its first guard and gives it back from a thread_local
//   destructor at thread exit; a later thread reuses it (its seq keeps counting up).
//
// The barrier pair (the heart of it).
//   Reader entry: seq.store(odd) then a barrier, then the reader's loads of shared data.
//   Reclaimer: objects are unlinked before retire(); a grace period starts with a heavy barrier,
//     then reads every slot (acquire).
//   Either the reader's odd store is visible to the reclaimer's scan (it waits for that critical
//   section to end), or the reader's later loads come after the heavy barrier and see the unlink
//   (the object is unreachable to it). Which barriers:
//   - membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) mode (registered once per process with
//     MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED): the reader's barrier is compiler-only
//     (atomic_signal_fence) and its store relaxed; the system call makes every running thread of
//     the process execute a full memory barrier, which orders the reader's store before its loads
//     whenever that ordering matters. About 0.3 us per grace period here, paid by the reclaimer.
//   - fence mode (membarrier unavailable, or built with MRC_TSAN: ThreadSanitizer cannot see
//     membarrier): a seq_cst fence on both sides, the reader's store a release.
//   The mode is chosen once per domain, under the mutex, before the first slot is handed out, and
//   never changes, so every reader fast path agrees with the reclaimer.
//   Reader exit: seq.store(even, release); pairs with the reclaimer's acquire load of seq, so all
//   the reader's loads happen before the reclaimer frees anything it saw.
//
// Retired objects.
//   retire() appends (object, reclaim) to the current batch under the mutex. When the batch
//   reaches kBatch objects (and on poll()), a grace period starts for it: heavy barrier, then a
//   snapshot of every odd slot. It completes when each snapshotted slot has changed; usually no
//   reader is inside a guard and it completes at once. One grace period is in flight at a time;
//   what is retired meanwhile waits in the next batch, so at most two batches plus whatever is
//   retired during the longest guard are pending. retire() and poll() never wait for readers.
//   synchronize() waits (spinning, then yielding) for every reader inside a guard at the time of
//   the call; it must not be called inside a guard of the same domain (checked).
//
// Fork: prepare takes the registry and every domain mutex; the child frees every slot that the
//   forking thread does not own (those threads do not exist in the child), so grace periods in the
//   child never wait for them.
//
// Progress: guard entry and exit are wait-free. retire() and poll() are blocking only on the
//   domain mutex (held for O(threads) work, never while waiting for a reader). synchronize()
//   waits for readers and is therefore only as live as the longest guard.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/mutex.h"

namespace mrc {

class EpochDomain;
class EpochGuard;

// How a domain's readers and reclaimers order the reader's slot store against its loads.
enum class EpochBarrier {
  Auto,    // membarrier(2) when the kernel has it (and not under MRC_TSAN), else fences
  Fences,  // seq_cst fences on both sides (tests exercise this path everywhere)
};

namespace detail {

// One reader's slot; see the SYNCHRONIZATION block above.
struct alignas(64) EpochSlot {
  std::atomic<uint64_t> seq{0};
  uint32_t depth = 0;
};

// The fast path's per-thread cache: the slot of the domain this thread used last. Trivial and
// constant-initialised, so that reading it is a plain TLS load with no init guard or wrapper.
struct EpochTlsCache {
  uint64_t domain_id;
  EpochSlot *slot;
};
extern constinit thread_local EpochTlsCache tls_epoch_cache
    __attribute__((tls_model("initial-exec")));

struct EpochSlotChunk;
struct RetiredChunk;
struct EpochRegistry;
struct GlobalEpochStorage;
struct RetiredList {
  RetiredChunk *head = nullptr;
  size_t count = 0;
};

}  // namespace detail

// A reclamation domain: a set of reader slots and the objects waiting for them. The process has
// one (epoch_domain()), shared by the page table and the cache; tests make their own.
class EpochDomain {
 public:
  // Objects per grace period, and the batch size that starts one from retire().
  static constexpr size_t kBatch = 64;

  explicit EpochDomain(EpochBarrier barrier = EpochBarrier::Auto) noexcept;
  // REQUIRES: no thread is inside a guard of this domain. Reclaims every pending object.
  ~EpochDomain();
  EpochDomain(const EpochDomain &) = delete;
  EpochDomain &operator=(const EpochDomain &) = delete;

  // Calls reclaim(object) once every guard that was active at the time of the call has ended.
  // The object must already be unreachable for readers that start after this call. Never waits
  // for readers; may run the callbacks of earlier objects on this thread.
  void retire(void *object, void (*reclaim)(void *)) noexcept;
  // retire() for each of objects[0, count), under one acquisition of the domain's mutex.
  void retire_many(void *const *objects, size_t count, void (*reclaim)(void *)) noexcept;

  // Reclaims what is safe to reclaim and starts a grace period for the rest; never waits.
  void poll() noexcept;

  // Returns once everything retired before the call has been reclaimed (callbacks included,
  // whichever thread runs them). REQUIRES (MRC_CHECK): the calling thread is neither inside a
  // guard of this domain nor inside a reclaim callback.
  void synchronize() noexcept;

  // Returns once every guard that was active at the call has ended (a heavy barrier, then a
  // wait on each reader inside a guard). Every guard therefore either ended before the return
  // (its stores visible to the caller) or sees every store the caller made before the call:
  // the pairing that lets readers write thread-owned data with plain stores inside a guard.
  // REQUIRES: not inside a guard of this domain (checked).
  void wait_for_readers() const noexcept;

  // Chooses the barrier mode now rather than at the first guard: registering for membarrier
  // waits for an RCU grace period once the process has a second thread (milliseconds), and costs
  // nothing before. Creating a cache calls it before the monitor's thread starts, so that no get
  // pays it.
  void decide_mode() noexcept;

  // Objects retired and not yet reclaimed.
  size_t pending() const noexcept { return pending_.load(std::memory_order_relaxed); }
  // Threads holding a reader slot (registered and not yet exited), and slots allocated.
  size_t registered_threads() const noexcept;
  size_t slot_capacity() const noexcept;
  // True when readers use a compiler-only barrier and the reclaimer membarrier(2).
  bool uses_membarrier() const noexcept { return light_barrier_.load(std::memory_order_relaxed); }
  // Whether the calling thread is inside a guard of this domain.
  bool in_guard() const noexcept;

 private:
  friend class EpochGuard;
  friend struct detail::EpochRegistry;
  friend struct detail::GlobalEpochStorage;
  struct GlobalTag {};
  constexpr explicit EpochDomain(GlobalTag) noexcept;

  detail::EpochSlot *enter() noexcept;
  static void leave(detail::EpochSlot *slot) noexcept;

  detail::EpochSlot *register_thread() noexcept;
  detail::EpochSlot *find_own_slot() const noexcept;
  detail::EpochSlot *acquire_slot() noexcept;
  void release_slot(detail::EpochSlot *slot) noexcept;
  void decide_mode_locked() noexcept MRC_REQUIRES(mutex_);
  void heavy_barrier() const noexcept;
  bool grace_period_done_locked() noexcept MRC_REQUIRES(mutex_);
  void start_grace_period_locked() noexcept MRC_REQUIRES(mutex_);
  detail::RetiredList advance_locked(bool force) noexcept MRC_REQUIRES(mutex_);
  void reclaim(detail::RetiredList list) noexcept;
  void fork_child_locked() noexcept MRC_REQUIRES(mutex_);

  // Read by every reader fast path: kept on a line of their own, never written after start-up.
  alignas(64) uint64_t id_;
  std::atomic<bool> light_barrier_{false};

  // GUARDED_BY: docs/DESIGN.md, "Contracts the compiler checks". The chunks' in_use and
  // snapshot are under it too (another struct: comments only).
  alignas(64) mutable Mutex mutex_;
  bool force_fences_ = false;  // immutable
  bool mode_decided_ MRC_GUARDED_BY(mutex_) = false;
  bool grace_period_active_ MRC_GUARDED_BY(mutex_) = false;
  size_t threads_ MRC_GUARDED_BY(mutex_) = 0;           // slots in use
  detail::RetiredList current_ MRC_GUARDED_BY(mutex_);  // retired since the last grace period
  detail::RetiredList waiting_ MRC_GUARDED_BY(mutex_);  // the batch of the grace period in flight
  std::atomic<size_t> pending_{0};     // objects in current_, waiting_ or being reclaimed
  std::atomic<size_t> reclaiming_{0};  // batches detached whose callbacks still run
  EpochDomain *next_live_ = nullptr;   // EpochRegistry::mutex
  // First chunk of slots; appended under mutex_ with release stores, walked without it.
  std::atomic<detail::EpochSlotChunk *> chunks_{nullptr};
};

namespace detail {
// Storage of the process-wide domain: constant-initialised (usable from any static constructor),
// never destroyed (objects still pending at exit stay reachable, and late retirers stay safe).
struct GlobalEpochStorage {
  union {
    EpochDomain domain;
  };
  constexpr GlobalEpochStorage() noexcept : domain(EpochDomain::GlobalTag{}) {}
  ~GlobalEpochStorage() {}
};
extern constinit GlobalEpochStorage g_epoch_storage;
}  // namespace detail

// The process-wide domain, shared by the page table and the cache.
inline EpochDomain &epoch_domain() noexcept { return detail::g_epoch_storage.domain; }

// A reader critical section. Cheap (a TLS load, a compare, two stores to a thread-owned line),
// nestable, usable on any thread. Pointers read from structures protected by the domain stay
// valid until the outermost guard of the thread ends.
class EpochGuard {
 public:
  explicit EpochGuard(EpochDomain &domain = epoch_domain()) noexcept : slot_(domain.enter()) {}
  ~EpochGuard() { EpochDomain::leave(slot_); }
  EpochGuard(const EpochGuard &) = delete;
  EpochGuard &operator=(const EpochGuard &) = delete;

 private:
  detail::EpochSlot *slot_;
};

// ---- inline fast path -----------------------------------------------------------------------

#if defined(MRC_TSAN)
inline constexpr bool kEpochMembarrierAllowed = false;
#else
inline constexpr bool kEpochMembarrierAllowed = true;
#endif

namespace detail {
// A real seq_cst fence. GCC 12 warns that ThreadSanitizer does not model fences; it does not
// need to: every happens-before edge it must see comes from the slot's release/acquire pair.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtsan"
#endif
inline void epoch_full_fence() noexcept { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif
}  // namespace detail

inline detail::EpochSlot *EpochDomain::enter() noexcept {
  const detail::EpochTlsCache &cache = detail::tls_epoch_cache;
  detail::EpochSlot *slot =
      __builtin_expect(cache.domain_id == id_, 1) ? cache.slot : register_thread();
  if (slot->depth++ == 0) {
    const uint64_t odd = slot->seq.load(std::memory_order_relaxed) + 1;
    if (kEpochMembarrierAllowed && light_barrier_.load(std::memory_order_relaxed)) {
      slot->seq.store(odd, std::memory_order_relaxed);
      // The reclaimer's membarrier supplies the hardware barrier; keep the compiler from
      // moving the reader's loads above the store.
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      slot->seq.store(odd, std::memory_order_release);
      detail::epoch_full_fence();  // pairs with the fence in heavy_barrier()
    }
  }
  return slot;
}

inline void EpochDomain::leave(detail::EpochSlot *slot) noexcept {
  if (--slot->depth == 0) {
    // Pairs with the reclaimer's acquire load of seq: our loads happen before any free.
    slot->seq.store(slot->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
}

constexpr EpochDomain::EpochDomain(GlobalTag) noexcept : id_(1) {}

}  // namespace mrc
