// SPDX-License-Identifier: BSD-3-Clause
// The report (report.h).
#include "tools/appbench/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace appbench {

namespace {

// The ratios every table shows: mrcache's two modes against UCX and against no cache.
const std::pair<const char *, const char *> kRatios[] = {
    {"exact", "ucx"}, {"exact", "none"}, {"fast", "ucx"}, {"fast", "none"}};

std::string binding_title(int cpu) {
  return cpu < 0 ? "unbound" : fmt::format("bound to CPU {}", cpu);
}
std::string binding_file(int cpu) { return cpu < 0 ? "unbound" : "bound"; }
std::string path_title(const std::string &path) { return path == "ucx" ? "UCX" : path; }

std::string format_ns(double ns) {
  if (ns >= 1e6) return fmt::format("{:.2f} ms", ns / 1e6);
  if (ns >= 1e4) return fmt::format("{:.1f} µs", ns / 1e3);
  if (ns >= 1e3) return fmt::format("{:.2f} µs", ns / 1e3);
  return fmt::format("{:.0f} ns", ns);
}

const std::vector<double> *figures(const Group &group, const std::string &path) {
  auto it = group.ns.find(path);
  return it == group.ns.end() ? nullptr : &it->second;
}

std::optional<Ratio> group_ratio(const Group &group, const std::string &a, const std::string &b) {
  const std::vector<double> *fa = figures(group, a);
  const std::vector<double> *fb = figures(group, b);
  if (fa == nullptr || fb == nullptr) return std::nullopt;
  return ratio(*fa, *fb);
}

std::optional<double> group_median(const Group &group, const std::string &path) {
  const std::vector<double> *f = figures(group, path);
  return f == nullptr ? std::nullopt : median(*f);
}

// Where no cache beats UCX, mrcache must beat no cache too (the application goals): the rows whose
// mode misses a goal, with the figure that misses it.
std::vector<std::string> goal_misses(const Results &results, const std::string &mode) {
  std::vector<std::string> misses;
  for (const Group &group : results.groups) {
    const std::string where =
        fmt::format("{} {} {}", group.engine, binding_title(group.cpu), group.workload->name);
    if (auto r = group_ratio(group, mode, "ucx"); r && r->median > 1.0) {
      misses.push_back(fmt::format("{}: {}/UCX {:.2f}", where, mode, r->median));
    }
    auto none = group_median(group, "none");
    auto ucx = group_median(group, "ucx");
    if (none && ucx && *none < *ucx) {
      if (auto r = group_ratio(group, mode, "none"); r && r->median > 1.0) {
        misses.push_back(
            fmt::format("{}: {}/none {:.2f} (no cache beats UCX here)", where, mode, r->median));
      }
    }
  }
  return misses;
}

}  // namespace

std::optional<double> median(const std::vector<double> &values) {
  std::vector<double> v;
  for (double x : values) {
    if (std::isfinite(x)) v.push_back(x);
  }
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

std::optional<Ratio> ratio(const std::vector<double> &a, const std::vector<double> &b) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::isfinite(a[i]) && std::isfinite(b[i]) && b[i] > 0) r.push_back(a[i] / b[i]);
  }
  if (r.empty()) return std::nullopt;
  const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
  return Ratio{*median(r), *lo, *hi};
}

std::string markdown(const DriverConfig &config, const Results &results) {
  std::string out = fmt::format(
      "Each figure: the median over {} repetitions of the time per message (per step for halo), "
      "each trial a fresh process of at least {} s, the paths alternating within each "
      "repetition. Ratios: the median of the per-repetition ratios, [min..max]; above 1.00 in "
      "bold.\n",
      config.repetitions, config.timing.min_seconds);
  for (const std::string &engine : config.engines) {
    for (int cpu : config.cpus) {
      out += fmt::format("\n### {} engine, {}\n\n| workload |", engine, binding_title(cpu));
      std::string rule = "|---|";
      for (const std::string &path : config.paths) {
        out += fmt::format(" {} |", path_title(path));
        rule += "---:|";
      }
      for (auto [a, b] : kRatios) {
        out += fmt::format(" {}/{} |", a, path_title(b));
        rule += "---:|";
      }
      out += "\n" + rule + "\n";
      for (const Group &group : results.groups) {
        if (group.engine != engine || group.cpu != cpu) continue;
        out += fmt::format("| {} |", group.workload->name);
        for (const std::string &path : config.paths) {
          auto m = group_median(group, path);
          out += fmt::format(" {} |", m ? format_ns(*m) : "–");
        }
        for (auto [a, b] : kRatios) {
          auto r = group_ratio(group, a, b);
          if (!r) {
            out += " – |";
            continue;
          }
          const std::string value = fmt::format("{:.2f}", r->median);
          out += fmt::format(" {} [{:.2f}..{:.2f}] |",
                             r->median > 1.0 ? "**" + value + "**" : value, r->min, r->max);
        }
        out += "\n";
      }
    }
  }
  out += "\n### Goals\n\n";
  for (const char *mode : {"exact", "fast"}) {
    const std::vector<std::string> misses = goal_misses(results, mode);
    out += fmt::format("- {} mode: {}\n", mode,
                       misses.empty() ? std::string("every row ≤ 1.00 × UCX, and ≤ 1.00 × no "
                                                    "cache where no cache beats UCX")
                                      : fmt::format("{} misses", misses.size()));
    for (const std::string &miss : misses) out += "  - " + miss + "\n";
  }
  for (const Group &group : results.groups) {
    if (group.workload->name.rfind("pool/", 0) != 0) continue;
    auto exact = group_median(group, "exact");
    auto fast = group_median(group, "fast");
    if (exact && fast) {
      out +=
          fmt::format("- {} {} {}: exact − fast = {:.0f} ns per get (goal: one kernel probe)\n",
                      group.engine, binding_title(group.cpu), group.workload->name, *exact - *fast);
    }
  }
  for (const auto &[key, why] : results.unavailable) {
    out += fmt::format("- not run: {} ({})\n", key, why);
  }
  for (const std::string &failure : results.failures) out += "- FAILED: " + failure + "\n";
  return out;
}

void write_report(const DriverConfig &config, const Results &results, const std::string &dir) {
  // Checked after the close: a full disk shows at the last flush.
  auto write = [&](const std::string &name, const std::string &text) {
    std::ofstream file(dir + "/" + name);
    file << text;
    file.close();
    if (!file) throw std::runtime_error("cannot write " + dir + "/" + name);
  };
  write("app.md", markdown(config, results));

  nlohmann::json json = {{"repetitions", config.repetitions},
                         {"min_seconds", config.timing.min_seconds},
                         {"unavailable", results.unavailable},
                         {"failures", results.failures},
                         {"groups", nlohmann::json::array()}};
  for (const Group &group : results.groups) {
    nlohmann::json g = {{"engine", group.engine},
                        {"cpu", group.cpu},
                        {"workload", group.workload->name},
                        {"about", group.workload->about},
                        {"counters", group.counters}};
    for (const auto &[path, ns] : group.ns) {
      nlohmann::json values = nlohmann::json::array();
      for (double x : ns) values.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json());
      g["ns"][path] = values;
    }
    for (auto [a, b] : kRatios) {
      if (auto r = group_ratio(group, a, b)) {
        g["ratios"][fmt::format("{}/{}", a, b)] = {
            {"median", r->median}, {"min", r->min}, {"max", r->max}};
      }
    }
    json["groups"].push_back(g);
  }
  write("app.json", json.dump(2) + "\n");

  // The plot's data: one file per engine and binding, a row per workload, the four ratios.
  for (const std::string &engine : config.engines) {
    for (int cpu : config.cpus) {
      std::ostringstream dat;
      dat << "workload";
      for (auto [a, b] : kRatios) dat << fmt::format(" {}/{}", a, path_title(b));
      dat << "\n";
      for (const Group &group : results.groups) {
        if (group.engine != engine || group.cpu != cpu) continue;
        dat << '"' << group.workload->name << '"';
        for (auto [a, b] : kRatios) {
          auto r = group_ratio(group, a, b);
          dat << ' ' << (r ? fmt::format("{:.4f}", r->median) : "NaN");
        }
        dat << "\n";
      }
      write(fmt::format("app-{}-{}.dat", engine, binding_file(cpu)), dat.str());
    }
  }
}

}  // namespace appbench
