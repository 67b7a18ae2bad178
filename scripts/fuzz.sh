#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs each libFuzzer target of tests/fuzz (api, env, segment, monitor: see tests/fuzz/CMakeLists.txt)
# for a bounded time under ASan+UBSan, starting from the seed corpus in the repository, then
# replays the seeds and tests/fuzz/regressions/ through them (ctest -L fuzz). Prints each
# target's executions and coverage (libFuzzer's final statistics) and fails (exit 1) when a
# target crashed, leaked, hung or ran out of memory; the input that did it is kept as
# <build>/fuzz-artifacts/<target>-crash-* (replay it: <build>/tests/fuzz/mrc_fuzz_<target> FILE).
# A fixed crash becomes a regression test: copy the input to tests/fuzz/regressions/<target>-NAME.
#
# usage: scripts/fuzz.sh [-t SECONDS] [-B BUILD_DIR] [--no-setup] [-j N] [TARGET...]
#   -t SECONDS    how long each target runs (default: $MRC_FUZZ_SECONDS or 90)
#   -B DIR        build directory (default: build-fuzz/ in the repository)
#   --no-setup    do not run scripts/setup.sh (which also installs clang and libFuzzer here)
#   -j N          targets fuzzed at once, one core each (default: nproc, or $MRC_JOBS)
#   TARGET...     some of: api env segment monitor (default: $MRC_FUZZ_TARGETS or all four)
# env: MRC_FUZZ_SECONDS, MRC_FUZZ_TARGETS, MRC_FUZZ_ARGS (more libFuzzer flags, e.g. -jobs=2)
#
# The corpus each target grows is kept in <build>/fuzz-corpus/<target> (the repository's seeds
# are copied in first), so later runs start where earlier ones stopped. The build is clang's
# (-DMRC_BUILD_FUZZERS=ON refuses another compiler), Debug at -O1 with the library's own checks
# on, like the sanitizer lanes.
set -euo pipefail
# shellcheck source=scripts/lib/build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build.sh"
mrc_build_dir=${MRC_FUZZ_BUILD_DIR:-$mrc_repo/build-fuzz}
mrc_parse_args "$@"

# The targets, each with its settings: a target is known exactly when it has them all.
known_targets=(api env segment monitor)
declare -A max_len=([api]=1024 [env]=512 [segment]=256 [monitor]=1024)
# Programs of operations (api, monitor) and lists of corruptions (segment) say more when long:
# no slow growth of the input length from a few bytes (libFuzzer's default -len_control=100).
declare -A len_control=([api]=0 [env]=100 [segment]=0 [monitor]=0)

seconds=${MRC_FUZZ_SECONDS:-90}
# shellcheck disable=SC2206
targets=(${MRC_FUZZ_TARGETS:-})
set -- "${mrc_rest_args[@]}"
chosen=()
while (($#)); do
  case $1 in
    -t) seconds=$2; shift 2 ;;
    -t*) seconds=${1#-t}; shift ;;
    -*) echo "fuzz.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    *) chosen+=("$1"); shift ;;
  esac
done
((${#chosen[@]})) && targets=("${chosen[@]}")
((${#targets[@]})) || targets=("${known_targets[@]}")
for t in "${targets[@]}"; do
  if [[ -z ${max_len[$t]:-} ]]; then
    echo "fuzz.sh: unknown target: $t (known: ${known_targets[*]})" >&2
    exit 2
  fi
done
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: -t: '$seconds' is not a whole number of seconds > 0" >&2
  exit 2
fi

# clang and its libFuzzer runtime, with the rest of the project's packages.
export MRC_SETUP_EXTRA="${MRC_SETUP_EXTRA:-} clang libclang-rt-14-dev"
mrc_run_setup

mrc_log "configure $mrc_build_dir (clang, -DMRC_BUILD_FUZZERS=ON, address,undefined)"
generator=()
[[ -f $mrc_build_dir/CMakeCache.txt ]] || generator=(-G Ninja)
CC=clang CXX=clang++ cmake -S "$mrc_repo" -B "$mrc_build_dir" "${generator[@]}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMRC_BUILD_FUZZERS=ON \
  -DMRC_SANITIZE=address,undefined -DMRC_BUILD_TOOLS=OFF -DMRC_BUILD_BENCH=OFF \
  -DMRC_WERROR=OFF -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-O1 -g" \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" "${mrc_extra_cmake_args[@]}" >/dev/null
build_targets=()
for t in "${targets[@]}"; do build_targets+=("mrc_fuzz_$t" "mrc_fuzz_${t}_replay"); done
mrc_build --target "${build_targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# The segment target names its files /dev/shm/mrcfuzz-<pid>-*: a crash leaves them behind.
clean_shm() {
  local f pid
  for f in /dev/shm/mrcfuzz-*; do
    [[ -e $f ]] || continue
    pid=${f#/dev/shm/mrcfuzz-}
    pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null || rm -f "$f"
  done
}

# shellcheck disable=SC2206
extra=(${MRC_FUZZ_ARGS:-})
mkdir -p "$mrc_build_dir/fuzz-artifacts" "$mrc_build_dir/fuzz-logs"

# fuzz_target T: runs T's fuzzer for the time given, then writes what to print about it to
# fuzz-logs/T.report and its verdict (ok or failed) to fuzz-logs/T.verdict.
fuzz_target() {
  local t=$1 corpus=$mrc_build_dir/fuzz-corpus/$1 log=$mrc_build_dir/fuzz-logs/$1.log
  local report=$mrc_build_dir/fuzz-logs/$1.report status=0 dict=() last execs rate cov
  mkdir -p "$corpus"
  cp -n "$mrc_repo/tests/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true
  [[ -f $mrc_repo/tests/fuzz/$t.dict ]] && dict=("-dict=$mrc_repo/tests/fuzz/$t.dict")
  # -timeout: an input that runs 30 s is a hang (a finding); -rss_limit_mb: the forks and
  # ASan's shadow stay well below it unless something leaks or allocates wildly.
  "$mrc_build_dir/tests/fuzz/mrc_fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 \
    -len_control="${len_control[$t]}" \
    -timeout=30 -rss_limit_mb=4096 -max_len="${max_len[$t]}" \
    -artifact_prefix="$mrc_build_dir/fuzz-artifacts/$t-" "${dict[@]}" "${extra[@]}" \
    "$corpus" >"$log" 2>&1 || status=$?
  clean_shm
  # The last progress line (cov: edges, ft: features, corp: inputs) and the final statistics.
  last=$(grep -E '^#[0-9]+[[:space:]].*cov: ' "$log" | tail -n 1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(sed -E -n 's/.* cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+).*/\1 edges, \2 features, corpus \3/p' \
    <<<"$last")
  {
    echo "fuzz $t (log: $log)"
    grep -E '^stat::' "$log" || true
    echo "$last"
    if ((status != 0)); then
      echo "fuzz: $t FAILED (libFuzzer exit $status); the report:"
      grep -E -A40 '^==[0-9]+==ERROR|fuzz harness:|runtime error:|^SUMMARY' "$log" | head -n 80 || true
      ls "$mrc_build_dir/fuzz-artifacts/$t-"* 2>/dev/null || true
    fi
  } >"$report"
  if ((status != 0)); then
    echo "failed $t: FAILED after ${execs:-?} executions; ${cov:-no coverage line}"
  else
    echo "ok $t: ${execs:-?} executions (${rate:-?}/s) in ${seconds} s; coverage ${cov:-?}"
  fi >"$mrc_build_dir/fuzz-logs/$t.verdict"
}

# A fuzzer keeps one core busy: as many run at once as there are jobs (-j), each for the time
# given, so the targets' executions do not depend on how many there are.
mrc_log "fuzz ${targets[*]} for ${seconds} s each, ${mrc_jobs} at a time"
running=0
for t in "${targets[@]}"; do
  rm -f "$mrc_build_dir/fuzz-logs/$t.verdict"
  if ((running >= mrc_jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_target "$t" &
  running=$((running + 1))
done
wait

failed=()
summary=()
for t in "${targets[@]}"; do
  cat "$mrc_build_dir/fuzz-logs/$t.report" 2>/dev/null || true
  verdict=$(cat "$mrc_build_dir/fuzz-logs/$t.verdict" 2>/dev/null || echo "failed $t: no verdict")
  [[ $verdict == ok\ * ]] || failed+=("$t")
  summary+=("${verdict#* }")
done

mrc_log "replay the seeds and tests/fuzz/regressions (ctest -L fuzz)"
ctest_status=0
ctest --test-dir "$mrc_build_dir" -L '(^|,)fuzz(,|$)' --output-on-failure --no-tests=error \
  --timeout 300 -R "$(printf 'fuzz\\.(%s)\\.' "$(IFS='|'; echo "${targets[*]}")")" ||
  ctest_status=$?
clean_shm
((ctest_status == 0)) || failed+=("replay")

printf '\n==> fuzz summary\n'
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $mrc_build_dir/fuzz-artifacts/)"
  exit 1
fi
echo "fuzz: no crash, leak or hang in ${targets[*]}"
