// SPDX-License-Identifier: BSD-3-Clause
// Validators for the tools' numeric command-line options. CLI11 (2.1) converts "-1" to an
// unsigned 64-bit option by wrapping it to 2^64-1 (strtoull), accepts "nan" and "inf" for
// doubles, and its CLI::Range lets NaN through (NaN compares false with both bounds). Every
// numeric option of a tool therefore goes through one of these, so that a bad value is a usage
// error (exit 2) naming the option, never a run that does something else.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace mrc_tools {

// A decimal integer: digits only (no sign, no 0x), no overflow.
bool parse_unsigned(const std::string &text, uint64_t *out);
// A decimal integer in [min_value, max_value].
CLI::Validator unsigned_range(uint64_t min_value, uint64_t max_value);
// A finite number in [min_value, max_value] (strtod syntax; NaN and infinities refused).
CLI::Validator finite_range(double min_value, double max_value);
// A byte count: a decimal integer with an optional unit k, m, g or t (powers of 1024; "kb",
// "kib" and upper case too), in [min_value, max_value]. A transform: the option receives the
// number of bytes. Replaces CLI::AsSizeValue, which wraps "-1" to 2^64-1.
CLI::Validator byte_size(uint64_t min_value, uint64_t max_value);

}  // namespace mrc_tools
