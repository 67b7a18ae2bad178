#!/usr/bin/env bash
# rxe-guest-tests.sh BUILD_DIR: the test list of the rxe lane. Runs INSIDE the soft-RoCE guest
# (scripts/ci-rxe.sh starts it through `scripts/rxe-vm.sh run --rw BUILD_DIR`), with rxe0/rxe1
# up and RXE_DEV0/RXE_GID0... in the environment. Every step runs even after a failure, so that
# one log shows all of them; the exit status is 0 only when no step failed.
#
# Steps:
#   sanity     ibv_devinfo shows $RXE_DEV0 with PORT_ACTIVE
#   selfcheck  BUILD_DIR/rxe-selfcheck/rxe_selfcheck (tests/rxe/rxe_selfcheck.c): registration,
#              RC RDMA READ loopback and rxe1 -> rxe0, rejection of a wrong rkey
#   ctest      ctest -L verbs in BUILD_DIR; running zero tests is a FAILURE, never a pass
#   stress     mrcache-stress --backend verbs --duration 20, when BUILD_DIR has it (else a note)
#   fi-oracle  scripts/fi-oracle-matrix.sh BUILD_DIR [PLUGIN_DIR]: libfabric's own MR cache under
#              its monitors (memhooks and userfaultfd must show stale deliveries, no cache none)
#              and, when BUILD_DIR/integrations/libfabric has libmrcache-fi.so, under mrcache's
#              (which must be exact); skipped (a note) when BUILD_DIR has no mrcache-fi-oracle
# shellcheck disable=SC2317  # the step functions are called through `step`
set -uo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${RXE_DEV0:=rxe0}"
stress_seconds=${MRC_RXE_STRESS_SECONDS:-20}
ctest_timeout=${MRC_RXE_CTEST_TIMEOUT:-300}

declare -a summary=()
failed=0
step() {  # step NAME COMMAND...: runs COMMAND, records its verdict and duration; 77 = skipped
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== rxe-lane: $name"
  "$@"
  rc=$?
  if [ $rc = 0 ]; then
    summary+=("PASS  $name ($((SECONDS - t0)) s)")
  elif [ $rc = 77 ]; then
    summary+=("SKIP  $name")
  else
    summary+=("FAIL  $name (exit $rc, $((SECONDS - t0)) s)")
    failed=1
  fi
}

sanity() {
  local info
  info=$(ibv_devinfo -d "$RXE_DEV0") || { echo "ibv_devinfo -d $RXE_DEV0 failed"; return 1; }
  echo "$info" | grep -E 'hca_id|state|active_mtu|link_layer'
  grep -q PORT_ACTIVE <<<"$info" || { echo "$RXE_DEV0 is not PORT_ACTIVE"; return 1; }
}

selfcheck() {
  local bin=$build/rxe-selfcheck/rxe_selfcheck
  [ -x "$bin" ] || { echo "$bin missing (scripts/ci-rxe.sh builds it)"; return 1; }
  "$bin" "$RXE_DEV0" "${RXE_DEV1:-}"
}

verbs_ctest() {
  local out=/tmp/rxe-lane-ctest.log rc
  # Several labels travel as one comma-joined label ("backend,verbs", tests/CMakeLists.txt):
  # match verbs as a whole element of it.
  ctest --test-dir "$build" -L '(^|,)verbs(,|$)' --output-on-failure --no-tests=error \
    --timeout "$ctest_timeout" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  # --no-tests=error already fails on an empty selection; the grep keeps that true even if a
  # ctest version treats the option differently.
  if grep -q 'No tests were found' "$out"; then
    echo "ctest -L verbs selected no test: the verbs tests are not built (or lost their label)"
    return 1
  fi
  return "$rc"
}

stress() {
  local bin
  bin=$(find "$build" -name mrcache-stress -type f -perm -u+x -print -quit)
  if [ -z "$bin" ]; then
    echo "note: mrcache-stress is not built in $build: step skipped"
    return 77
  fi
  "$bin" --backend verbs --duration "$stress_seconds"
}

fi_oracle() {
  local oracle=$build/tools/fi-oracle/mrcache-fi-oracle plugin=$build/integrations/libfabric
  if [ ! -x "$oracle" ]; then
    echo "note: mrcache-fi-oracle is not built in $build (no libfabric-dev at configure time):" \
      "step skipped"
    return 77
  fi
  if [ -f "$plugin/libmrcache-fi.so" ]; then
    bash "$scripts/fi-oracle-matrix.sh" "$build" "$plugin"
  else
    echo "note: no $plugin/libmrcache-fi.so: libfabric's own monitors only, no mrcache row"
    bash "$scripts/fi-oracle-matrix.sh" "$build"
  fi
}

step sanity sanity
step selfcheck selfcheck
step "ctest -L verbs" verbs_ctest
step "mrcache-stress --backend verbs" stress
step fi-oracle fi_oracle

echo "=== rxe-lane summary"
printf '  %s\n' "${summary[@]}"
exit $failed
