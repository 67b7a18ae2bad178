#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Enforces the layer order of SOURCES.md on every #include of the library's sources:
#
#   layer 0  include/mrcache/  may include: mrcache/                         third-party: none
#   layer 1  base/             may include: mrcache/ base/                   third-party: none
#   layer 2  pgtable/          may include: mrcache/ base/ pgtable/          third-party: none
#   layer 3  bpf/              may include: mrcache/ base/ bpf/              libbpf
#   layer 3  uffd/             may include: mrcache/ base/ bpf/ uffd/        liburing
#   layer 3  backends/         may include: mrcache/ base/ backends/         liburing, rdma-core
#   layer 4  core/cache/       may include: every layer above, core/cache/   fmt, libnuma, all above
#   layer 4  core/segment/     may include: mrcache/ base/ core/segment/     fmt, libnuma
#   layer 4  core/monitor/     may include: mrcache/ base/ uffd/ core/monitor/   liburing
#                              (it reaches the cache through the public C API only)
#   layer 5  tools/ tests/     not checked for the order (they see the library); tools/ is
#                              checked for the private headers below
#
# Test-only controls (`<component>/testing.h`) are never included by the library, except by the file
# that defines them (testing_definers below).
#
# A component's private headers live in its `internal/` folder (`pgtable/internal/`,
# `uffd/internal/`, `core/segment/internal/`): only the component's own files include them. This
# is checked for every file of the tree outside tests/ (tests may see private headers), tools/,
# integrations/ and examples/ included.
#
# Standard C, C++ and POSIX/Linux headers are always allowed. An include is resolved like the
# compiler does: first next to the including file, then from the source root and include/.
# Exit 1 with one line per violation.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

# Third-party headers, by library, as they appear in #include lines.
tp_uring='^liburing(\.h|/)'
tp_verbs='^(infiniband|rdma)/'
tp_fmt='^fmt/'
tp_numa='^(numa|numaif|numacompat1)\.h$'
# libbpf's headers share the bpf/ prefix with our component: these names are libbpf's.
tp_bpf='^bpf/(bpf|btf|libbpf|libbpf_common|libbpf_legacy|libbpf_version|bpf_helpers|bpf_helper_defs|bpf_tracing|bpf_core_read|bpf_endian)\.h$'
tp_test='^(gtest|gmock|benchmark|CLI|nlohmann)/'
tp_ucx='^(ucs|uct|ucp|ucm)/'

# layer_of PATH (relative to the root) -> layer name, or "" when it is not one of ours.
layer_of() {
  case $1 in
    include/mrcache/*) echo public ;;
    base/*) echo base ;;
    pgtable/*) echo pgtable ;;
    uffd/*) echo uffd ;;
    backends/*) echo backends ;;
    bpf/*) echo bpf ;;
    core/cache/*) echo cache ;;
    core/segment/*) echo segment ;;
    core/monitor/*) echo monitor ;;
    core/*) echo core ;;
    tools/*) echo tools ;;
    tests/*) echo tests ;;
    *) echo "" ;;
  esac
}

# allowed_internal LAYER TARGET_PATH -> 0 when LAYER may include TARGET_PATH.
allowed_internal() {
  local layer=$1 target=$2 tl
  tl=$(layer_of "$target")
  [[ $tl == "$layer" ]] && return 0
  case $layer:$tl in
    base:public) return 0 ;;
    pgtable:public | pgtable:base) return 0 ;;
    uffd:public | uffd:base | uffd:bpf | backends:public | backends:base) return 0 ;;
    bpf:public | bpf:base) return 0 ;;
    cache:public | cache:base | cache:pgtable | cache:uffd | cache:backends | cache:bpf) return 0 ;;
    segment:public | segment:base) return 0 ;;
    monitor:public | monitor:base | monitor:uffd | monitor:bpf) return 0 ;;
  esac
  return 1
}

# allowed_external LAYER HEADER -> 0 when LAYER may include the non-project HEADER.
allowed_external() {
  local layer=$1 h=$2
  [[ $h =~ $tp_test || $h =~ $tp_ucx ]] && return 1
  case $layer in
    public | base | pgtable)
      [[ $h =~ $tp_uring || $h =~ $tp_verbs || $h =~ $tp_fmt || $h =~ $tp_numa || $h =~ $tp_bpf ]] && return 1 ;;
    bpf)
      [[ $h =~ $tp_uring || $h =~ $tp_verbs || $h =~ $tp_fmt || $h =~ $tp_numa ]] && return 1 ;;
    uffd)
      [[ $h =~ $tp_verbs || $h =~ $tp_fmt || $h =~ $tp_numa || $h =~ $tp_bpf ]] && return 1 ;;
    backends)
      [[ $h =~ $tp_fmt || $h =~ $tp_numa || $h =~ $tp_bpf ]] && return 1 ;;
    segment)
      [[ $h =~ $tp_uring || $h =~ $tp_verbs || $h =~ $tp_bpf ]] && return 1 ;;
    monitor)
      [[ $h =~ $tp_verbs || $h =~ $tp_fmt || $h =~ $tp_numa || $h =~ $tp_bpf ]] && return 1 ;;
  esac
  return 0
}

# resolve FILE HEADER -> the project path HEADER names, or "" for a header from outside.
resolve() {
  local dir candidate rel
  dir=$(dirname "$1")
  for candidate in "$dir/$2" "$2" "include/$2"; do
    if [[ -f $candidate ]]; then
      rel=$(realpath -m --relative-to="$root" "$candidate")
      [[ $rel == ../* ]] || { echo "$rel"; return; }
    fi
  done
  # Not on disk (yet): judge by the path.
  if [[ $2 == ./* || $2 == ../* ]]; then
    realpath -m --relative-to="$root" "$dir/$2"
    return
  fi
  [[ $2 =~ $tp_bpf ]] && { echo ""; return; }
  case $2 in
    mrcache/*) echo "include/$2" ;;
    base/* | pgtable/* | uffd/* | backends/* | bpf/* | core/* | tools/* | tests/*) echo "$2" ;;
    *) echo "" ;;
  esac
}

# The files that define a component's test-only controls, and so include its testing.h
# (uffd/testing_env.cc is compiled into test programs and tools only, not into the library).
testing_definers=" base/proc_maps.cc uffd/testing.cc uffd/testing_env.cc core/cache/testing.cc core/cache/testing_env.cc "

# internal_owner PATH -> the component folder whose private header PATH is ("" when it is none).
internal_owner() {
  [[ $1 == */internal/* ]] && echo "${1%%/internal/*}"
  return 0
}

violations=0
checked=0
mapfile -d '' files < <(git ls-files -z --cached --others --exclude-standard -- \
  'include/mrcache/*' 'base/*' 'pgtable/*' 'uffd/*' 'backends/*' 'bpf/*' 'core/*')
for f in "${files[@]}"; do
  [[ -f $f && $f =~ \.(h|hpp|hh|c|cc|cpp|inc|ipp)$ ]] || continue
  layer=$(layer_of "$f")
  checked=$((checked + 1))
  while IFS= read -r line; do
    lineno=${line%%:*}
    text=${line#*:}
    [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\<\"]([^\>\"]+)[\>\"] ]] || continue
    header=${BASH_REMATCH[1]}
    target=$(resolve "$f" "$header")
    owner=$(internal_owner "$target")
    if [[ -n $owner && $f != "$owner"/* ]]; then
      why="$target is private to $owner/ (its internal/ folder)"
    elif [[ -n $target && $target == */testing.h && $testing_definers != *" $f "* ]]; then
      why="library code may not include the test-only $target"
    elif [[ -n $target ]]; then
      allowed_internal "$layer" "$target" && continue
      why="layer $layer may not include $target"
    else
      allowed_external "$layer" "$header" && continue
      why="layer $layer may not use the third-party header <$header>"
    fi
    echo "$f:$lineno: $why (SOURCES.md)"
    violations=$((violations + 1))
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f" || true)
done

# Outside the library (tests/ excepted): only the rule of private headers.
mapfile -d '' others < <(git ls-files -z --cached --others --exclude-standard -- \
  'tools/*' 'integrations/*' 'examples/*')
for f in "${others[@]}"; do
  [[ -f $f && $f =~ \.(h|hpp|hh|c|cc|cpp|inc|ipp)$ ]] || continue
  checked=$((checked + 1))
  while IFS= read -r line; do
    lineno=${line%%:*}
    text=${line#*:}
    [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\<\"]([^\>\"]+)[\>\"] ]] || continue
    target=$(resolve "$f" "${BASH_REMATCH[1]}")
    owner=$(internal_owner "$target")
    [[ -n $owner && $f != "$owner"/* ]] || continue
    echo "$f:$lineno: $target is private to $owner/ (its internal/ folder) (SOURCES.md)"
    violations=$((violations + 1))
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f" || true)
done

if ((violations)); then
  echo "check-layers: $violations include(s) break the layer order of SOURCES.md"
  exit 1
fi
echo "check-layers: $checked files obey the layer order"
