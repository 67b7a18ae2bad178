// SPDX-License-Identifier: BSD-3-Clause
// mrcache-seg: list, inspect, scan, repair and remove shared-segment domains (like VPP's
// svmtool).
//
//   mrcache-seg [--prefix P] [--json] show [--verbose]
//   mrcache-seg [--prefix P] [--json] scan
//   mrcache-seg [--prefix P] [--json] repair
//   mrcache-seg  --prefix P  [--json] remove NAME | remove --all
//
// Without --prefix, show/scan/repair act on every domain found in /dev/shm ("<prefix>:root")
// that belongs to this user: anyone can create a file of that name, so another user's file (or
// one that is not a regular file) is reported once ("skipped") and does not make the command fail.
// The tool attaches as an observer (no client slot, no window reservation), except remove
// --all, which joins for a moment so that it can tear the domain down as its last client.
// Exit status: 0 success, 1 a command failed (or a domain is busy, or standard output could not
// be written), 2 bad usage.
//
// SYNCHRONIZATION: single-threaded; every shared-memory access goes through the library (its
// locks and its repair rules apply: a live lock holder is waited for, never forced out).
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "mrcache/mrcache.h"
#include "tools/common/stdout_check.h"

namespace {

using nlohmann::json;

struct Options {
  std::string prefix;
  bool json = false;
  bool verbose = false;
  bool all = false;
  std::string name;
  uint64_t base = 0;
  uint64_t size = 0;
  unsigned timeout_ms = 2000;
};

bool valid_prefix(const std::string &p) {
  if (p.empty() || p.size() > 63 || p == "." || p == "..") return false;
  for (char c : p) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

// A root file in /dev/shm that is not one of this user's domains.
struct Skipped {
  std::string file;
  std::string why;
};

// Every domain of this user with a root file in /dev/shm; other users' root files in *skipped.
std::vector<std::string> find_domains(std::vector<Skipped> *skipped) {
  std::vector<std::string> out;
  DIR *dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent *e = readdir(dir)) {
    const std::string n = e->d_name;
    const std::string suffix = ":root";
    if (n.size() > suffix.size() &&
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string prefix = n.substr(0, n.size() - suffix.size());
      if (!valid_prefix(prefix)) continue;
      const std::string path = "/dev/shm/" + n;
      struct stat st {};
      if (lstat(path.c_str(), &st) != 0) continue;  // gone meanwhile
      if (!S_ISREG(st.st_mode)) {
        skipped->push_back({path, "not a regular file"});
      } else if (st.st_uid != geteuid()) {
        skipped->push_back(
            {path, "owned by uid " + std::to_string(st.st_uid) + ", not this user's domain"});
      } else {
        out.push_back(prefix);
      }
    }
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  std::sort(skipped->begin(), skipped->end(),
            [](const Skipped &a, const Skipped &b) { return a.file < b.file; });
  return out;
}

mrc_seg_domain_params_t params_for(const Options &o, const std::string &prefix) {
  mrc_seg_domain_params_t p;
  mrc_seg_domain_params_init(&p);
  p.prefix = prefix.c_str();
  p.base = o.base;
  p.size = o.size;
  p.join_timeout_ms = o.timeout_ms;
  return p;
}

std::string error_text(mrc_status_t st) {
  std::string e = mrc_status_string(st);
  const char *why = mrc_seg_last_error();
  if (why != nullptr && why[0] != '\0') e += std::string(": ") + why;
  return e;
}

// An observer handle, closed on scope exit.
class Observer {
 public:
  Observer(const Options &o, const std::string &prefix) {
    const mrc_seg_domain_params_t p = params_for(o, prefix);
    status_ = mrc_seg_domain_inspect(&p, &domain_);
    if (status_ != MRC_OK) error_ = error_text(status_);
  }
  ~Observer() {
    if (domain_ != nullptr) (void)mrc_seg_domain_close(domain_);
  }
  Observer(const Observer &) = delete;
  Observer &operator=(const Observer &) = delete;
  bool ok() const { return status_ == MRC_OK; }
  mrc_status_t status() const { return status_; }
  const std::string &error() const { return error_; }
  json failure(const std::string &prefix) const {
    return {{"prefix", prefix}, {"error", error_}, {"status", status_}};
  }
  mrc_seg_domain_t *get() const { return domain_; }

 private:
  mrc_seg_domain_t *domain_ = nullptr;
  mrc_status_t status_ = MRC_OK;
  std::string error_;
};

// The description; asked again with a larger buffer when the domain grew in between.
std::string describe(mrc_seg_domain_t *d, unsigned flags) {
  std::string out(4096, '\0');
  for (;;) {
    const int n = mrc_seg_domain_describe(d, flags, out.data(), out.size());
    if (n < 0) throw std::runtime_error(error_text(static_cast<mrc_status_t>(n)));
    if (static_cast<size_t>(n) < out.size()) {
      out.resize(static_cast<size_t>(n));
      return out;
    }
    out.assign(static_cast<size_t>(n) + 4096, '\0');
  }
}

// Runs `fn(prefix)` for the chosen domains; collects JSON results or prints text.
template <class Fn>
int for_each_domain(const Options &o, Fn fn) {
  std::vector<std::string> prefixes;
  std::vector<Skipped> skipped;
  if (!o.prefix.empty()) {
    prefixes.push_back(o.prefix);
  } else {
    prefixes = find_domains(&skipped);
  }
  for (const Skipped &k : skipped) {
    if (!o.json) std::cerr << "mrcache-seg: skipped " << k.file << ": " << k.why << "\n";
  }
  int rc = 0;
  json results = json::array();
  for (const std::string &prefix : prefixes) {
    json r;
    try {
      r = fn(prefix);
    } catch (const std::exception &e) {
      r = {{"prefix", prefix}, {"error", e.what()}};
    }
    // A domain found by listing /dev/shm may be gone by the time we look: not an error.
    if (o.prefix.empty() && r.value("status", 0) == MRC_ERR_NOT_FOUND) continue;
    r.erase("status");
    if (r.contains("error")) rc = 1;
    if (o.json) {
      results.push_back(r);
    } else if (r.contains("text")) {
      std::cout << r["text"].get<std::string>();
    } else if (r.contains("error")) {
      std::cerr << "mrcache-seg: " << prefix << ": " << r["error"].get<std::string>() << "\n";
    }
  }
  if (o.json) {
    json out{{"domains", results}};
    if (o.prefix.empty()) {
      out["skipped"] = json::array();
      for (const Skipped &k : skipped) out["skipped"].push_back({{"file", k.file}, {"why", k.why}});
    }
    std::cout << out.dump(2) << "\n";
  } else if (prefixes.empty()) {
    std::cout << "no mrcache domain in /dev/shm\n";
  }
  return rc;
}

int cmd_show(const Options &o) {
  return for_each_domain(o, [&](const std::string &prefix) -> json {
    Observer d(o, prefix);
    if (!d.ok()) return d.failure(prefix);
    const unsigned flags = o.verbose ? static_cast<unsigned>(MRC_SEG_DESCRIBE_VERBOSE) : 0U;
    if (o.json) return json::parse(describe(d.get(), flags | MRC_SEG_DESCRIBE_JSON));
    return {{"prefix", prefix}, {"text", describe(d.get(), flags)}};
  });
}

int cmd_scan(const Options &o) {
  return for_each_domain(o, [&](const std::string &prefix) -> json {
    Observer d(o, prefix);
    if (!d.ok()) return d.failure(prefix);
    mrc_seg_domain_info_t before{}, after{};
    mrc_status_t st = mrc_seg_domain_info(d.get(), &before);
    if (st == MRC_OK) st = mrc_seg_domain_scan(d.get());
    if (st == MRC_OK) st = mrc_seg_domain_info(d.get(), &after);
    if (st != MRC_OK) return {{"prefix", prefix}, {"error", error_text(st)}};
    const uint64_t reaped = after.clients_reaped - before.clients_reaped;
    const unsigned segments_gone = before.segments - after.segments;
    json r{{"prefix", prefix},
           {"clients_removed", reaped},
           {"segments_removed", segments_gone},
           {"clients", after.clients},
           {"segments", after.segments}};
    r["text"] = prefix + ": removed " + std::to_string(reaped) + " dead clients and " +
                std::to_string(segments_gone) + " segments; " + std::to_string(after.clients) +
                " clients and " + std::to_string(after.segments) + " segments remain\n";
    if (o.json) r.erase("text");
    return r;
  });
}

int cmd_repair(const Options &o) {
  return for_each_domain(o, [&](const std::string &prefix) -> json {
    Observer d(o, prefix);
    if (!d.ok()) return d.failure(prefix);
    unsigned repaired = 0;
    const mrc_status_t st = mrc_seg_domain_repair(d.get(), &repaired);
    json r{{"prefix", prefix}, {"locks_recovered", repaired}};
    if (st != MRC_OK) {
      r["error"] = error_text(st);
      return r;
    }
    r["consistent"] = true;
    if (!o.json) {
      r["text"] = prefix + ": " + std::to_string(repaired) +
                  " locks recovered from dead owners; domain and heaps consistent\n";
    }
    return r;
  });
}

int cmd_remove(const Options &o) {
  if (o.prefix.empty()) throw CLI::ValidationError("remove", "needs --prefix");
  json r{{"prefix", o.prefix}};
  mrc_status_t st = MRC_OK;
  if (o.all) {
    const mrc_seg_domain_params_t p = params_for(o, o.prefix);
    unsigned removed = 0;
    st = mrc_seg_domain_remove(&p, &removed);
    r["files_removed"] = removed;
  } else {
    Observer d(o, o.prefix);
    if (!d.ok()) {
      r["error"] = d.error();
    } else {
      st = mrc_seg_remove(d.get(), o.name.c_str());
      r["segment"] = o.name;
      if (st != MRC_OK) r["error"] = error_text(st);  // before the handle's close resets it
    }
  }
  if (st != MRC_OK && !r.contains("error")) r["error"] = error_text(st);
  if (o.json) {
    std::cout << r.dump(2) << "\n";
  } else if (r.contains("error")) {
    std::cerr << "mrcache-seg: " << o.prefix << ": " << r["error"].get<std::string>() << "\n";
  } else if (o.all) {
    std::cout << o.prefix << ": removed " << r["files_removed"].get<unsigned>()
              << " files; nothing of the domain is left\n";
  } else {
    std::cout << o.prefix << ": removed segment " << o.name << "\n";
  }
  return r.contains("error") ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  mrc_tools::check_stdout_at_exit("mrcache-seg");
  Options o;
  CLI::App app{
      "mrcache-seg: list, inspect, scan, repair and remove mrcache shared-segment "
      "domains"};
  app.require_subcommand(1);
  app.add_option("--prefix", o.prefix, "the domain's name space (default: every domain found)")
      ->check([](const std::string &p) {
        return valid_prefix(p) ? std::string() : std::string("1..63 characters of [A-Za-z0-9._-]");
      });
  app.add_flag("--json", o.json, "print JSON");
  app.add_option("--base", o.base, "expect the window at this address (default: anywhere)");
  app.add_option("--size", o.size, "expect a window of this size");
  app.add_option("--timeout", o.timeout_ms, "milliseconds to wait for a creator or a lock");
  CLI::App *show = app.add_subcommand("show", "describe domains and their segments");
  show->add_flag("--verbose,-v", o.verbose, "generations, files, client slots, heap counters");
  app.add_subcommand("scan", "remove clients that died, and segments only they used");
  app.add_subcommand("repair",
                     "recover locks whose owner died (never one a live process holds), remove "
                     "dead clients and orphan files, check the domain and every heap");
  CLI::App *remove = app.add_subcommand("remove", "remove a segment, or the whole domain");
  remove->add_option("name", o.name, "the segment to remove");
  remove->add_flag("--all", o.all, "every segment no live process uses, then the domain");
  try {
    app.parse(argc, argv);
    if (remove->parsed() && o.all == !o.name.empty()) {
      throw CLI::ValidationError("remove", "give a segment NAME or --all");
    }
    if (show->parsed()) return cmd_show(o);
    if (app.got_subcommand("scan")) return cmd_scan(o);
    if (app.got_subcommand("repair")) return cmd_repair(o);
    if (remove->parsed()) return cmd_remove(o);
  } catch (const CLI::ParseError &e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception &e) {
    std::cerr << "mrcache-seg: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
