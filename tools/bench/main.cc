// SPDX-License-Identifier: BSD-3-Clause
// mrcache-bench's main: Google Benchmark's, after checks of what it would take on trust.
//
// Google Benchmark (1.7) parses its own flags and takes much on trust: a --benchmark_min_time or
// --benchmark_min_warmup_time of nan, inf or 1e30 runs a slow benchmark for hours (up to 10^9
// iterations each); --benchmark_repetitions=-1 aborts and =0 runs nothing; a bad
// --benchmark_format, --benchmark_time_unit or an empty --benchmark_color prints the usage and
// exits 0; a bool flag takes any word ("no" is true); an empty --benchmark_out or
// --benchmark_filter is silently "none" or "all". The same values come from environment variables
// (BENCHMARK_MIN_TIME, ...). So every argument and every such variable is checked here first,
// against the flags this version knows, and a malformed MRC_* variable (which makes
// mrc_cache_create refuse, and the cache benchmarks abort) is named before any benchmark starts.
//
// Exit status: 0 = the benchmarks ran; 1 = none ran (the filter matched nothing) or standard
// output could not be written; 2 = bad usage (an argument, a BENCHMARK_* or MRC_* variable).
#include <benchmark/benchmark.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mrcache/mrcache.h"
#include "tools/common/stdout_check.h"

namespace {

enum class Kind { kBool, kSeconds, kWarmupSeconds, kRepetitions, kVerbosity, kText, kChoice };

struct Flag {
  const char *name;  // without the leading "--"
  Kind kind;
  const char *choices;  // kChoice: the values, separated by '|'
};

// The flags of Google Benchmark 1.7 (benchmark.cc, ParseCommandLineFlags), --help aside.
constexpr Flag kFlags[] = {
    {"benchmark_list_tests", Kind::kBool, nullptr},
    {"benchmark_filter", Kind::kText, nullptr},
    {"benchmark_min_time", Kind::kSeconds, nullptr},
    {"benchmark_min_warmup_time", Kind::kWarmupSeconds, nullptr},
    {"benchmark_repetitions", Kind::kRepetitions, nullptr},
    {"benchmark_enable_random_interleaving", Kind::kBool, nullptr},
    {"benchmark_report_aggregates_only", Kind::kBool, nullptr},
    {"benchmark_display_aggregates_only", Kind::kBool, nullptr},
    {"benchmark_format", Kind::kChoice, "console|json|csv"},
    {"benchmark_out", Kind::kText, nullptr},
    {"benchmark_out_format", Kind::kChoice, "console|json|csv"},
    {"benchmark_color", Kind::kChoice, "auto|true|false|yes|no|on|off|1|0"},
    {"benchmark_counters_tabular", Kind::kBool, nullptr},
    {"benchmark_perf_counters", Kind::kText, nullptr},
    {"benchmark_context", Kind::kText, nullptr},
    {"benchmark_time_unit", Kind::kChoice, "ns|us|ms|s"},
    {"v", Kind::kVerbosity, nullptr},
};

// Seconds a benchmark (or its warm-up) may be asked to run at least: beyond an hour each, a run
// of this program's 200-odd benchmarks would not end in any useful time.
constexpr double kMaxSeconds = 3600;
constexpr long kMaxRepetitions = 1000;

bool one_of(const std::string &value, const char *choices) {
  const std::string list = std::string("|") + choices + "|";
  return list.find("|" + value + "|") != std::string::npos;
}

bool parse_double(const std::string &text, double *out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) != 0) return false;
  errno = 0;
  char *end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return errno == 0 && *end == '\0' && std::isfinite(*out);
}

bool parse_long(const std::string &text, long *out) {
  if (text.empty() || (text[0] != '-' && std::isdigit(static_cast<unsigned char>(text[0])) == 0)) {
    return false;
  }
  errno = 0;
  char *end = nullptr;
  *out = std::strtol(text.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}

// Why `value` is not good for `flag` ("" when it is). `given`: whether "=value" was there at all.
std::string check_value(const Flag &flag, const std::string &value, bool given) {
  if (flag.kind == Kind::kBool) {
    return !given || one_of(value, "true|false|1|0") ? "" : "want true or false";
  }
  if (!given) return "needs a value: --" + std::string(flag.name) + "=VALUE";
  double seconds = 0;
  long count = 0;
  switch (flag.kind) {
    case Kind::kSeconds:
      return parse_double(value, &seconds) && seconds > 0 && seconds <= kMaxSeconds
                 ? ""
                 : "want seconds, a finite number in (0, 3600]";
    case Kind::kWarmupSeconds:
      return parse_double(value, &seconds) && seconds >= 0 && seconds <= kMaxSeconds
                 ? ""
                 : "want seconds, a finite number in [0, 3600]";
    case Kind::kRepetitions:
      return parse_long(value, &count) && count >= 1 && count <= kMaxRepetitions
                 ? ""
                 : "want a whole number in [1, 1000]";
    case Kind::kVerbosity:
      return parse_long(value, &count) && count >= 0 && count <= 100
                 ? ""
                 : "want a whole number in [0, 100]";
    case Kind::kChoice:
      return one_of(value, flag.choices) ? "" : std::string("want one of ") + flag.choices;
    case Kind::kText:
      if (value.empty()) return "is empty";
      if (std::strcmp(flag.name, "benchmark_context") == 0) {
        // key=value[,key=value...]
        size_t start = 0;
        for (;;) {
          const size_t comma = std::min(value.find(',', start), value.size());
          const std::string item = value.substr(start, comma - start);
          const size_t eq = item.find('=');
          if (eq == std::string::npos || eq == 0) return "want key=value[,key=value...]";
          if (comma == value.size()) break;
          start = comma + 1;
        }
      }
      return "";
    case Kind::kBool: break;
  }
  return "";
}

const Flag *find_flag(const std::string &name) {
  for (const Flag &flag : kFlags) {
    if (name == flag.name) return &flag;
  }
  return nullptr;
}

// "" when every argument is one Google Benchmark takes, with a good value; else why not.
std::string check_arguments(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help") continue;
    if (arg.rfind("--", 0) != 0) {
      return "unexpected argument '" + arg + "' (flags are --benchmark_NAME=VALUE)";
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Flag *flag = find_flag(name);
    if (flag == nullptr) return "unknown flag '" + arg + "' (see --help)";
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    const std::string why = check_value(*flag, value, eq != std::string::npos);
    if (!why.empty()) return "'" + arg + "': --" + name + " " + why;
  }
  return "";
}

// The same checks for the variables that set the flags' defaults: the flag's name in upper case
// (BENCHMARK_MIN_TIME, ...). Not V, the --v of Google Benchmark: it is also make's, and a bad one
// is ignored with a message, which is harmless.
std::string check_environment() {
  for (const Flag &flag : kFlags) {
    if (flag.kind == Kind::kVerbosity) continue;
    std::string variable;
    for (const char *c = flag.name; *c != '\0'; ++c) {
      variable += static_cast<char>(std::toupper(static_cast<unsigned char>(*c)));
    }
    const char *value = std::getenv(variable.c_str());
    if (value == nullptr) continue;
    const std::string why = check_value(flag, value, true);
    if (!why.empty()) return variable + "=" + value + ": " + why;
  }
  return "";
}

}  // namespace

int main(int argc, char **argv) {
  mrc_tools::check_stdout_at_exit("mrcache-bench");
  std::string why = check_arguments(argc, argv);
  if (why.empty()) why = check_environment();
  if (!why.empty()) {
    std::fprintf(stderr, "mrcache-bench: %s\n", why.c_str());
    return 2;
  }
  mrc_cache_params_t params;
  char env_error[512] = "";
  if (mrc_cache_params_init_checked(&params, env_error, sizeof env_error) != MRC_OK) {
    std::fprintf(stderr, "mrcache-bench: %s\n", env_error);
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  const size_t ran = benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (ran == 0) {
    // Google Benchmark said why (no match, or a filter that is not a regex).
    std::fprintf(stderr, "mrcache-bench: no benchmark ran\n");
    return 1;
  }
  return 0;
}
