#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The library's naming style (.clang-tidy: readability-identifier-naming and its CheckOptions):
# clang-tidy with only that check over every library source (base/ pgtable/ uffd/ backends/ bpf/
# core/) that a build directory's compile_commands.json lists, and the library headers they
# include (the public C headers in include/mrcache/ follow C's style and are not checked).
# Prints each finding, then a one-line summary. Exit 0 when clean, 1 on any finding (or a
# source clang-tidy cannot parse), 2 on a usage error.
#
# usage: scripts/check-naming.sh BUILD_DIR
#   BUILD_DIR  a configured build (CMAKE_EXPORT_COMPILE_COMMANDS is on); only the headers the build
#              generates are built here (target mrc_generated_headers: the eBPF skeleton)
# env: CLANG_TIDY (default clang-tidy), MRC_JOBS (default nproc)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
(($# == 1)) || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" 2>/dev/null && pwd) || { echo "check-naming: no directory $1" >&2; exit 2; }
tidy=${CLANG_TIDY:-clang-tidy}
jobs=${MRC_JOBS:-$(nproc)}
libs='base|pgtable|uffd|backends|bpf|core'

db=$build/compile_commands.json
[[ -f $db ]] || { echo "check-naming: no $db (configure a build first)" >&2; exit 2; }
command -v "$tidy" >/dev/null || { echo "check-naming: $tidy not found (scripts/setup.sh)" >&2; exit 2; }

# Sources include generated headers (bpf/changes.skel.h): clang-tidy parses them, so they must be.
if [[ -f $build/build.ninja ]] && grep -q '^build mrc_generated_headers:' "$build/build.ninja"; then
  ninja -C "$build" mrc_generated_headers >/dev/null ||
    { echo "check-naming: building the generated headers failed" >&2; exit 2; }
fi

# The "file" entries of the compilation database, relative to the repository.
mapfile -t files < <(grep -oE '"file": *"[^"]+"' "$db" | sed -E 's/"file": *"(.*)"/\1/' |
  sed "s|^$repo/||" | grep -E "^($libs)/" | grep -E '\.(c|cc|cpp)$' | sort -u)
((${#files[@]})) || { echo "check-naming: no library source in $db" >&2; exit 2; }

started=$SECONDS
out=$(mktemp /tmp/mrcache-naming.XXXXXX)
trap 'rm -f "$out"' EXIT
# -Wno-error: a compiler warning that the build's -Werror would turn into an error is not this
# check's business (clang warns where GCC, the project's compiler, does not).
status=0
(cd "$repo" && printf '%s\0' "${files[@]}" |
  xargs -0 -n 1 -P "$jobs" "$tidy" -p "$build" --quiet --extra-arg=-Wno-error \
    --checks='-*,readability-identifier-naming' --warnings-as-errors='*' \
    --header-filter="^$repo/($libs)/") >"$out" 2>&1 || status=$?

# One finding per "file:line:col: error: ... [check]" line; a header's finding reached from
# several sources counts once.
mapfile -t findings < <(grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$out" |
  sed "s|^$repo/||" | sort -u)
elapsed=$((SECONDS - started))
if ((${#findings[@]})); then
  printf '%s\n' "${findings[@]}"
  echo "check-naming: ${#findings[@]} findings in ${#files[@]} sources ($elapsed s);" \
    "style: .clang-tidy, readability-identifier-naming"
  exit 1
fi
if ((status != 0)); then
  # clang-tidy failed without a finding we could parse: show what it said.
  cat "$out"
  echo "check-naming: clang-tidy failed (status $status) on ${#files[@]} sources ($elapsed s)"
  exit 1
fi
echo "check-naming: ${#files[@]} sources follow the naming style ($elapsed s)"
