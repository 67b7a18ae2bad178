// SPDX-License-Identifier: BSD-3-Clause
// The tools' numeric validators (cli_numbers.h).
#include "tools/common/cli_numbers.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

namespace mrc_tools {

bool parse_unsigned(const std::string &text, uint64_t *out) {
  if (text.empty() || text.size() > 20) return false;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
  }
  errno = 0;
  char *end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = value;
  return true;
}

CLI::Validator unsigned_range(uint64_t min_value, uint64_t max_value) {
  const std::string range =
      "[" + std::to_string(min_value) + ", " + std::to_string(max_value) + "]";
  return CLI::Validator(
      [=](std::string &input) -> std::string {
        uint64_t value = 0;
        if (!parse_unsigned(input, &value) || value < min_value || value > max_value) {
          return "'" + input + "' is not a whole number in " + range;
        }
        return {};
      },
      "UINT in " + range);
}

CLI::Validator finite_range(double min_value, double max_value) {
  std::ostringstream range;
  range << "[" << min_value << ", " << max_value << "]";
  const std::string text = range.str();
  return CLI::Validator(
      [=](std::string &input) -> std::string {
        errno = 0;
        char *end = nullptr;
        const double value = std::strtod(input.c_str(), &end);
        if (input.empty() || end != input.c_str() + input.size() || errno == ERANGE ||
            !std::isfinite(value) || value < min_value || value > max_value) {
          return "'" + input + "' is not a finite number in " + text;
        }
        return {};
      },
      "NUMBER in " + text);
}

CLI::Validator byte_size(uint64_t min_value, uint64_t max_value) {
  const std::string range =
      "[" + std::to_string(min_value) + ", " + std::to_string(max_value) + "]";
  return CLI::Validator(
      [=](std::string &input) -> std::string {
        size_t digits = 0;
        while (digits < input.size() && input[digits] >= '0' && input[digits] <= '9') ++digits;
        uint64_t value = 0;
        std::string unit = input.substr(digits);
        for (char &c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        unsigned shift = 0;
        const std::map<std::string, unsigned> units{
            {"", 0},     {"b", 0},  {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
            {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40}};
        const auto it = units.find(unit);
        bool ok =
            digits != 0 && it != units.end() && parse_unsigned(input.substr(0, digits), &value);
        if (ok) {
          shift = it->second;
          ok = shift == 0 || value <= (std::numeric_limits<uint64_t>::max() >> shift);
        }
        if (ok) value <<= shift;
        if (!ok || value < min_value || value > max_value) {
          return "'" + input + "' is not a size in bytes in " + range +
                 " (a whole number, optionally with k, m, g or t)";
        }
        input = std::to_string(value);
        return {};
      },
      "SIZE in " + range);
}

}  // namespace mrc_tools
