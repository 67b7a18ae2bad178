#!/usr/bin/env bash
# Fails (exit 1) when a tracked C/C++ file differs from what clang-format makes of it, and lists
# those files. Usage: scripts/check-format.sh [--fix]   (--fix rewrites them in place)
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

if ((${#unformatted[@]})); then
  echo "check-format: ${#unformatted[@]} of ${#files[@]} files are not clang-formatted:"
  printf '  %s\n' "${unformatted[@]}"
  echo "fix with: scripts/check-format.sh --fix   (or clang-format -i FILE)"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
