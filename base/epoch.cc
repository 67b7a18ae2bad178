// SPDX-License-Identifier: BSD-3-Clause
// Epoch-based reclamation; the contract is the SYNCHRONIZATION block in epoch.h.
#include "base/epoch.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>
#include <new>

#include "base/check.h"

namespace mrc {
namespace detail {

constinit thread_local EpochTlsCache tls_epoch_cache
    __attribute__((tls_model("initial-exec"))) = {0, nullptr};
constinit GlobalEpochStorage g_epoch_storage;

struct EpochSlotChunk {
  static constexpr size_t kSlots = 32;
  EpochSlot slots[kSlots];
  // Reclaimer-side state (domain mutex), kept off the readers' lines.
  uint64_t snapshot[kSlots] = {};  // odd: the critical section the grace period waits for
  bool in_use[kSlots] = {};
  std::atomic<EpochSlotChunk *> next{nullptr};
};

struct Retired {
  void *object;
  void (*reclaim)(void *);
};

struct RetiredChunk {
  static constexpr size_t kCapacity = 127;
  RetiredChunk *next = nullptr;
  size_t count = 0;
  Retired items[kCapacity];
};

namespace {

// Reclaim callbacks this thread is running (any domain): synchronize() refuses to wait for them.
constinit thread_local unsigned tls_reclaim_depth = 0;

bool append(RetiredList &list, Retired item) noexcept {
  if (list.head == nullptr || list.head->count == RetiredChunk::kCapacity) {
    auto *chunk = new (std::nothrow) RetiredChunk;
    if (chunk == nullptr) return false;
    chunk->next = list.head;
    list.head = chunk;
  }
  list.head->items[list.head->count++] = item;
  ++list.count;
  return true;
}

void splice(RetiredList &into, RetiredList from) noexcept {
  if (from.head == nullptr) return;
  RetiredChunk *tail = from.head;
  while (tail->next != nullptr) tail = tail->next;
  tail->next = into.head;
  into.head = from.head;
  into.count += from.count;
}

// Spins briefly, then yields, then sleeps: waits here are for other threads' guards, which are
// short, or for a descheduled reader, which a spin would only delay.
class Backoff {
 public:
  void pause() noexcept {
    if (++rounds_ < 64) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield" ::: "memory");
#endif
    } else if (rounds_ < 128) {
      sched_yield();
    } else {
      timespec pause{0, 20'000};
      nanosleep(&pause, nullptr);
    }
  }

 private:
  unsigned rounds_ = 0;
};

bool membarrier_registered() noexcept {
  static const bool registered = [] {
    long commands = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (commands < 0 || (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
    return syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  }();
  return registered;
}

// The slots a thread holds, one per domain it has entered; released at thread exit.
struct ThreadEpochState {
  static constexpr unsigned kMaxDomains = 16;
  struct Entry {
    uint64_t domain_id;
    EpochSlot *slot;
  };
  Entry entries[kMaxDomains] = {};
  unsigned count = 0;
  bool destroyed = false;

  EpochSlot *find(uint64_t domain_id) const noexcept {
    for (unsigned i = 0; i < count; ++i) {
      if (entries[i].domain_id == domain_id) return entries[i].slot;
    }
    return nullptr;
  }
  void prune_dead_domains() noexcept;
  ~ThreadEpochState();
};

thread_local ThreadEpochState tls_state;

}  // namespace

// Every live domain, so that thread exit and fork can reach them, and never touch a dead one.
// Lock order: EpochRegistry::mutex, then a domain's mutex_.
struct EpochRegistry {
  static constinit inline Mutex mutex;
  static constinit inline EpochDomain *live MRC_GUARDED_BY(mutex) = nullptr;  // non-global domains
  static constinit inline std::atomic<uint64_t> next_id{2};

  static EpochDomain *find_locked(uint64_t id) noexcept MRC_REQUIRES(mutex) {
    if (id == g_epoch_storage.domain.id_) return &g_epoch_storage.domain;
    for (EpochDomain *d = live; d != nullptr; d = d->next_live_) {
      if (d->id_ == id) return d;
    }
    return nullptr;
  }

  static void add(EpochDomain *domain) noexcept {
    MutexLock lock(mutex);
    domain->next_live_ = live;
    live = domain;
  }

  // Gives a dead thread's slot back, if its domain still lives.
  static void release_locked(uint64_t id, EpochSlot *slot) noexcept MRC_REQUIRES(mutex) {
    if (EpochDomain *domain = find_locked(id)) domain->release_slot(slot);
  }

  static void remove(EpochDomain *domain) noexcept {
    MutexLock lock(mutex);
    for (EpochDomain **link = &live; *link != nullptr; link = &(*link)->next_live_) {
      if (*link == domain) {
        *link = domain->next_live_;
        return;
      }
    }
  }

  // Prepare runs the handlers in reverse order of registration; registering at load time puts
  // ours last, after handlers (the cache's) that may still retire objects while preparing.
  // The three handlers are exempt (docs/DESIGN.md, "Contracts the compiler checks"): they lock
  // and unlock every live domain's mutex_, a lock per list element, which the analysis cannot
  // name, across calls.
  static void prepare() noexcept MRC_NO_THREAD_SAFETY_ANALYSIS {
    mutex.lock();
    g_epoch_storage.domain.mutex_.lock();
    for (EpochDomain *d = live; d != nullptr; d = d->next_live_) d->mutex_.lock();
  }
  static void parent() noexcept MRC_NO_THREAD_SAFETY_ANALYSIS {
    for (EpochDomain *d = live; d != nullptr; d = d->next_live_) d->mutex_.unlock();
    g_epoch_storage.domain.mutex_.unlock();
    mutex.unlock();
  }
  static void child() noexcept MRC_NO_THREAD_SAFETY_ANALYSIS {
    g_epoch_storage.domain.fork_child_locked();
    for (EpochDomain *d = live; d != nullptr; d = d->next_live_) d->fork_child_locked();
    parent();
  }
};

namespace {

[[maybe_unused]] const int g_fork_handlers_installed =
    pthread_atfork(&EpochRegistry::prepare, &EpochRegistry::parent, &EpochRegistry::child);

void ThreadEpochState::prune_dead_domains() noexcept {
  MutexLock lock(EpochRegistry::mutex);
  unsigned kept = 0;
  for (unsigned i = 0; i < count; ++i) {
    if (EpochRegistry::find_locked(entries[i].domain_id) != nullptr) entries[kept++] = entries[i];
  }
  count = kept;
}

ThreadEpochState::~ThreadEpochState() {
  tls_epoch_cache = {0, nullptr};
  destroyed = true;
  MutexLock lock(EpochRegistry::mutex);
  for (unsigned i = 0; i < count; ++i) {
    EpochRegistry::release_locked(entries[i].domain_id, entries[i].slot);
  }
  count = 0;
}

}  // namespace
}  // namespace detail

using detail::EpochSlot;
using detail::EpochSlotChunk;
using detail::RetiredList;

EpochDomain::EpochDomain(EpochBarrier barrier) noexcept
    : id_(detail::EpochRegistry::next_id.fetch_add(1, std::memory_order_relaxed)),
      force_fences_(barrier == EpochBarrier::Fences) {
  detail::EpochRegistry::add(this);
}

EpochDomain::~EpochDomain() {
  detail::EpochRegistry::remove(this);
  RetiredList all;
  {
    MutexLock lock(mutex_);
    for (EpochSlotChunk *c = chunks_.load(std::memory_order_acquire); c != nullptr;
         c = c->next.load(std::memory_order_acquire)) {
      for (const EpochSlot &slot : c->slots) {
        MRC_CHECK((slot.seq.load(std::memory_order_acquire) & 1) == 0);  // a guard outlives us
      }
    }
    detail::splice(all, current_);
    detail::splice(all, waiting_);
    current_ = waiting_ = {};
    if (all.count != 0) reclaiming_.fetch_add(1, std::memory_order_relaxed);
  }
  reclaim(all);
  for (detail::Backoff backoff; reclaiming_.load(std::memory_order_acquire) != 0;) {
    backoff.pause();
  }
  for (EpochSlotChunk *c = chunks_.load(std::memory_order_relaxed); c != nullptr;) {
    EpochSlotChunk *next = c->next.load(std::memory_order_relaxed);
    delete c;
    c = next;
  }
}

// ---- reader registration ---------------------------------------------------------------------

EpochSlot *EpochDomain::register_thread() noexcept {
  detail::ThreadEpochState &state = detail::tls_state;
  EpochSlot *slot = state.find(id_);
  if (slot == nullptr) {
    slot = acquire_slot();
    if (!state.destroyed) {  // a guard made by another thread_local's destructor: never released
      if (state.count == detail::ThreadEpochState::kMaxDomains) state.prune_dead_domains();
      MRC_CHECK(state.count < detail::ThreadEpochState::kMaxDomains);  // too many live domains
      state.entries[state.count++] = {id_, slot};
    }
  }
  detail::tls_epoch_cache = {id_, slot};
  return slot;
}

EpochSlot *EpochDomain::find_own_slot() const noexcept {
  const detail::EpochTlsCache &cache = detail::tls_epoch_cache;
  if (cache.domain_id == id_) return cache.slot;
  return detail::tls_state.find(id_);
}

bool EpochDomain::in_guard() const noexcept {
  const EpochSlot *slot = find_own_slot();
  return slot != nullptr && slot->depth != 0;
}

EpochSlot *EpochDomain::acquire_slot() noexcept {
  MutexLock lock(mutex_);
  decide_mode_locked();
  EpochSlotChunk *last = nullptr;
  for (EpochSlotChunk *c = chunks_.load(std::memory_order_relaxed); c != nullptr;
       c = c->next.load(std::memory_order_relaxed)) {
    for (size_t i = 0; i < EpochSlotChunk::kSlots; ++i) {
      if (!c->in_use[i]) {
        c->in_use[i] = true;
        ++threads_;
        return &c->slots[i];
      }
    }
    last = c;
  }
  auto *chunk = new (std::nothrow) EpochSlotChunk;
  MRC_CHECK(chunk != nullptr);  // no memory for a reader slot: nothing safe left to do
  chunk->in_use[0] = true;
  ++threads_;
  // Release: wait_for_readers() walks the chain without the mutex.
  if (last == nullptr) {
    chunks_.store(chunk, std::memory_order_release);
  } else {
    last->next.store(chunk, std::memory_order_release);
  }
  return &chunk->slots[0];
}

void EpochDomain::release_slot(EpochSlot *slot) noexcept {
  MutexLock lock(mutex_);
  for (EpochSlotChunk *c = chunks_.load(std::memory_order_relaxed); c != nullptr;
       c = c->next.load(std::memory_order_relaxed)) {
    if (slot < c->slots || slot >= c->slots + EpochSlotChunk::kSlots) continue;
    // A thread that ends inside a guard (pthread_exit) can no longer read anything.
    if (slot->depth != 0) {
      slot->depth = 0;
      slot->seq.store(slot->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    c->in_use[slot - c->slots] = false;
    --threads_;
    return;
  }
}

size_t EpochDomain::registered_threads() const noexcept {
  MutexLock lock(mutex_);
  return threads_;
}

size_t EpochDomain::slot_capacity() const noexcept {
  MutexLock lock(mutex_);
  size_t slots = 0;
  for (EpochSlotChunk *c = chunks_.load(std::memory_order_relaxed); c != nullptr;
       c = c->next.load(std::memory_order_relaxed)) {
    slots += EpochSlotChunk::kSlots;
  }
  return slots;
}

void EpochDomain::decide_mode() noexcept {
  MutexLock lock(mutex_);
  decide_mode_locked();
}

void EpochDomain::decide_mode_locked() noexcept {
  if (mode_decided_) return;
  mode_decided_ = true;
  if (kEpochMembarrierAllowed && !force_fences_ && detail::membarrier_registered()) {
    light_barrier_.store(true, std::memory_order_relaxed);
  }
}

void EpochDomain::fork_child_locked() noexcept {
  const detail::ThreadEpochState &state = detail::tls_state;
  const EpochSlot *own = state.find(id_);
  for (EpochSlotChunk *c = chunks_.load(std::memory_order_relaxed); c != nullptr;
       c = c->next.load(std::memory_order_relaxed)) {
    for (size_t i = 0; i < EpochSlotChunk::kSlots; ++i) {
      EpochSlot &slot = c->slots[i];
      if (!c->in_use[i] || &slot == own) continue;
      slot.depth = 0;
      uint64_t seq = slot.seq.load(std::memory_order_relaxed);
      if ((seq & 1) != 0) slot.seq.store(seq + 1, std::memory_order_relaxed);
      c->in_use[i] = false;
      --threads_;
    }
  }
  // Batches other threads were reclaiming are lost with those threads (leaked in the child).
  if (detail::tls_reclaim_depth == 0) {
    reclaiming_.store(0, std::memory_order_relaxed);
    pending_.store(current_.count + waiting_.count, std::memory_order_relaxed);
  }
}

// ---- grace periods ---------------------------------------------------------------------------

void EpochDomain::heavy_barrier() const noexcept {
  if (light_barrier_.load(std::memory_order_relaxed)) {
    long rc = syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    MRC_CHECK(rc == 0);  // registered at start-up; readers rely on it
  } else {
    detail::epoch_full_fence();  // pairs with the fence in enter()
  }
}

void EpochDomain::wait_for_readers() const noexcept {
  MRC_CHECK(!in_guard());  // would wait for our own critical section
  heavy_barrier();
  for (EpochSlotChunk *c = chunks_.load(std::memory_order_acquire); c != nullptr;
       c = c->next.load(std::memory_order_acquire)) {
    for (const EpochSlot &slot : c->slots) {
      const uint64_t seq = slot.seq.load(std::memory_order_acquire);
      if ((seq & 1) == 0) continue;
      for (detail::Backoff backoff; slot.seq.load(std::memory_order_acquire) == seq;) {
        backoff.pause();
      }
    }
  }
}

void EpochDomain::start_grace_period_locked() noexcept {
  waiting_ = current_;
  current_ = {};
  heavy_barrier();
  for (EpochSlotChunk *c = chunks_.load(std::memory_order_relaxed); c != nullptr;
       c = c->next.load(std::memory_order_relaxed)) {
    for (size_t i = 0; i < EpochSlotChunk::kSlots; ++i) {
      const uint64_t seq = c->slots[i].seq.load(std::memory_order_acquire);
      c->snapshot[i] = (seq & 1) != 0 ? seq : 0;
    }
  }
  grace_period_active_ = true;
}

bool EpochDomain::grace_period_done_locked() noexcept {
  for (EpochSlotChunk *c = chunks_.load(std::memory_order_relaxed); c != nullptr;
       c = c->next.load(std::memory_order_relaxed)) {
    for (size_t i = 0; i < EpochSlotChunk::kSlots; ++i) {
      if (c->snapshot[i] == 0) continue;
      // Acquire: pairs with the reader's release store that ended that critical section.
      if (c->slots[i].seq.load(std::memory_order_acquire) == c->snapshot[i]) return false;
      c->snapshot[i] = 0;
    }
  }
  return true;
}

RetiredList EpochDomain::advance_locked(bool force) noexcept {
  RetiredList done;
  if (grace_period_active_ && grace_period_done_locked()) {
    done = waiting_;
    waiting_ = {};
    grace_period_active_ = false;
  }
  if (!grace_period_active_ && current_.count != 0 && (force || current_.count >= kBatch)) {
    start_grace_period_locked();
    if (grace_period_done_locked()) {  // the common case: nobody inside a guard right now
      detail::splice(done, waiting_);
      waiting_ = {};
      grace_period_active_ = false;
    }
  }
  if (done.count != 0) reclaiming_.fetch_add(1, std::memory_order_relaxed);
  return done;
}

void EpochDomain::reclaim(RetiredList list) noexcept {
  if (list.count == 0) return;
  ++detail::tls_reclaim_depth;
  for (detail::RetiredChunk *c = list.head; c != nullptr;) {
    for (size_t i = 0; i < c->count; ++i) c->items[i].reclaim(c->items[i].object);
    detail::RetiredChunk *next = c->next;
    delete c;
    c = next;
  }
  --detail::tls_reclaim_depth;
  pending_.fetch_sub(list.count, std::memory_order_relaxed);
  // Release: synchronize() (acquire) sees the callbacks' effects.
  reclaiming_.fetch_sub(1, std::memory_order_release);
}

// ---- the public operations -------------------------------------------------------------------

void EpochDomain::retire(void *object, void (*reclaim_fn)(void *)) noexcept {
  retire_many(&object, 1, reclaim_fn);
}

void EpochDomain::retire_many(void *const *objects, size_t count,
                              void (*reclaim_fn)(void *)) noexcept {
  MRC_DASSERT(reclaim_fn != nullptr);
  RetiredList done;
  size_t queued = 0;
  {
    MutexLock lock(mutex_);
    decide_mode_locked();
    while (queued < count && detail::append(current_, {objects[queued], reclaim_fn})) ++queued;
    if (queued != 0) {
      pending_.fetch_add(queued, std::memory_order_relaxed);
      if (current_.count >= kBatch) done = advance_locked(false);
    }
  }
  if (queued < count) {
    // No memory to remember the objects: wait out the readers here instead. Inside a guard of
    // this domain that would wait for ourselves.
    MRC_CHECK(!in_guard());
    wait_for_readers();
    for (size_t i = queued; i < count; ++i) reclaim_fn(objects[i]);
  }
  reclaim(done);
}

void EpochDomain::poll() noexcept {
  RetiredList done;
  {
    MutexLock lock(mutex_);
    decide_mode_locked();
    done = advance_locked(true);
  }
  reclaim(done);
}

void EpochDomain::synchronize() noexcept {
  MRC_CHECK(!in_guard());                     // would wait for our own critical section
  MRC_CHECK(detail::tls_reclaim_depth == 0);  // would wait for our own callbacks
  RetiredList all;
  {
    MutexLock lock(mutex_);
    decide_mode_locked();
    detail::splice(all, current_);
    detail::splice(all, waiting_);
    current_ = waiting_ = {};
    grace_period_active_ = false;
    if (all.count != 0) reclaiming_.fetch_add(1, std::memory_order_relaxed);
  }
  wait_for_readers();
  reclaim(all);
  for (detail::Backoff backoff; reclaiming_.load(std::memory_order_acquire) != 0;) {
    backoff.pause();
  }
}

}  // namespace mrc
