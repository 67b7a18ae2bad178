// SPDX-License-Identifier: BSD-3-Clause
#include "tools/stress/report.h"

#include <unistd.h>

#include <bit>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tools/stress/util.h"

namespace stress {

namespace {

int latency_bucket(uint64_t ns) {
  if (ns < 4) return static_cast<int>(ns);
  const int bit = 63 - std::countl_zero(ns);
  const int sub = static_cast<int>((ns >> (bit - 2)) & 3);
  const int bucket = (bit - 1) * 4 + sub;
  return bucket < kLatencyBuckets ? bucket : kLatencyBuckets - 1;
}

double bucket_middle(int bucket) {
  if (bucket < 4) return bucket;
  const int bit = bucket / 4 + 1;
  const int sub = bucket % 4;
  const double low = static_cast<double>((4 + sub)) * static_cast<double>(uint64_t{1} << (bit - 2));
  return low * (1.0 + 0.5 / (4 + sub));
}

std::string format_ns(double ns) {
  char buf[32];
  if (ns < 1e3) {
    std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  } else if (ns < 1e6) {
    std::snprintf(buf, sizeof buf, "%.1f us", ns / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f ms", ns / 1e6);
  }
  return buf;
}

}  // namespace

void ThreadCounters::add_latency(uint64_t ns) {
  latency[latency_bucket(ns)].fetch_add(1, std::memory_order_relaxed);
}

uint64_t Totals::mutations_total() const {
  uint64_t total = 0;
  for (uint64_t m : mutations) total += m;
  return total;
}

double Totals::latency_percentile_ns(double p) const {
  uint64_t count = 0;
  for (uint64_t c : latency) count += c;
  if (count == 0) return 0;
  const auto target = static_cast<uint64_t>(p * static_cast<double>(count - 1));
  uint64_t seen = 0;
  for (int i = 0; i < kLatencyBuckets; ++i) {
    seen += latency[i];
    if (seen > target) return bucket_middle(i);
  }
  return bucket_middle(kLatencyBuckets - 1);
}

Totals sum(const std::vector<ThreadCounters *> &counters) {
  Totals t;
  auto get = [](const std::atomic<uint64_t> &a) { return a.load(std::memory_order_relaxed); };
  for (const ThreadCounters *c : counters) {
    t.ops += get(c->ops);
    t.checked += get(c->checked);
    t.pages += get(c->pages);
    t.unchecked += get(c->unchecked);
    t.stale += get(c->stale);
    t.stale_window += get(c->stale_window);
    t.errors += get(c->errors);
    t.injected += get(c->injected);
    t.invalidates += get(c->invalidates);
    t.nested += get(c->nested);
    t.hot += get(c->hot);
    t.churned += get(c->churned);
    t.fork_failures += get(c->fork_failures);
    for (int i = 0; i < kMutationKinds; ++i) {
      t.mutations[i] += get(c->mutations[i]);
      t.refused[i] += get(c->refused[i]);
    }
    for (int i = 0; i < kLatencyBuckets; ++i) t.latency[i] += get(c->latency[i]);
  }
  return t;
}

uint64_t cache_json_counter(const std::string &cache_json, const char *key) {
  const nlohmann::json j = nlohmann::json::parse(cache_json, nullptr, false);
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned()) return 0;
  return j[key].get<uint64_t>();
}

// ---- Output --------------------------------------------------------------------------------

Output::Output() : tty_(isatty(STDOUT_FILENO) != 0) {}

void Output::line(const std::string &text, bool to_stderr) {
  std::lock_guard lock(mutex_);
  if (progress_shown_) {
    std::fputs("\r\033[K", stdout);
    std::fflush(stdout);
    progress_shown_ = false;
  }
  std::FILE *stream = to_stderr ? stderr : stdout;
  std::fputs(text.c_str(), stream);
  if (text.empty() || text.back() != '\n') std::fputc('\n', stream);
  std::fflush(stream);
}

void Output::progress(const std::string &text) {
  std::lock_guard lock(mutex_);
  if (tty_) {
    std::fputs("\r\033[K", stdout);
    std::fputs(text.c_str(), stdout);
    progress_shown_ = true;
  } else {
    std::fputs(text.c_str(), stdout);
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);
}

void Output::finish_progress() {
  std::lock_guard lock(mutex_);
  if (progress_shown_) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
    progress_shown_ = false;
  }
}

// ---- text ----------------------------------------------------------------------------------

std::string progress_text(double elapsed, double requested, const Totals &t,
                          const mrc_stats_t &cache, double ops_per_s) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "[%s/%s] %s ops/s  ops %s  hits %s  misses %s  inval %s  mutations %s  "
                "stale %llu  errors %llu",
                format_duration(elapsed).c_str(), format_duration(requested).c_str(),
                format_count(ops_per_s).c_str(), format_count(static_cast<double>(t.ops)).c_str(),
                format_count(static_cast<double>(cache.hits_fast + cache.hits_slow)).c_str(),
                format_count(static_cast<double>(cache.misses)).c_str(),
                format_count(static_cast<double>(cache.invalidations)).c_str(),
                format_count(static_cast<double>(t.mutations_total())).c_str(),
                static_cast<unsigned long long>(t.stale),
                static_cast<unsigned long long>(t.errors));
  return buf;
}

std::string summary_table(const Summary &s) {
  std::ostringstream out;
  const Totals &t = s.totals;
  auto n = [](uint64_t v) { return format_count(static_cast<double>(v)); };
  auto row = [&out](const char *name, const std::string &value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "  %-22s", name);
    out << buf << value << '\n';
  };
  out << "mrcache-stress " << s.version << ": ";
  if (s.passed()) {
    out << "PASSED";
  } else {
    out << "FAILED (" << t.stale << " stale, " << s.leaks.size() << " leaks, " << t.errors
        << " errors)";
  }
  out << '\n';
  row("seed", std::to_string(s.seed) + "  (replay: --seed " + std::to_string(s.seed) + ")");
  row("mode", s.fast ? "fast (MRC_FLAG_ORDERED_UNMAPS: exact only for unmaps that happen-before "
                       "the get)"
                     : "exact (every get probes for unmaps in flight)");
  row("backend / oracle", s.backend + " / " + s.oracle);
  row("monitor", s.monitor_mode + (s.monitor_reason.empty() ? "" : "  (" + s.monitor_reason + ")"));
  row("duration", format_duration(s.duration_s) + (s.stopped_early ? "  (stopped early)" : ""));
  row("threads", std::to_string(s.threads) + " workers, " + std::to_string(s.mutators) +
                     " mutators, " + std::to_string(s.churn) + " churn, sizes " +
                     format_size(s.min_size) + " .. " + format_size(s.max_size));
  const double rate = s.duration_s > 0 ? static_cast<double>(t.ops) / s.duration_s : 0;
  row("operations", n(t.ops) + "  (" + format_count(rate) + "/s; " + n(t.nested) +
                        " holding several regions, " + n(t.hot) + " hot ranges)");
  row("get latency", "p50 " + format_ns(t.latency_percentile_ns(0.5)) + "  p99 " +
                         format_ns(t.latency_percentile_ns(0.99)) + "  p99.9 " +
                         format_ns(t.latency_percentile_ns(0.999)));
  const uint64_t hits = s.cache.hits_fast + s.cache.hits_slow;
  const uint64_t gets = hits + s.cache.misses;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.1f%%",
                gets != 0 ? 100.0 * static_cast<double>(hits) / static_cast<double>(gets) : 0.0);
  row("hits", n(hits) + "  (fast " + n(s.cache.hits_fast) + ", slow " + n(s.cache.hits_slow) +
                  "; hit ratio " + ratio + ")");
  row("misses", n(s.cache.misses) + "  (merges " + n(s.cache.merges) + ")");
  row("registrations", n(s.registrations) + " made, " + n(s.deregistrations) + " released");
  row("invalidations", n(s.cache.invalidations) + "  (unmap events " + n(s.cache.unmap_events) +
                           ", evictions " + n(s.cache.evictions) + ", purges " + n(s.cache.purges) +
                           ", mrc_invalidate " + n(t.invalidates) + ")");
  row("checks", n(t.checked) + " regions, " + n(t.pages) + " stamps; " + n(t.unchecked) +
                    " too small for the lane");
  std::string mutations;
  std::string refused;
  for (int i = 0; i < kMutationKinds; ++i) {
    if (t.mutations[i] == 0) continue;
    mutations += std::string(mutations.empty() ? "" : ", ") +
                 mutation_name(static_cast<MutationKind>(i)) + " " + n(t.mutations[i]);
    if (t.refused[i] != 0) {
      refused += std::string(refused.empty() ? "" : ", ") +
                 mutation_name(static_cast<MutationKind>(i)) + " " + n(t.refused[i]);
    }
  }
  row("mutations", n(t.mutations_total()) + (mutations.empty() ? "" : "  (" + mutations + ")"));
  if (s.churn != 0) {
    row("churn", n(t.churned) + " fresh mappings of " + format_size(s.churn_size) +
                     " mapped, used and unmapped; " + n(s.unmap_waits) +
                     " gets waited for an unmap in flight");
  }
  if (!refused.empty()) row("refused by the kernel", refused);
  row("forks", n(s.forks) + " (" + n(t.fork_failures) + " children failed)");
  row("injected failures",
      n(t.injected) + " gets failed  (backend injected " + n(s.injected_backend) + ")");
  if (s.log_warnings + s.log_errors != 0) {
    row("library log", n(s.log_errors) + " errors, " + n(s.log_warnings) + " warnings");
  }
  std::string window;
  if (t.stale_window != 0 && s.window_counted) {
    window = "  (" + n(t.stale_window) +
             " of them while another thread's unmap of the address was in flight)";
  } else if (t.stale_window != 0) {
    window = "  (besides, " + n(t.stale_window) +
             " in-window hits: another thread's unmap of the address was in flight; fast mode "
             "does not promise those, not counted)";
  }
  row("stale", n(t.stale) + window);
  row("errors", n(t.errors));
  row("leaks", s.leaks.empty() ? "none" : std::to_string(s.leaks.size()));
  for (const std::string &leak : s.leaks) out << "    " << leak << '\n';
  for (const std::string &error : s.errors) out << "    error: " << error << '\n';
  for (const std::string &note : s.notes) out << "  note: " << note << '\n';
  return out.str();
}

std::string summary_json(const Summary &s) {
  using nlohmann::json;
  const Totals &t = s.totals;
  json mutations = json::object();
  json refused = json::object();
  for (int i = 0; i < kMutationKinds; ++i) {
    mutations[mutation_name(static_cast<MutationKind>(i))] = t.mutations[i];
    refused[mutation_name(static_cast<MutationKind>(i))] = t.refused[i];
  }
  json cache = json::parse(s.cache_json.empty() ? "{}" : s.cache_json, nullptr, false);
  if (cache.is_discarded()) cache = s.cache_json;
  json j = {
      {"tool", "mrcache-stress"},
      {"version", s.version},
      {"passed", s.passed()},
      {"seed", s.seed},
      {"mode", s.fast ? "fast" : "exact"},
      {"backend", s.backend},
      {"oracle", s.oracle},
      {"monitor_mode", s.monitor_mode},
      {"monitor_reason", s.monitor_reason},
      {"duration_s", s.duration_s},
      {"requested_duration_s", s.requested_s},
      {"stopped_early", s.stopped_early},
      {"threads", s.threads},
      {"mutators", s.mutators},
      {"churn_threads", s.churn},
      {"churn_size", s.churn_size},
      {"churned_mappings", t.churned},
      {"unmap_waits", s.unmap_waits},
      {"min_size", s.min_size},
      {"max_size", s.max_size},
      {"limits",
       {{"max_regions", s.max_regions},
        {"max_bytes", s.max_bytes},
        {"max_unreleased", s.max_unreleased}}},
      {"fail_rate", s.fail_rate},
      {"ops", t.ops},
      {"hot_ranges", t.hot},
      {"hits", s.cache.hits_fast + s.cache.hits_slow},
      {"hits_fast", s.cache.hits_fast},
      {"hits_slow", s.cache.hits_slow},
      {"misses", s.cache.misses},
      {"invalidations", s.cache.invalidations},
      {"unmap_events", s.cache.unmap_events},
      {"evictions", s.cache.evictions},
      {"registrations", s.registrations},
      {"deregistrations", s.deregistrations},
      {"explicit_invalidations", t.invalidates},
      {"invalidate_callbacks", s.invalidate_callbacks},
      {"checked_regions", t.checked},
      {"checked_stamps", t.pages},
      {"unchecked_regions", t.unchecked},
      {"stale", t.stale},
      {"stale_unmap_in_flight", t.stale_window},
      {"stale_unmap_in_flight_counted", s.window_counted},
      {"errors", t.errors},
      {"injected_failures", t.injected},
      {"injected_by_backend", s.injected_backend},
      {"leaks", s.leaks},
      {"leak_count", s.leaks.size()},
      {"stale_reports", s.stale_reports},
      {"in_window_reports", s.window_reports},
      {"error_samples", s.errors},
      {"notes", s.notes},
      {"mutations", mutations},
      {"mutations_refused", refused},
      {"forks", s.forks},
      {"fork_failures", t.fork_failures},
      {"library_log", {{"errors", s.log_errors}, {"warnings", s.log_warnings}}},
      {"figures",
       {{"ops_per_s", s.duration_s > 0 ? static_cast<double>(t.ops) / s.duration_s : 0.0},
        {"mutations_per_s",
         s.duration_s > 0 ? static_cast<double>(t.mutations_total()) / s.duration_s : 0.0},
        {"get_latency_ns",
         {{"p50", t.latency_percentile_ns(0.5)},
          {"p90", t.latency_percentile_ns(0.9)},
          {"p99", t.latency_percentile_ns(0.99)},
          {"p999", t.latency_percentile_ns(0.999)}}},
        {"hit_ratio",
         (s.cache.hits_fast + s.cache.hits_slow + s.cache.misses) != 0
             ? static_cast<double>(s.cache.hits_fast + s.cache.hits_slow) /
                   static_cast<double>(s.cache.hits_fast + s.cache.hits_slow + s.cache.misses)
             : 0.0}}},
      {"cache_stats", cache},
  };
  return j.dump(2) + "\n";
}

}  // namespace stress
