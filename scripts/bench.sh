#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmarks: builds mrcache-appbench and mrcache-bench (Release) and runs them, the application
# suite first, then the micro-benchmarks, and writes into the results directory:
#   app.md, app.json, app-*.dat, app.png   mrcache-appbench: application workloads (fresh
#                buffers, pools, pools beside allocator churn, halo exchanges) through mrcache,
#                UCX's rcache and no cache, over the null and io_uring engines, unbound and
#                bound to one CPU; every trial a fresh process (tools/appbench/main.cc)
# mrcache-bench measures the page table, the monitor, the backends and the cache, each against
# UCX in the same run when libucx-dev is installed:
#   bench-monitor.json, bench-rest.json   Google Benchmark's JSON (--benchmark_out); the
#                monitor's benchmarks run in a process of their own (UCX's rcache patches libc's
#                munmap for the rest of its process)
#   bench.log    the console output (including bench_pgtable's own ratio summary)
#   results.md   the application table, then a Markdown table of every micro-benchmark figure
#                and of the mrcache/UCX ratios
#   bench.png    lookup latency versus regions, hit throughput versus threads (gnuplot)
#
# How figures are paired with their UCX twin (tools/bench-report/bench_report.cc): the names
# differ in one place only — a path component "ours" <-> "ucx" (PgtLookup/ours/dense/1000 <->
# PgtLookup/ucx/dense/1000), or the first component BM_<Family><Workload> <->
# BM_Ucx<UcxFamily><Workload> with Cache <-> Rcache, Pgt <-> Pgtable, Monitor <-> Ucm, X <-> X
# (BM_CacheHit/shared:0/real_time/threads:2 <-> BM_UcxRcacheHit/shared:0/real_time/threads:2),
# a cache mode component of ours (exact, fast) being absent in UCX's name.
# A new benchmark file gets compared with UCX by following one of these two forms.
#
# usage: scripts/bench.sh [-B BUILD_DIR] [--no-setup] [-j N] [-o DIR] [--filter REGEX]
#                         [--repetitions N] [--min-time SECONDS] [-- CMAKE_ARGS...]
#   -B DIR           build directory (default: build-release/ in the repository)
#   -o DIR           results directory (default: bench-results/ in the repository)
#   --filter REGEX   only these benchmarks (--benchmark_filter), e.g. 'Pgt|Hit'
#   --repetitions N  run each benchmark N times and report the median (default 1)
#   --min-time S     minimum time per benchmark (Google Benchmark's default: 0.5)
#   --no-build       use the programs already built in BUILD_DIR
#   --app-only       the application suite only;  --no-app  the micro-benchmarks only
# env: MRC_BENCH_ARGS (more mrcache-bench arguments), MRC_APPBENCH_ARGS (more mrcache-appbench
#      arguments, e.g. "-r 9 --min-time 0.5" or "-w halo")
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${MRC_BUILD_DIR:=$repo/build-release}"
# shellcheck source=scripts/lib/build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build.sh"
mrc_parse_args "$@"

results=$repo/bench-results
filter=
repetitions=1
min_time=
build=1
app=1 micro=1
set -- "${mrc_rest_args[@]+"${mrc_rest_args[@]}"}"
while (($#)); do
  case $1 in
    -o) results=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --repetitions) repetitions=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --app-only) micro=0; shift ;;
    --no-app) app=0; shift ;;
    *) echo "bench.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $results == /* ]] || results=$PWD/$results

if ((build)); then
  mrc_run_setup
  # Release: the figures are what users get. Later arguments win over mrc_configure's defaults.
  mrc_extra_cmake_args=(-DCMAKE_BUILD_TYPE=Release "${mrc_extra_cmake_args[@]+"${mrc_extra_cmake_args[@]}"}")
  mrc_configure
  # Captured first: `cmake ... | grep -q` fails under pipefail when grep exits early (SIGPIPE).
  targets=$(cmake --build "$mrc_build_dir" --target help 2>/dev/null || true)
  if ! grep -q '^mrcache-bench:' <<<"$targets"; then
    echo "bench.sh: this tree has no mrcache-bench target (no tools/bench/bench_*.cc yet?)" >&2
    exit 1
  fi
  mrc_build --target mrcache-bench mrcache-bench-report mrcache-appbench
fi
bench=$mrc_build_dir/tools/bench/mrcache-bench
report=$mrc_build_dir/tools/bench-report/mrcache-bench-report
appbench=$mrc_build_dir/tools/appbench/mrcache-appbench
for program in "$bench" "$report" "$appbench"; do
  [[ -x $program ]] || { echo "bench.sh: $program is missing" >&2; exit 1; }
done

mkdir -p "$results"
rm -f "$results"/app*.dat "$results"/app.{md,json,png,log}
if ((app)); then
  # shellcheck disable=SC2206
  app_args=(-o "$results" ${MRC_APPBENCH_ARGS:-})
  mrc_log "$appbench ${app_args[*]}"
  set +e
  "$appbench" "${app_args[@]}" 2>&1 | tee "$results/app.log"
  status=${PIPESTATUS[0]}
  set -e
  ((status == 0)) || { echo "bench.sh: mrcache-appbench failed (exit $status)" >&2; exit "$status"; }
  if command -v gnuplot >/dev/null; then
    gnuplot -e "dir='$results'" "$repo/scripts/appbench.gp"
    echo "plot: $results/app.png"
  fi
fi
if ((!micro)); then
  exit 0
fi
common=(--benchmark_out_format=json)
if ((repetitions > 1)); then
  common+=(--benchmark_repetitions="$repetitions" --benchmark_report_aggregates_only=true)
fi
[[ -n $min_time ]] && common+=(--benchmark_min_time="$min_time")
# shellcheck disable=SC2206
common+=(${MRC_BENCH_ARGS:-})

# One process per group: creating a UCX rcache (bench_cache) patches libc's munmap for the rest
# of the process, which would distort the monitor's munmap figures (bench_monitor.cc).
runs=()
if [[ -n $filter ]]; then
  runs+=("all:$filter")
else
  runs+=("monitor:BM_Monitor" "rest:-BM_Monitor")
fi
rm -f "$results"/bench*.json
: >"$results/bench.log"
inputs=()
for run in "${runs[@]}"; do
  name=${run%%:*}
  out=$results/bench-$name.json
  mrc_log "$bench --benchmark_filter=${run#*:} --benchmark_out=$out ${common[*]}"
  set +e
  "$bench" --benchmark_filter="${run#*:}" --benchmark_out="$out" "${common[@]}" 2>&1 |
    tee -a "$results/bench.log"
  status=${PIPESTATUS[0]}
  set -e
  if ((status != 0)); then
    echo "bench.sh: mrcache-bench failed (exit $status); see $results/bench.log" >&2
    exit "$status"
  fi
  # A filter that selects nothing leaves no file (Google Benchmark says "Failed to match").
  [[ -s $out ]] && inputs+=("$out")
done
if ((${#inputs[@]} == 0)); then
  echo "bench.sh: no benchmark ran (filter '$filter')" >&2
  exit 1
fi

mrc_log "report"
flags=$("$report" "${inputs[@]}" "$results")
grep -v '^plot_' <<<"$flags" || true
# plot_lookup_ucx=1 -> have_lookup_ucx=1; for gnuplot
gp_vars=$(sed -n 's/^plot_\([a-z_]*\)=\([01]\)$/have_\1=\2; /p' <<<"$flags" | tr -d '\n')
if command -v gnuplot >/dev/null; then
  gnuplot -e "dir='$results'; $gp_vars" "$repo/scripts/bench-report.gp"
  echo "plot: $results/bench.png"
else
  echo "bench.sh: gnuplot is not installed (scripts/setup.sh installs gnuplot-nox): no plot" >&2
fi
# The application table leads (what applications see), then the micro-benchmarks.
if [[ -f $results/app.md ]]; then
  { printf '## Application workloads\n\n'; cat "$results/app.md"
    printf '\n## Micro-benchmarks\n\n'; cat "$results/results.md"; } >"$results/results.md.new"
  mv "$results/results.md.new" "$results/results.md"
fi
echo
cat "$results/results.md"
