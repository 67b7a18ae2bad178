// SPDX-License-Identifier: BSD-3-Clause
// The public monitor (include/mrcache/monitor.h): one runtime's subscriptions to the process-wide
// userfaultfd monitor, the exact validity check of its hits, and the delivery of what went away.
// docs/DESIGN.md, "The public monitor", has the exactness argument.
//
// SYNCHRONIZATION
//   valid()          any thread, any time, no lock: the unmap probe, then the subscription's
//                    unapplied() (acquire loads; pairs with the monitor's publication and with
//                    drain()'s release of the cursor, which follows every notify of the records
//                    it covers).
//   subscribe(), unsubscribe()  any thread, notify included: subscriptions_mutex_, which guards
//                    subscriptions_. Lock order: subscriptions_mutex_, then the monitor's registry
//                    mutex (inside uffd::watch/unwatch). Never held while notify runs.
//   deliver()        any thread but notify's own: delivery_mutex_, held across the drain (one
//                    drain at a time per uffd::Subscription) and so across notify. notify may
//                    take the runtime's locks; the runtime may hold them while calling
//                    subscribe, unsubscribe or valid, which never take delivery_mutex_.
//   close()          once, by the owner, not from notify: stops the delivery thread (stop_,
//                    release; the thread's acquire load pairs) and joins it.
//   Counters are relaxed atomics: they publish nothing.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include "base/mutex.h"
#include "core/monitor/subscription_set.h"
#include "mrcache/monitor.h"
#include "uffd/subscription.h"

namespace mrc::monitor {

class Client {
 public:
  [[nodiscard]] static mrc_status_t open(const mrc_monitor_params_t &params, Client **out) noexcept;
  // Ends every subscription, stops the delivery thread, frees the client.
  [[nodiscard]] mrc_status_t close() noexcept;

  [[nodiscard]] mrc_status_t subscribe(uintptr_t start, uintptr_t end) noexcept;
  [[nodiscard]] mrc_status_t unsubscribe(uintptr_t start, uintptr_t end) noexcept;
  bool valid(uintptr_t start, uintptr_t end) noexcept;
  [[nodiscard]] mrc_status_t deliver(size_t *delivered) noexcept;
  void stats(mrc_monitor_stats_t *out) noexcept;

  // Whether this thread is inside a notify of this client.
  bool notifying() const noexcept;

 private:
  Client(const mrc_monitor_params_t &params, uffd::Subscription *subscription) noexcept;
  ~Client() = default;
  Client(const Client &) = delete;
  Client &operator=(const Client &) = delete;

  static void *delivery_main(void *self) noexcept;
  // Drains every record, notifying those that overlap a subscription.
  size_t deliver_locked() noexcept MRC_REQUIRES(delivery_mutex_);
  void notify(uintptr_t start, uintptr_t end) noexcept;
  enum class WholeSpace { Lost, Forked };
  void notify_whole_space(WholeSpace why) noexcept;

  const mrc_monitor_notify_fn notify_;
  void *const notify_arg_;
  const bool one_shot_;
  uffd::Subscription *const subscription_;
  const pid_t owner_pid_;

  Mutex subscriptions_mutex_;
  SubscriptionSet subscriptions_ MRC_GUARDED_BY(subscriptions_mutex_);

  Mutex delivery_mutex_;
  pthread_t delivery_thread_{};
  bool has_delivery_thread_ = false;
  std::atomic<bool> stop_{false};

  struct Counters {
    std::atomic<uint64_t> subscribes{0}, subscribes_refused{0}, unsubscribes{0};
    std::atomic<uint64_t> valid_checks{0}, valid_refused{0};
    std::atomic<uint64_t> records{0}, notifications{0}, whole_space{0}, ended_by_delivery{0};
  } counters_;
};

}  // namespace mrc::monitor
