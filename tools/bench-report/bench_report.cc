// SPDX-License-Identifier: BSD-3-Clause
// mrcache-bench-report: turns mrcache-bench's Google Benchmark JSON into a Markdown table of
// figures and mrcache/UCX ratios, and the data files scripts/bench-report.gp plots.
//
//   mrcache-bench-report BENCH.json [MORE.json...] OUT_DIR
//   writes OUT_DIR/results.md and OUT_DIR/{lookup,hits}-{mrcache,ucx}.dat
//
// Pairing (the naming convention of tools/bench/bench_*.cc): a benchmark of ours and its UCX
// twin, measured in the same run, differ in one place only:
//   - a path component "ours" <-> "ucx":         PgtLookup/ours/dense/1000 <->
//   PgtLookup/ucx/dense/1000
//   - the first component "BM_<Family><Work>" <-> "BM_Ucx<UcxFamily><Work>", where the families
//     are Cache <-> Rcache, Pgt <-> Pgtable, Monitor <-> Ucm, and any X <-> X:
//     BM_CacheHit/shared:0/real_time/threads:2 <-> BM_UcxRcacheHit/shared:0/real_time/threads:2
//   - and in either form, a cache mode component of ours ("exact" or "fast") is absent in UCX's
//     name (UCX has one mode): BM_CacheHit/exact/shared:0/... <-> BM_UcxRcacheHit/shared:0/...
// With --benchmark_repetitions, the median of the repetitions is used.
// Plots: lookup latency versus regions from PgtLookup/<impl>/<layout>/<regions>; hit throughput
// versus threads from BM_CacheHit[/<mode>] and BM_UcxRcacheHit (items_per_second).
// Goals: the exact mode's, from the hits, BM_SyscallGetpid and BM_UffdProbe; a new mapping's first
// get against UCX's miss, from BM_CacheMiss{NewMapping,Churning} and their twins (see goals()).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "tools/common/stdout_check.h"

namespace {

using nlohmann::json;

struct Figure {
  std::string name;
  double ns = NAN;      // real time per iteration
  double cpu_ns = NAN;  // CPU time per iteration, every thread's summed
  double items_per_second = NAN;
  int threads = 1;
  std::string label;
  std::string error;
  std::map<std::string, double> counters;
};

double to_ns(double value, const std::string &unit) {
  if (unit == "us") return value * 1e3;
  if (unit == "ms") return value * 1e6;
  if (unit == "s") return value * 1e9;
  return value;
}

// Keys of a benchmark entry that are not user counters.
bool standard_key(const std::string &key) {
  static const char *const kKeys[] = {"name",
                                      "family_index",
                                      "per_family_instance_index",
                                      "run_name",
                                      "run_type",
                                      "repetitions",
                                      "repetition_index",
                                      "threads",
                                      "iterations",
                                      "real_time",
                                      "cpu_time",
                                      "time_unit",
                                      "items_per_second",
                                      "bytes_per_second",
                                      "label",
                                      "aggregate_name",
                                      "aggregate_unit",
                                      "error_occurred",
                                      "error_message"};
  for (const char *k : kKeys) {
    if (key == k) return true;
  }
  return false;
}

std::map<std::string, Figure> load(const json &doc) {
  std::map<std::string, Figure> iterations, medians;
  for (const json &b : doc.at("benchmarks")) {
    const std::string run_type = b.value("run_type", "iteration");
    const bool median = run_type == "aggregate" && b.value("aggregate_name", "") == "median";
    if (run_type != "iteration" && !median) continue;
    Figure f;
    f.name = b.value("run_name", b.value("name", "?"));
    f.threads = b.value("threads", 1);
    f.label = b.value("label", "");
    if (b.value("error_occurred", false)) f.error = b.value("error_message", "error");
    if (b.contains("real_time")) {
      f.ns = to_ns(b["real_time"].get<double>(), b.value("time_unit", "ns"));
    }
    if (b.contains("cpu_time"))
      f.cpu_ns = to_ns(b["cpu_time"].get<double>(), b.value("time_unit", "ns"));
    if (b.contains("items_per_second")) f.items_per_second = b["items_per_second"].get<double>();
    for (auto it = b.begin(); it != b.end(); ++it) {
      if (!standard_key(it.key()) && it->is_number()) f.counters[it.key()] = it->get<double>();
    }
    (median ? medians : iterations)[f.name] = f;
  }
  for (auto &[name, f] : medians) iterations[name] = f;
  return iterations;
}

std::vector<std::string> split(const std::string &name) {
  std::vector<std::string> parts;
  std::stringstream stream(name);
  std::string part;
  while (std::getline(stream, part, '/')) parts.push_back(part);
  return parts;
}

std::string join(const std::vector<std::string> &parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i != 0 ? "/" : "") + parts[i];
  return out;
}

bool is_mode(const std::string &part) { return part == "exact" || part == "fast"; }

// The names a UCX twin of `ours` may have (see the convention at the top).
std::vector<std::string> twin_candidates(const std::string &ours) {
  std::vector<std::string> out;
  std::vector<std::string> parts;
  for (std::string &part : split(ours)) {
    if (!is_mode(part)) parts.push_back(std::move(part));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "ours") {
      std::vector<std::string> twin = parts;
      twin[i] = "ucx";
      out.push_back(join(twin));
    }
  }
  if (!parts.empty() && parts[0].rfind("BM_", 0) == 0 && parts[0].rfind("BM_Ucx", 0) != 0) {
    const std::string rest = parts[0].substr(3);
    static const std::pair<const char *, const char *> kFamilies[] = {
        {"Cache", "Rcache"}, {"Pgt", "Pgtable"}, {"Monitor", "Ucm"}};
    std::vector<std::string> firsts = {"BM_Ucx" + rest};
    for (const auto &[mine, theirs] : kFamilies) {
      if (rest.rfind(mine, 0) == 0)
        firsts.push_back("BM_Ucx" + std::string(theirs) + rest.substr(std::strlen(mine)));
    }
    for (const std::string &first : firsts) {
      std::vector<std::string> twin = parts;
      twin[0] = first;
      out.push_back(join(twin));
    }
  }
  return out;
}

bool is_ucx(const std::string &name) {
  for (const std::string &part : split(name)) {
    if (part == "ucx") return true;
  }
  return name.rfind("BM_Ucx", 0) == 0;
}

std::string time_text(double ns) {
  if (std::isnan(ns)) return "-";
  char buf[32];
  if (ns < 10) {
    std::snprintf(buf, sizeof buf, "%.2f ns", ns);
  } else if (ns < 1e3) {
    std::snprintf(buf, sizeof buf, "%.1f ns", ns);
  } else if (ns < 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f us", ns / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  }
  return buf;
}

std::string number_text(double v) {
  if (std::isnan(v)) return "-";
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  } else if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  } else if (a >= 1e4) {
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  } else if (a >= 100 || a == std::floor(a)) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f", v);
  }
  return buf;
}

std::string ratio_text(double ours, double theirs) {
  if (std::isnan(ours) || std::isnan(theirs) || theirs <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ours / theirs);
  return buf;
}

// Throughput of a figure in operations per second, for the hit plot.
double throughput(const Figure &f) {
  if (!std::isnan(f.items_per_second)) return f.items_per_second;
  if (std::isnan(f.ns) || f.ns <= 0) return NAN;
  return 1e9 / f.ns * f.threads;
}

// The exact mode's goals, each from figures of one run (the probe is a syscall, so it is judged
// against the cheapest syscall measured beside it, not against a figure from another day).
// Hits of a region per thread (shared:0); a goal whose figures are missing is left out.
std::string goals(const std::map<std::string, Figure> &figures) {
  auto find = [&figures](const std::string &name) -> const Figure * {
    const auto it = figures.find(name);
    return it != figures.end() && it->second.error.empty() ? &it->second : nullptr;
  };
  auto threads = [](int n) { return "/real_time/threads:" + std::to_string(n); };
  const Figure *exact[3] = {}, *fast[3] = {}, *ucx[3] = {}, *getpid[3] = {}, *probe[3] = {},
               *own_probe[3] = {};
  for (int n = 1; n <= 2; ++n) {
    exact[n] = find("BM_CacheHit/exact/shared:0" + threads(n));
    fast[n] = find("BM_CacheHit/fast/shared:0" + threads(n));
    ucx[n] = find("BM_UcxRcacheHit/shared:0" + threads(n));
    getpid[n] = find("BM_SyscallGetpid" + threads(n));
    probe[n] = find("BM_UffdProbe/monitor_fd" + threads(n));
    own_probe[n] = find("BM_UffdProbe/own_fd" + threads(n));
  }
  const Figure *first_touch = find("BM_CacheMissNewMapping/exact");
  const Figure *ucx_first_touch = find("BM_UcxRcacheMissNewMapping");
  const Figure *churning = find("BM_CacheMissChurning/exact/manual_time");
  const Figure *ucx_churning = find("BM_UcxRcacheMissChurning/manual_time");
  std::ostringstream md;
  auto row = [&md](const std::string &goal, const std::string &from, double value,
                   const std::string &value_text, double bound, bool at_most) {
    const char *met = std::isnan(bound)                             ? "-"
                      : (at_most ? value <= bound : value >= bound) ? "yes"
                                                                    : "NO";
    md << "| " << goal << " | " << from << " | " << value_text << " | " << met << " |\n";
  };
  auto fixed = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return std::string(buf);
  };
  // 2 threads over 1: 2.00 is perfect scaling on two free CPUs. On a shared machine the run may
  // not get them: CPU time over wall time says how many it had, and CPU time per operation at 2
  // threads over 1 what the threads cost each other (1.00: nothing), whatever the CPUs were.
  auto scaling = [](const Figure *const f[3]) { return throughput(*f[2]) / throughput(*f[1]); };
  auto cpus = [&fixed](const Figure *const f[3]) {
    return " (CPUs had: " + fixed(f[2]->cpu_ns / f[2]->ns) +
           "; CPU per op, 2 threads / 1: " + fixed(f[2]->cpu_ns / f[1]->cpu_ns) + ")";
  };
  if (exact[1] && ucx[1] && getpid[1]) {
    const double bound = ucx[1]->ns + 2 * getpid[1]->ns;
    row("exact hit <= UCX hit + 2 x getpid",
        "exact " + time_text(exact[1]->ns) + ", UCX " + time_text(ucx[1]->ns) + ", getpid " +
            time_text(getpid[1]->ns),
        exact[1]->ns, time_text(exact[1]->ns) + " vs " + time_text(bound), bound, true);
  }
  if (fast[1] && ucx[1]) {
    row("fast hit / UCX hit <= 1/3",
        "fast " + time_text(fast[1]->ns) + ", UCX " + time_text(ucx[1]->ns),
        fast[1]->ns / ucx[1]->ns, fixed(fast[1]->ns / ucx[1]->ns), 1.0 / 3, true);
  }
  if (exact[1] && exact[2]) {
    row("exact hits/s, 2 threads / 1 thread >= 1.6",
        number_text(throughput(*exact[2])) + " vs " + number_text(throughput(*exact[1])) +
            " ops/s" + cpus(exact),
        scaling(exact), fixed(scaling(exact)), 1.6, false);
  }
  if (probe[1] && getpid[1]) {
    row("probe / getpid (the probe's syscall against the floor)",
        "probe " + time_text(probe[1]->ns) + ", getpid " + time_text(getpid[1]->ns),
        probe[1]->ns / getpid[1]->ns, fixed(probe[1]->ns / getpid[1]->ns), NAN, true);
  }
  if (exact[1] && fast[1] && getpid[1]) {
    const double extra = exact[1]->ns - fast[1]->ns;
    row("exact hit - fast hit, in getpids (the probe inside a get)",
        "exact " + time_text(exact[1]->ns) + ", fast " + time_text(fast[1]->ns),
        extra / getpid[1]->ns, fixed(extra / getpid[1]->ns), NAN, true);
  }
  // One struct file shared by both threads (fdget's reference count) against a descriptor per
  // thread and against getpid, which shares nothing.
  for (const auto &[what, f] :
       {std::pair{"probe, monitor's fd", probe}, std::pair{"probe, a fd per thread", own_probe},
        std::pair{"getpid", getpid}}) {
    if (f[1] && f[2]) {
      row(std::string(what) + ": ops/s, 2 threads / 1 thread",
          number_text(throughput(*f[2])) + " vs " + number_text(throughput(*f[1])) + " ops/s" +
              cpus(f),
          scaling(f), fixed(scaling(f)), NAN, true);
    }
  }
  // The goal for a new mapping's first get, in its two cases: a mapping never seen (the
  // watch: two PROCMAP_QUERYs and a UFFDIO_REGISTER, whatever UCX pays) and a buffer re-mapped
  // at the same address for every message (learned to churn: registered uncached).
  for (const auto &[what, ours_figure, ucx_figure] :
       {std::tuple{"first get of a mapping never seen <= 2 x UCX's miss", first_touch,
                   ucx_first_touch},
        std::tuple{"get of a buffer re-mapped per message <= 2 x UCX's miss", churning,
                   ucx_churning}}) {
    if (ours_figure && ucx_figure) {
      row(what, "exact " + time_text(ours_figure->ns) + ", UCX " + time_text(ucx_figure->ns),
          ours_figure->ns / ucx_figure->ns, fixed(ours_figure->ns / ucx_figure->ns), 2.0, true);
    }
  }
  if (md.tellp() == 0) return "";
  return "### Exact mode: goals, from this run\n\n"
         "Hits of a region per thread, and the first get of a new mapping. Exact mode probes the\n"
         "kernel once per get; fast mode (MRC_FLAG_ORDERED_UNMAPS) does not. getpid is a raw\n"
         "syscall, the floor of any probe.\n"
         "Times are wall-clock; a run that did not get its CPUs shows it in \"CPUs had\".\n\n"
         "| goal | figures | value | met |\n|---|---|---:|---|\n" +
         md.str() + "\n";
}

std::string markdown(const json &doc, const std::map<std::string, Figure> &figures) {
  std::ostringstream md;
  const json context = doc.value("context", json::object());
  md << "## mrcache-bench results\n\n";
  md << "Run " << context.value("date", "?") << " on " << context.value("host_name", "?") << " ("
     << context.value("num_cpus", 0) << " CPUs";
  if (context.contains("mhz_per_cpu")) md << " at " << context["mhz_per_cpu"].get<long>() << " MHz";
  md << "; load average";
  if (context.contains("load_avg")) {
    for (const json &load : context["load_avg"]) md << " " << number_text(load.get<double>());
  }
  md << "). mrcache built Release by scripts/bench.sh. Times are wall-clock per operation";
  bool repeated = false;
  for (const json &b : doc.at("benchmarks"))
    repeated = repeated || b.value("run_type", "") == "aggregate";
  md << (repeated ? " (median of the repetitions)" : "") << ".\n\n";

  // mrcache versus UCX.
  struct Pair {
    const Figure *ours, *ucx;
  };
  std::vector<Pair> pairs;
  for (const auto &[name, f] : figures) {
    if (is_ucx(name)) continue;
    for (const std::string &candidate : twin_candidates(name)) {
      const auto it = figures.find(candidate);
      if (it != figures.end()) {
        pairs.push_back({&f, &it->second});
        break;
      }
    }
  }
  if (pairs.empty()) {
    md << "No UCX comparison in this run (mrcache-bench was built without UCX's headers: "
          "install libucx-dev).\n\n";
  } else {
    md << "### mrcache versus UCX, measured in the same run\n\n"
       << "Ratio = mrcache / UCX: below 1, mrcache is faster (or smaller).\n\n"
       << "| workload | mrcache | UCX | ratio | other figures (mrcache vs UCX) |\n"
       << "|---|---:|---:|---:|---|\n";
    for (const Pair &p : pairs) {
      std::string others;
      for (const auto &[key, value] : p.ours->counters) {
        const auto it = p.ucx->counters.find(key);
        if (it == p.ucx->counters.end()) continue;
        others += (others.empty() ? "" : "; ") + key + " " + number_text(value) + " vs " +
                  number_text(it->second) + " (" + ratio_text(value, it->second) + ")";
      }
      if (p.ours->threads > 1 || !std::isnan(p.ours->items_per_second)) {
        others += std::string(others.empty() ? "" : "; ") + "ops/s " +
                  number_text(throughput(*p.ours)) + " vs " + number_text(throughput(*p.ucx));
      }
      md << "| " << p.ours->name << " | " << time_text(p.ours->ns) << " | " << time_text(p.ucx->ns)
         << " | " << ratio_text(p.ours->ns, p.ucx->ns) << " | " << others << " |\n";
    }
    md << "\n";
  }

  md << goals(figures);

  md << "### Every figure\n\n| benchmark | time/op | ops/s | counters | label |\n"
     << "|---|---:|---:|---|---|\n";
  for (const auto &[name, f] : figures) {
    std::string counters;
    for (const auto &[key, value] : f.counters) {
      counters += (counters.empty() ? "" : ", ") + key + " " + number_text(value);
    }
    md << "| " << name << " | " << (f.error.empty() ? time_text(f.ns) : "error: " + f.error)
       << " | " << number_text(f.items_per_second) << " | " << counters << " | " << f.label
       << " |\n";
  }
  return md.str();
}

// One gnuplot data block per series: a title line, then "x y" rows; blocks separated by two
// blank lines (gnuplot's `index`). Returns the number of series written.
int write_series(const std::string &path,
                 const std::map<std::string, std::map<double, double>> &series) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  int count = 0;
  for (const auto &[title, points] : series) {
    if (points.empty()) continue;
    if (count != 0) out << "\n\n";
    out << '"' << title << "\"\n";
    for (const auto &[x, y] : points) out << x << ' ' << y << '\n';
    ++count;
  }
  // A full disk shows at the last flush: scripts/bench.sh would plot a truncated file.
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
  return count;
}

}  // namespace

int main(int argc, char **argv) {
  mrc_tools::check_stdout_at_exit("mrcache-bench-report");
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: mrcache-bench-report BENCH.json [MORE.json...] OUT_DIR\n"
                 "  writes OUT_DIR/results.md (figures and mrcache/UCX ratios) and the data\n"
                 "  files of scripts/bench-report.gp (lookup-{mrcache,ucx}.dat,\n"
                 "  hits-{mrcache,ucx}.dat); prints plot_<series>=0|1 for each\n");
    return 2;
  }
  try {
    // Several runs (bench.sh runs the monitor's benchmarks in a process of their own): one
    // document, the first run's context.
    json doc;
    for (int i = 1; i + 1 < argc; ++i) {
      std::ifstream in(argv[i]);
      if (!in) throw std::runtime_error(std::string("cannot open ") + argv[i]);
      json part;
      in >> part;
      if (doc.is_null()) {
        doc = part;
      } else {
        for (const json &b : part.at("benchmarks")) doc["benchmarks"].push_back(b);
      }
    }
    const std::map<std::string, Figure> figures = load(doc);
    const std::string dir = argv[argc - 1];

    {
      std::ofstream md(dir + "/results.md");
      md << markdown(doc, figures);
      md.close();
      if (!md) throw std::runtime_error("cannot write " + dir + "/results.md");
    }

    // One file per implementation, the series in the same order in both (the plot gives a
    // layout the same colour in each, solid for mrcache, dashed for UCX).
    static const std::regex kLookup(R"(PgtLookup/(ours|ucx)/(\w+)/(\d+))");
    static const std::regex kHit(
        R"(BM_(Cache|UcxRcache)Hit/(?:(exact|fast)/)?shared:(\d)/.*threads:(\d+))");
    using Series = std::map<std::string, std::map<double, double>>;
    Series lookup[2], hits[2];  // [0] mrcache, [1] UCX
    for (const auto &[name, f] : figures) {
      std::smatch m;
      if (std::regex_match(name, m, kLookup) && f.error.empty()) {
        const int impl = m[1] == "ours" ? 0 : 1;
        lookup[impl][std::string(impl == 0 ? "mrcache " : "UCX ") + m[2].str()][std::stod(m[3])] =
            f.ns;
      } else if (std::regex_match(name, m, kHit) && f.error.empty()) {
        const int impl = m[1] == "Cache" ? 0 : 1;
        const std::string mode = m[2].matched ? " " + m[2].str() : "";
        hits[impl][std::string(impl == 0 ? "mrcache" : "UCX") + mode +
                   (m[3] == "1" ? ", one shared region" : ", a region per thread")]
            [std::stod(m[4])] = throughput(f) / 1e6;
      }
    }
    const char *const kImpl[] = {"mrcache", "ucx"};
    std::string flags;
    int series = 0;
    for (int impl = 0; impl < 2; ++impl) {
      const int l = write_series(dir + "/lookup-" + kImpl[impl] + ".dat", lookup[impl]);
      const int h = write_series(dir + "/hits-" + kImpl[impl] + ".dat", hits[impl]);
      series += l + h;
      flags += std::string("plot_lookup_") + kImpl[impl] + "=" + (l > 0 ? "1" : "0") + "\n";
      flags += std::string("plot_hits_") + kImpl[impl] + "=" + (h > 0 ? "1" : "0") + "\n";
    }
    std::printf("mrcache-bench-report: %zu figures; %s/results.md; %d plot series\n%s",
                figures.size(), dir.c_str(), series, flags.c_str());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "mrcache-bench-report: %s\n", e.what());
    return 1;
  }
  return 0;
}
