// SPDX-License-Identifier: BSD-3-Clause
// The public monitor's client: subscriptions, validity, delivery (client.h).
#include "core/monitor/client.h"

#include <signal.h>
#include <unistd.h>

#include <new>

#include "base/error.h"
#include "uffd/uffd.h"

namespace mrc::monitor {

namespace {

// How long the delivery thread sleeps when no batch wakes it: the bound on how long close()
// may wait for a thread that went to sleep just as it was told to stop.
constexpr int64_t kDeliveryNapNs = 50'000'000;

// The client whose notify this thread runs, if any (reentry checks: the header's rule 4).
constinit thread_local const Client *tls_notifying = nullptr;

using Range = SubscriptionSet::Range;

// Gives back the watches a subscribed range holds (one per subscribe).
void unwatch_all(const Range &range) noexcept {
  for (uint64_t i = 0; i < range.count; ++i) uffd::unwatch(range.start, range.end - range.start);
}

}  // namespace

Client::Client(const mrc_monitor_params_t &params, uffd::Subscription *subscription) noexcept
    : notify_(params.notify),
      notify_arg_(params.notify_arg),
      one_shot_((params.flags & MRC_MONITOR_ONE_SHOT) != 0),
      subscription_(subscription),
      owner_pid_(getpid()) {}

mrc_status_t Client::open(const mrc_monitor_params_t &params, Client **out) noexcept {
  uffd::Subscription *subscription = nullptr;
  if (const mrc_status_t status = uffd::subscribe(&subscription); status != MRC_OK) {
    set_last_error("mrc_monitor_open: out of memory");
    return status;
  }
  if (subscription->mode() == MRC_MONITOR_UNCACHED) {
    mrc_monitor_info_t info{};
    uffd::Monitor::info(&info);
    uffd::unsubscribe(subscription);
    set_last_error("mrc_monitor_open: no monitor runs in this process: %s", info.reason);
    return MRC_ERR_UNSUPPORTED;
  }
  Client *client = new (std::nothrow) Client(params, subscription);
  if (client == nullptr) {
    uffd::unsubscribe(subscription);
    set_last_error("mrc_monitor_open: out of memory");
    return MRC_ERR_NO_MEMORY;
  }
  if ((params.flags & MRC_MONITOR_DELIVERY_THREAD) != 0) {
    // The thread runs the runtime's notify and nothing else: no signal of the application's
    // lands on it.
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    const int error = pthread_create(&client->delivery_thread_, nullptr, delivery_main, client);
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    if (error != 0) {
      delete client;
      uffd::unsubscribe(subscription);
      set_last_error("mrc_monitor_open: cannot start the delivery thread (error %d)", error);
      return MRC_ERR_NO_MEMORY;
    }
    client->has_delivery_thread_ = true;
  }
  *out = client;
  return MRC_OK;
}

mrc_status_t Client::close() noexcept {
  if (notifying()) {
    set_last_error("mrc_monitor_close: called from the monitor's own notify");
    return MRC_ERR_BUSY;
  }
  // In a forked child the delivery thread does not exist, and the watches belong to the
  // parent's table: the child's is empty.
  const bool in_owner = getpid() == owner_pid_;
  if (has_delivery_thread_ && in_owner) {
    stop_.store(true, std::memory_order_release);
    subscription_->wake_record_waiters();
    pthread_join(delivery_thread_, nullptr);
  }
  {
    MutexLock hold(subscriptions_mutex_);
    subscriptions_.clear([in_owner](const Range &range) {
      if (in_owner) unwatch_all(range);
    });
  }
  uffd::unsubscribe(subscription_);
  delete this;
  return MRC_OK;
}

mrc_status_t Client::subscribe(uintptr_t start, uintptr_t end) noexcept {
  // A watch made while an unmap is in flight may be answered from the mapping that unmap is
  // removing (uffd/watches.h, "The window"); once the probe answers Read it cannot be.
  const uffd::Subscription::Unmaps unmaps = subscription_->settle_unmaps();
  if (unmaps != uffd::Subscription::Unmaps::Read) {
    counters_.subscribes_refused.fetch_add(1, std::memory_order_relaxed);
    if (unmaps == uffd::Subscription::Unmaps::InFlight) {
      set_last_error("mrc_monitor_subscribe: unmaps of watched memory stayed in flight");
      return MRC_ERR_BUSY;
    }
    set_last_error("mrc_monitor_subscribe: the kernel refused the unmap probe");
    return MRC_ERR_UNSUPPORTED;
  }
  // Every subscription is a watch of its own, even of a range already subscribed: that one's
  // memory may have been replaced since, and the new mapping is not watched yet.
  MutexLock hold(subscriptions_mutex_);
  char why[256];
  if (uffd::watch(start, end - start, why, sizeof why) != uffd::WatchResult::Watched) {
    counters_.subscribes_refused.fetch_add(1, std::memory_order_relaxed);
    set_last_error("mrc_monitor_subscribe: cannot watch [%#lx, %#lx): %s",
                   static_cast<unsigned long>(start), static_cast<unsigned long>(end), why);
    return MRC_ERR_UNSUPPORTED;
  }
  if (Range *range = subscriptions_.find(start, end); range != nullptr) {
    ++range->count;
  } else if (!subscriptions_.insert(start, end)) {
    uffd::unwatch(start, end - start);
    counters_.subscribes_refused.fetch_add(1, std::memory_order_relaxed);
    set_last_error("mrc_monitor_subscribe: out of memory");
    return MRC_ERR_NO_MEMORY;
  }
  counters_.subscribes.fetch_add(1, std::memory_order_relaxed);
  return MRC_OK;
}

mrc_status_t Client::unsubscribe(uintptr_t start, uintptr_t end) noexcept {
  MutexLock hold(subscriptions_mutex_);
  Range *range = subscriptions_.find(start, end);
  if (range == nullptr) {
    set_last_error("mrc_monitor_unsubscribe: [%#lx, %#lx) is not subscribed",
                   static_cast<unsigned long>(start), static_cast<unsigned long>(end));
    return MRC_ERR_NOT_FOUND;
  }
  uffd::unwatch(start, end - start);
  if (--range->count == 0) subscriptions_.erase(range);
  counters_.unsubscribes.fetch_add(1, std::memory_order_relaxed);
  return MRC_OK;
}

bool Client::valid(uintptr_t start, uintptr_t end) noexcept {
  counters_.valid_checks.fetch_add(1, std::memory_order_relaxed);
  // The probe first: an unmap the monitor has not read yet is in no record (docs/DESIGN.md,
  // "The public monitor").
  if (subscription_->probe_unmaps() == uffd::Subscription::Unmaps::Read &&
      subscription_->unapplied(start, end) == uffd::Subscription::Unapplied::None) {
    return true;
  }
  counters_.valid_refused.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool Client::notifying() const noexcept { return tls_notifying == this; }

mrc_status_t Client::deliver(size_t *delivered) noexcept {
  if (notifying()) {
    set_last_error("mrc_monitor_deliver: called from the monitor's own notify");
    return MRC_ERR_BUSY;
  }
  MutexLock hold(delivery_mutex_);
  const size_t count = deliver_locked();
  if (delivered != nullptr) *delivered = count;
  return MRC_OK;
}

size_t Client::deliver_locked() noexcept {
  size_t notified = 0;
  const auto apply = [&](const uffd::Invalidation &record) {
    counters_.records.fetch_add(1, std::memory_order_relaxed);
    bool overlapping = false;
    {
      MutexLock hold(subscriptions_mutex_);
      if (one_shot_) {
        // Ended before notify runs: a subscription the runtime makes after this point is for
        // memory registered after the change, and stays.
        const size_t ended =
            subscriptions_.erase_overlapping(record.start, record.end, unwatch_all);
        counters_.ended_by_delivery.fetch_add(ended, std::memory_order_relaxed);
        overlapping = ended != 0;
      } else {
        overlapping = subscriptions_.overlaps(record.start, record.end);
      }
    }
    if (overlapping) {
      notify(record.start, record.end);
      ++notified;
    }
  };
  for (;;) {
    switch (subscription_->drain(apply)) {
      case uffd::DrainResult::Ok: return notified;
      case uffd::DrainResult::Overflow:  // records were lost: every subscription may be hit
        notify_whole_space(WholeSpace::Lost);
        break;
      case uffd::DrainResult::Forked:  // the parent's registrations are not the child's
        notify_whole_space(WholeSpace::Forked);
        break;
    }
    ++notified;
  }
}

void Client::notify(uintptr_t start, uintptr_t end) noexcept {
  counters_.notifications.fetch_add(1, std::memory_order_relaxed);
  const Client *outer = tls_notifying;
  tls_notifying = this;
  // The whole space is (NULL, SIZE_MAX), the header's rule 2.
  const size_t length = end == UINTPTR_MAX && start == 0 ? SIZE_MAX : end - start;
  notify_(notify_arg_, reinterpret_cast<void *>(start), length);
  tls_notifying = outer;
}

void Client::notify_whole_space(WholeSpace why) noexcept {
  counters_.whole_space.fetch_add(1, std::memory_order_relaxed);
  if (why == WholeSpace::Forked) {
    // The parent's subscriptions are gone with its registrations; the child's watch table is
    // empty, so there is nothing to unwatch either.
    MutexLock hold(subscriptions_mutex_);
    counters_.ended_by_delivery.fetch_add(subscriptions_.size(), std::memory_order_relaxed);
    subscriptions_.clear([](const Range &) {});
  } else if (one_shot_) {
    MutexLock hold(subscriptions_mutex_);
    counters_.ended_by_delivery.fetch_add(subscriptions_.size(), std::memory_order_relaxed);
    subscriptions_.clear(unwatch_all);
  }
  notify(0, UINTPTR_MAX);
}

void *Client::delivery_main(void *self) noexcept {
  auto *client = static_cast<Client *>(self);
  while (!client->stop_.load(std::memory_order_acquire)) {
    client->subscription_->wait_for_records(kDeliveryNapNs);
    if (client->stop_.load(std::memory_order_acquire)) break;
    MutexLock hold(client->delivery_mutex_);
    client->deliver_locked();
  }
  return nullptr;
}

void Client::stats(mrc_monitor_stats_t *out) noexcept {
  {
    MutexLock hold(subscriptions_mutex_);
    out->subscriptions = subscriptions_.size();
  }
  const auto load = [](const std::atomic<uint64_t> &counter) {
    return counter.load(std::memory_order_relaxed);
  };
  out->subscribes = load(counters_.subscribes);
  out->subscribes_refused = load(counters_.subscribes_refused);
  out->unsubscribes = load(counters_.unsubscribes);
  out->valid_checks = load(counters_.valid_checks);
  out->valid_refused = load(counters_.valid_refused);
  out->records = load(counters_.records);
  out->notifications = load(counters_.notifications);
  out->whole_space = load(counters_.whole_space);
  out->ended_by_delivery = load(counters_.ended_by_delivery);
}

}  // namespace mrc::monitor
