#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# clang-tidy (the repository's .clang-tidy) over every C/C++ source of the project that a build
# directory's compile_commands.json lists. Prints the findings, then a count per check.
# Exit 0 when clean, 1 when there are findings, 2 on a usage error.
#
# usage: scripts/tidy.sh [BUILD_DIR] [PATH_REGEX]
#   BUILD_DIR   a configured build (default: build); CMAKE_EXPORT_COMPILE_COMMANDS is on
#   PATH_REGEX  only files whose repository path matches (default: every library, tool and test
#               source), e.g. '^(pgtable|core)/'
# env: CLANG_TIDY (default clang-tidy), MRC_JOBS (default nproc)
# The naming check alone, as CI runs it on the library: scripts/check-naming.sh.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build}
filter=${2:-'^(base|pgtable|uffd|backends|core|tools|tests)/'}
tidy=${CLANG_TIDY:-clang-tidy}
jobs=${MRC_JOBS:-$(nproc)}

db=$build/compile_commands.json
[[ -f $db ]] || { echo "tidy: no $db (configure a build first: scripts/test.sh)" >&2; exit 2; }
command -v "$tidy" >/dev/null || { echo "tidy: $tidy not found (scripts/setup.sh)" >&2; exit 2; }

# The "file" entries of the compilation database, relative to the repository.
mapfile -t files < <(grep -oE '"file": *"[^"]+"' "$db" | sed -E 's/"file": *"(.*)"/\1/' |
  sed "s|^$repo/||" | grep -E "$filter" | grep -E '\.(c|cc|cpp)$' | sort -u)
((${#files[@]})) || { echo "tidy: no source matches '$filter' in $db" >&2; exit 2; }

out=$(mktemp /tmp/mrcache-tidy.XXXXXX)
echo "tidy: ${#files[@]} files, $jobs jobs, findings in $out"
(cd "$repo" && printf '%s\0' "${files[@]}" |
  xargs -0 -n 1 -P "$jobs" "$tidy" -p "$build" --quiet 2>/dev/null) >"$out" || true

# One finding per "file:line:col: warning: ... [check]" line; the same header finding reached
# from several files counts once.
mapfile -t findings < <(grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$out" | sort -u)
if ((${#findings[@]} == 0)); then
  echo "tidy: clean"
  exit 0
fi
printf '%s\n' "${findings[@]}"
echo
echo "tidy: ${#findings[@]} findings; by check:"
printf '%s\n' "${findings[@]}" | grep -oE '\[[a-z0-9.,-]+\]$' | sort | uniq -c | sort -rn
echo "full output with notes and fix-its: $out"
exit 1
