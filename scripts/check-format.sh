#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Fails (exit 1) when a tracked C/C++ file differs from what clang-format makes of it, or when a
# tracked source file (C/C++, CMake, shell, gnuplot, linker map, template) lacks its licence line
# (`SPDX-License-Identifier: BSD-3-Clause` in its first two lines), and lists those files.
# Usage: scripts/check-format.sh [--fix]   (--fix rewrites the unformatted ones in place)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "check-format: $CLANG_FORMAT not found (scripts/setup.sh installs it)" >&2
  exit 2
fi

mapfile -d '' files < <(git ls-files -z -- '*.h' '*.cc' '*.c' '*.hpp')
if [[ ${1:-} == --fix ]]; then
  ((${#files[@]})) && "$CLANG_FORMAT" -i -- "${files[@]}"
  exit 0
fi

unformatted=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue  # deleted in the work tree but still in the index
  if ! "$CLANG_FORMAT" --dry-run -Werror -- "$f" >/dev/null 2>&1; then
    unformatted+=("$f")
  fi
done

unlicensed=()
mapfile -d '' sources < <(git ls-files -z -- '*.h' '*.cc' '*.c' '*.hpp' '*.sh' '*.gp' '*.map' \
  '*.in' '*.cmake' '*CMakeLists.txt' .ci/run)
for f in "${sources[@]}"; do
  [[ -f $f ]] || continue
  head -n 2 -- "$f" | grep -q 'SPDX-License-Identifier: BSD-3-Clause' || unlicensed+=("$f")
done
if ((${#unlicensed[@]})); then
  echo "check-format: ${#unlicensed[@]} files lack 'SPDX-License-Identifier: BSD-3-Clause' in" \
    "their first two lines (LICENSE):"
  printf '  %s\n' "${unlicensed[@]}"
  exit 1
fi

if ((${#unformatted[@]})); then
  echo "check-format: ${#unformatted[@]} of ${#files[@]} files are not clang-formatted:"
  printf '  %s\n' "${unformatted[@]}"
  echo "fix with: scripts/check-format.sh --fix   (or clang-format -i FILE)"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
