// SPDX-License-Identifier: BSD-3-Clause
// Epoch-based reclamation: memory that lock-free readers may still be looking at is freed only
// after every reader that could have seen it has left its critical section.
//
// SYNCHRONIZATION (why each rule holds: docs/DESIGN.md, "Reclamation")
//   1. Readers: any thread, inside an EpochGuard (nestable). They only load shared data; the
//      fast path takes no lock and makes no system call (a first guard registers a slot).
//   2. Retirers: any thread but the uffd monitor. Unlink the object, so that no reader starting
//      later can reach it, then retire() it.
//   3. Reclaim callbacks run on the thread calling retire(), poll() or synchronize(), outside the
//      domain mutex; they may retire() again, and take no lock a retiring thread may hold.
//   4. A slot's seq is odd inside a guard, even outside, a new odd value per critical section;
//      only its owner writes it (and touches depth at all). Reclaimers load seq.
//   5. The domain mutex guards the slot registry (chunks, in_use flags, grace-period snapshots)
//      and the retired batches; chunks are appended by a release store of `next`, never freed
//      before the domain, and walked without the mutex (acquire).
//   6. Reader entry: seq odd, then the barrier (compiler-only with membarrier, else a seq_cst
//      fence); a grace period: the heavy barrier (membarrier, or the fence), then reads all slots.
//   7. Reader exit: seq even (release), paired with the reclaimer's acquire load of seq.
//   8. The barrier mode is chosen once per domain, under the mutex, before the first slot is
//      handed out, and never changes.
//   9. Never call synchronize() inside a guard of the same domain (checked).
//  10. Fork: prepare takes the registry's and every domain's mutex; the child frees the slots of
//      the threads that did not fork.
//  11. Guard entry and exit are wait-free; retire() and poll() block only on the domain mutex and
//      never wait for readers; synchronize() is only as live as the longest guard.
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

// One reader's slot; see the SYNCHRONIZATION block above (rules 4 and 7).
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
