#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The dynamic symbol table of libmrcache.so.
#
# usage: check_symbols.sh only-mrc LIBMRCACHE_SO
#          every exported symbol is an mrc_* C API function: no C++ symbol, nothing of a
#          dependency (fmt, liburing) leaks; mrc_version and mrc_status_string are there.
#        check_symbols.sh complete LIBMRCACHE_SO PUBLIC_HEADER_DIR
#          every function the public headers declare MRC_API is exported (a declared but
#          undefined function is a link error in the consumer's program).
#        check_symbols.sh versioned LIBMRCACHE_SO PUBLIC_HEADER_DIR VERSION_MAP [OLD_HEADER_DIR NODE]
#          every MRC_API function is named in a node of the version map (a function in no node
#          would fall under `local: *` and vanish from the library) and exported with a default
#          version (name@@NODE); with OLD_HEADER_DIR, every MRC_API function of that release's
#          headers is still exported as name@NODE or name@@NODE (what its programs reference).
set -euo pipefail
mode=$1
so=$2

# nm -D --defined-only lists the version nodes (MRCACHE_0, MRCACHE_0.2, type A) beside the
# functions and suffixes each name with its version: name@@NODE for the default a new link
# binds to, name@NODE for an older version kept for programs linked before.
mapfile -t versioned < <(nm -D --defined-only "$so" | awk '$2 != "A" {print $3}' | sort -u)
mapfile -t exported < <(printf '%s\n' "${versioned[@]}" | sed 's/@.*//' | sort -u)
declare -A is_exported=() has_version=()
for sym in "${exported[@]}"; do is_exported[$sym]=1; done
for sym in "${versioned[@]}"; do
  has_version[$sym]=1
  [[ $sym == *@@* ]] && has_version[${sym%%@@*}@@]=1
done

# MRC_API <return type> <name>(  -- across line breaks
declared_in() {
  cat "$1"/*.h | tr '\n' ' ' |
    grep -oE 'MRC_API[^;(]*[^A-Za-z0-9_]mrc_[A-Za-z0-9_]+[[:space:]]*\(' |
    grep -oE 'mrc_[A-Za-z0-9_]+[[:space:]]*\($' | tr -d '( ' | sort -u
}

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
    mapfile -t declared < <(declared_in "$headers")
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
  versioned)
    headers=$3
    map=$4
    mapfile -t declared < <(declared_in "$headers")
    ((${#declared[@]})) || { echo "FAIL: no MRC_API declaration found in $headers"; exit 1; }
    # Comments stripped, then every "name;" inside a node's braces.
    mapfile -t in_map < <(sed 's@/\*.*\*/@@; /\/\*/,/\*\//d' "$map" |
      grep -oE '^[[:space:]]+mrc_[A-Za-z0-9_]+;' | tr -d ' ;' | sort -u)
    declare -A is_mapped=()
    for sym in "${in_map[@]}"; do is_mapped[$sym]=1; done
    fail=0
    for sym in "${declared[@]}"; do
      if [[ -z ${is_mapped[$sym]:-} ]]; then
        echo "FAIL: $sym is declared MRC_API but named in no node of $map"
        fail=1
      elif [[ -z ${has_version[$sym@@]:-} ]]; then
        echo "FAIL: $so exports no default version ($sym@@NODE) of $sym"
        fail=1
      fi
    done
    if (($# >= 6)); then
      old_headers=$5
      node=$6
      mapfile -t old < <(declared_in "$old_headers")
      for sym in "${old[@]}"; do
        if [[ -z ${has_version[$sym@$node]:-} && -z ${has_version[$sym@@$node]:-} ]]; then
          echo "FAIL: $so lost $sym@$node, which programs built against $old_headers reference"
          fail=1
        fi
      done
      echo "checked: the ${#old[@]} MRC_API functions of $old_headers are exported @$node"
    fi
    ((fail == 0)) || exit 1
    echo "ok: all ${#declared[@]} MRC_API functions of $headers are in a node of $map," \
      "with a default version"
    ;;
  *)
    echo "usage: $0 only-mrc SO | complete SO HEADER_DIR | versioned SO HEADER_DIR MAP [OLD NODE]" >&2
    exit 2
    ;;
esac
