#!/usr/bin/env bash
# The dynamic symbol table of libmrcache.so.
#
# usage: check_symbols.sh only-mrc LIBMRCACHE_SO
#          every exported symbol is an mrc_* C API function: no C++ symbol, nothing of a
#          dependency (fmt, liburing) leaks; mrc_version and mrc_status_string are there.
#        check_symbols.sh complete LIBMRCACHE_SO PUBLIC_HEADER_DIR
#          every function the public headers declare MRC_API is exported (a declared but
#          undefined function is a link error in the consumer's program).
set -euo pipefail
mode=$1
so=$2

# nm -D --defined-only lists the version node (MRCACHE_0, type A) beside the functions and
# suffixes each name with its version (@@MRCACHE_0).
mapfile -t exported < <(nm -D --defined-only "$so" | awk '$2 != "A" {print $3}' | sed 's/@.*//' |
  sort -u)
declare -A is_exported=()
for sym in "${exported[@]}"; do is_exported[$sym]=1; done

case $mode in
  only-mrc)
    stray=()
    for sym in "${exported[@]}"; do
      [[ $sym == mrc_* ]] || stray+=("$sym")
    done
    if ((${#stray[@]})); then
      echo "FAIL: $so exports ${#stray[@]} symbol(s) outside the mrc_* C API:"
      printf '  %s\n' "${stray[@]:0:40}"
      exit 1
    fi
    for sym in mrc_version mrc_status_string; do
      [[ -n ${is_exported[$sym]:-} ]] || { echo "FAIL: $so does not export $sym"; exit 1; }
    done
    echo "ok: $so exports ${#exported[@]} symbols, all mrc_*"
    ;;
  complete)
    headers=$3
    # MRC_API <return type> <name>(  -- across line breaks
    mapfile -t declared < <(cat "$headers"/*.h | tr '\n' ' ' |
      grep -oE 'MRC_API[^;(]*[^A-Za-z0-9_]mrc_[A-Za-z0-9_]+[[:space:]]*\(' |
      grep -oE 'mrc_[A-Za-z0-9_]+[[:space:]]*\($' | tr -d '( ' | sort -u)
    ((${#declared[@]})) || { echo "FAIL: no MRC_API declaration found in $headers"; exit 1; }
    missing=()
    for sym in "${declared[@]}"; do
      [[ -n ${is_exported[$sym]:-} ]] || missing+=("$sym")
    done
    if ((${#missing[@]})); then
      echo "FAIL: ${#missing[@]} of ${#declared[@]} functions declared MRC_API in $headers are not" \
        "defined by $so:"
      printf '  %s\n' "${missing[@]}"
      exit 1
    fi
    echo "ok: all ${#declared[@]} MRC_API functions of $headers are exported by $so"
    ;;
  *)
    echo "usage: $0 only-mrc SO | complete SO HEADER_DIR" >&2
    exit 2
    ;;
esac
