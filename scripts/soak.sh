#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The soak: mrcache-stress again and again, rotating through its configurations, until the runs
# together have done OPS operations (default 10^8: two to three hours on 2 cores). The
# configurations cover the whole mutation mix, hot (parked) and nested ranges, forks, injected
# registration failures, exact and fast mode, with and without learning which ranges churn, the monitor's modes (the best the kernel offers,
# and MISSING), and the PFN oracle over the null backend where the machine allows it (root:
# /proc/self/pagemap shows frames); the io_uring oracle everywhere. Each run prints one line;
# the end gives the operations, stale registrations, leaks and errors summed over all runs.
# Exits 1 at the first run that fails (any stale, leak or error; its output is shown), 2 on a
# usage or set-up error, 0 otherwise.
#
# usage: scripts/soak.sh [-n OPS] [--slice SECONDS] [--max-time SECONDS] [-B BUILD_DIR]
#                        [--no-setup] [-j N] [-- CMAKE_ARGS...]
#   -n OPS              operations in all (default: $MRC_SOAK_OPS or 100000000; 2e6 and 1e8
#                       forms are fine)
#   --slice SECONDS     length of each run (default: $MRC_SOAK_SLICE or 60)
#   --max-time SECONDS  start no run after this many seconds, even short of OPS (default: none;
#                       CI's bounded slice uses it so that a slow machine cannot stretch the lane)
#   the rest as in scripts/test.sh (the build is build/ by default, like scripts/stress.sh)
set -euo pipefail
# shellcheck source=scripts/lib/build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build.sh"
mrc_parse_args "$@"

ops_wanted=${MRC_SOAK_OPS:-100000000}
slice=${MRC_SOAK_SLICE:-60}
max_time=0
set -- "${mrc_rest_args[@]}"
while (($#)); do
  case $1 in
    -n) ops_wanted=$2; shift 2 ;;
    --slice) slice=$2; shift 2 ;;
    --max-time) max_time=$2; shift 2 ;;
    *) echo "soak.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
# 1e8, 2.5e6: whole numbers in scientific notation.
if [[ $ops_wanted =~ ^([0-9]+)(\.([0-9]+))?e([0-9]+)$ ]]; then
  ops_wanted=$(awk -v v="$ops_wanted" 'BEGIN { printf "%d", v }')
fi
for value in "$ops_wanted" "$slice" "$max_time"; do
  if ! [[ $value =~ ^[0-9]+$ ]]; then
    echo "soak.sh: '$value' is not a whole number (see --help)" >&2
    exit 2
  fi
done
((ops_wanted > 0 && slice > 0)) || { echo "soak.sh: -n and --slice must be > 0" >&2; exit 2; }

mrc_run_setup
mrc_configure >/dev/null
mrc_build --target mrcache-stress
stress=$mrc_build_dir/tools/stress/mrcache-stress

# name|environment|arguments: the rotation. The default mix has every mutation but fork, which
# --fork-rate drives.
# The PFN oracle (null backend) only where the frames are visible (root); its runs come early
# in the rotation, so that a short soak has them too.
pfn=()
if "$stress" -q -d 0.2 --backend null --churn 0 >/dev/null 2>&1; then
  pfn=("pfn||--backend null" "pfn-fast-inject||--backend null --fast --fail-rate 0.1 --fork-rate 2")
  echo "soak: the PFN oracle works here: null-backend runs included"
else
  echo "soak: the PFN oracle cannot work here (it needs root for /proc/self/pagemap): io_uring runs only"
fi
configs=(
  "exact||"
  # Hot pages parked in several threads' lines, taken back by every mutation kind, with the
  # moment a put parks into a line its reclaimer empties widened (core/cache/testing.h).
  "hot-parked|MRC_TEST_PARK_WINDOW=50000|--hot-threads 4"
  "hot-parked-fast|MRC_TEST_PARK_WINDOW=50000|--fast --hot-threads 4"
  "${pfn[@]:0:1}"
  "fast||--fast"
  "inject-forks||--fail-rate 0.05 --fork-rate 4"
  "missing|MRC_MONITOR=missing|"
  "${pfn[@]:1:1}"
  "hot-nested||--hot-rate 0.5 --nest-rate 0.5 --invalidate-rate 0.05 --mix remap=4,move=2,shrink=2,grow=2,unmap-tail=2,dontneed=3,free=2,fixed=3,purge=0.5"
  "missing-fast-inject|MRC_MONITOR=missing|--fast --fail-rate 0.02 --fork-rate 2"
  # Every registration cached, even of mappings that churn (the cache learns by default to
  # register those uncached): the unmap window with the most cached churn.
  "exact-cache-churn|MRC_CACHE_CHURN=1|"
  "fast-cache-churn|MRC_CACHE_CHURN=1|--fast"
)

json=$(mktemp /tmp/mrcache-soak.XXXXXX.json)
out=$(mktemp /tmp/mrcache-soak.XXXXXX.log)
trap 'rm -f "$json" "$out"' EXIT

field() { sed -n "s/^  \"$1\": \"\\{0,1\\}\\([^,\"]*\\)\"\\{0,1\\},\\{0,1\\}\$/\\1/p" "$json" | head -n 1; }

status=0
total_ops=0 total_stale=0 total_leaks=0 total_errors=0 total_forks=0 total_injected=0 runs=0
started=$SECONDS
i=0
mrc_log "soak: $ops_wanted operations in runs of $slice s$( ((max_time)) && echo ", at most $max_time s")"
while ((total_ops < ops_wanted)); do
  if ((max_time && SECONDS - started >= max_time)); then
    echo "soak: time limit (--max-time $max_time) reached after $total_ops operations"
    break
  fi
  IFS='|' read -r name env_text args_text <<<"${configs[i % ${#configs[@]}]}"
  i=$((i + 1))
  # shellcheck disable=SC2206
  envs=(${env_text})
  # shellcheck disable=SC2206
  args=(${args_text})
  rm -f "$json"
  status=0
  env "${envs[@]}" "$stress" -q -d "$slice" --json "$json" "${args[@]}" >"$out" 2>&1 || status=$?
  runs=$((runs + 1))
  if [[ ! -s $json ]]; then
    echo "soak: run $runs ($name) ended with status $status and no summary:"
    cat "$out"
    exit $((status == 2 ? 2 : 1))
  fi
  ops=$(field ops) stale=$(field stale) leaks=$(field leak_count) errors=$(field errors)
  forks=$(field forks) injected=$(field injected_failures)
  total_ops=$((total_ops + ops)) total_stale=$((total_stale + stale))
  total_leaks=$((total_leaks + leaks)) total_errors=$((total_errors + errors))
  total_forks=$((total_forks + forks)) total_injected=$((total_injected + injected))
  printf 'soak: run %d %-20s %s: %s ops, %s stale, %s leaks, %s errors, %s forks, %s injected (monitor %s, seed %s)\n' \
    "$runs" "$name" "$([[ $status == 0 ]] && echo passed || echo FAILED)" "$ops" "$stale" \
    "$leaks" "$errors" "$forks" "$injected" "$(field monitor_mode)" "$(field seed)"
  if ((status != 0)); then
    echo "soak: run $runs ($name: ${env_text:+$env_text }mrcache-stress ${args_text}) failed:"
    cat "$out"
    break
  fi
done

printf '\nsoak: %d operations in %d runs, %d s: %d stale, %d leaks, %d errors (%d forks, %d injected failures)\n' \
  "$total_ops" "$runs" $((SECONDS - started)) "$total_stale" "$total_leaks" "$total_errors" \
  "$total_forks" "$total_injected"
if ((status != 0 || total_stale || total_leaks || total_errors)); then
  echo "soak: FAILED"
  exit 1
fi
echo "soak: PASSED"
