#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# scripts/rxe/fi-oracle-matrix.sh BUILD_DIR [PLUGIN_DIR]: does a memory monitor let libfabric's own MR cache
# serve stale registrations? Runs INSIDE a soft-RoCE guest (scripts/rxe/vm.sh; the rxe lane's
# scripts/rxe/guest-tests.sh calls it): BUILD_DIR/tools/fi-oracle/mrcache-fi-oracle once per
# monitor, each with a clean environment but for what selects the monitor:
#   memhooks     FI_MR_CACHE_MONITOR=memhooks      (libc patching: raw syscalls are missed)
#   userfaultfd  FI_MR_CACHE_MONITOR=userfaultfd   (notifies after reading the event: races)
#   disabled     FI_MR_CACHE_MONITOR=disabled
#   cache-off    FI_MR_CACHE_MAX_COUNT=0           (no cache: the oracle's own control)
#   mrcache      FI_PROVIDER_PATH=PLUGIN_DIR       (only when PLUGIN_DIR is given: mrcache's
#                                                  provider plugin imports its monitor)
# and prints one table: monitor x (status, messages, stale, corrupt, errors/hang, cache hits),
# then the stale deliveries by scenario. Each run's JSON and log land in MRC_FI_ORACLE_OUT.
#
# Exit status: 0 when the lane proved something and mrcache (when present) was exact; 1 when
#   - the mrcache row has a stale or corrupt delivery, an error or a hang, its plugin did not
#     import its monitor, or its cache served no message (then no result would mean anything);
#   - neither memhooks nor userfaultfd showed a stale delivery (a lane in which no monitor
#     ever fails proves nothing about the one that does not);
#   - the cache-off row shows a stale or corrupt delivery (a bug of the oracle), or did not
#     complete;
#   2 on a usage error; 77 when BUILD_DIR has no mrcache-fi-oracle (configured without
#   libfabric-dev). Errors and hangs of libfabric's own monitors are reported, not failures:
#   libfabric's userfaultfd monitor can leave the sender in a page fault for good.
#
# Environment: MRC_FI_ORACLE_MESSAGES [8] messages per (op, scenario), MRC_FI_ORACLE_RACE [40]
# messages of the race scenario, MRC_FI_ORACLE_TIMEOUT [180] seconds per monitor,
# MRC_FI_ORACLE_OUT [BUILD_DIR/fi-oracle] where the JSON and logs go.
set -uo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR [PLUGIN_DIR]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
plugin=${2:-}
oracle=$build/tools/fi-oracle/mrcache-fi-oracle
messages=${MRC_FI_ORACLE_MESSAGES:-8}
race=${MRC_FI_ORACLE_RACE:-40}
run_timeout=${MRC_FI_ORACLE_TIMEOUT:-180}
out_dir=${MRC_FI_ORACLE_OUT:-$build/fi-oracle}

if [ ! -x "$oracle" ]; then
  echo "note: $oracle is not built (configure found no libfabric: apt-get install" \
    "libfabric-dev): skipped"
  exit 77
fi
if [ -n "$plugin" ]; then
  if [ ! -d "$plugin" ] || ! compgen -G "$plugin/*fi.so" >/dev/null; then
    echo "error: plugin directory $plugin has no provider plugin (*fi.so)" >&2
    exit 2
  fi
  plugin=$(cd "$plugin" && pwd)
fi
mkdir -p "$out_dir" || exit 2

monitors=(memhooks userfaultfd disabled cache-off)
[ -n "$plugin" ] && monitors+=(mrcache)
monitor_env() {  # the environment assignments of one row
  case $1 in
    memhooks | userfaultfd | disabled) echo "FI_MR_CACHE_MONITOR=$1" ;;
    cache-off) echo "FI_MR_CACHE_MAX_COUNT=0" ;;
    mrcache) echo "FI_PROVIDER_PATH=$plugin" ;;
  esac
}

# Did the plugin import its monitor? libfabric logs it (ofi_monitor_import) at info level, and
# fi_info loads the plugins as every program does. A separate run: the oracle's own stays
# untouched but for FI_PROVIDER_PATH.
plugin_imports() {
  if ! command -v fi_info >/dev/null; then
    echo "note: no fi_info (libfabric-bin): cannot check that the plugin imports its monitor"
    return 0
  fi
  local log
  log=$(env -u FI_MR_CACHE_MONITOR -u FI_MR_CACHE_MAX_COUNT FI_PROVIDER_PATH="$plugin" \
    FI_LOG_LEVEL=info FI_LOG_SUBSYS=mr timeout 60 fi_info -l 2>&1)
  if grep -q 'setting imported memory monitor as default' <<<"$log"; then
    echo "plugin: $plugin imports its memory monitor (libfabric: \"setting imported memory" \
      "monitor as default\")"
    return 0
  fi
  echo "plugin: $plugin did NOT import a memory monitor (no \"setting imported memory monitor" \
    "as default\" at FI_LOG_LEVEL=info); libfabric said:"
  grep -iE 'mrcache|monitor|import|fi_prov_ini|dlopen' <<<"$log" | head -20 | sed 's/^/  /'
  return 1
}

field() {  # field NAME: NAME=VALUE of the oracle's summary line in $summary
  sed -nE "s/.* $1=([^ ]+).*/\1/p" <<<" ${summary#fi-oracle-summary:}"
}

declare -A status stale corrupt errors msgs hits not_reused rc_of
declare -A by_scenario  # "monitor scenario" -> "stale messages"
scenarios=(none free munmap raw fixed dontneed mremap race)
import_ok=1

for m in "${monitors[@]}"; do
  echo "=== fi-oracle: $m ($(monitor_env "$m"))"
  if [ "$m" = mrcache ] && ! plugin_imports; then
    import_ok=0
  fi
  args=(--messages "$messages" --race-messages "$race" --op-timeout 20
    --timeout "$((run_timeout - 30))" --json "$out_dir/$m.json")
  [ "$m" = mrcache ] && args+=(--expect-exact)
  log=$out_dir/$m.log
  t0=$SECONDS
  # A clean slate for what selects the monitor, then the row's own setting; `timeout` is the
  # backstop should the oracle's own bounds fail.
  # shellcheck disable=SC2046  # monitor_env prints one assignment without spaces
  env -u FI_MR_CACHE_MONITOR -u FI_MR_CACHE_MAX_COUNT -u FI_PROVIDER_PATH $(monitor_env "$m") \
    timeout -k 10 "$run_timeout" "$oracle" "${args[@]}" >"$log" 2>&1
  rc=$?
  cat "$log"
  echo "(exit $rc, $((SECONDS - t0)) s)"
  rc_of[$m]=$rc
  summary=$(grep '^fi-oracle-summary:' "$log" | tail -1)
  if [ -z "$summary" ]; then
    if [ $rc = 124 ] || [ $rc = 137 ]; then status[$m]="killed"; else status[$m]="no-result"; fi
    stale[$m]=0 corrupt[$m]=0 errors[$m]=1 msgs[$m]=0 hits[$m]=0 not_reused[$m]=0
  else
    status[$m]=$(field status)
    stale[$m]=$(field stale)
    corrupt[$m]=$(field corrupt)
    errors[$m]=$(field errors)
    msgs[$m]=$(field messages)
    hits[$m]=$(field cache_hits)
    not_reused[$m]=$(field not_reused)
  fi
  # The per-(op, scenario) lines of the oracle's table: "send raw 8 8 0 0 0 0".
  for s in "${scenarios[@]}"; do
    read -r st ms < <(awk -v s="$s" '($1 == "send" || $1 == "write" || $1 == "read") && $2 == s {
      st += $4; ms += $3 } END { print st + 0, ms + 0 }' "$log")
    by_scenario["$m $s"]="$st/$ms"
  done
done

echo
echo "=== fi-oracle matrix: libfabric $(fi_info --version 2>/dev/null | sed -n 's/^libfabric: //p' |
  head -1), verbs;ofi_rxm on ${RXE_DEV1:-?} -> ${RXE_DEV0:-?}, $messages messages per" \
  "(op, scenario), $race for race"
printf '%-12s %-9s %9s %6s %8s %12s %11s %11s\n' monitor status messages stale corrupt \
  errors/hang not-reused cache-hits
for m in "${monitors[@]}"; do
  printf '%-12s %-9s %9s %6s %8s %12s %11s %11s\n' "$m" "${status[$m]}" "${msgs[$m]}" \
    "${stale[$m]}" "${corrupt[$m]}" "${errors[$m]}" "${not_reused[$m]}" "${hits[$m]}"
done
[ -n "$plugin" ] ||
  echo "mrcache      (absent: no plugin directory given, so no libmrcache-fi.so row)"
echo
echo "stale/messages by scenario (send + write + read):"
printf '%-12s' monitor
printf ' %9s' "${scenarios[@]}"
echo
for m in "${monitors[@]}"; do
  printf '%-12s' "$m"
  for s in "${scenarios[@]}"; do printf ' %9s' "${by_scenario["$m $s"]}"; done
  echo
done
echo "(cache-hits: control messages the cache served without registering; JSON and logs in" \
  "$out_dir)"

failed=0
verdict() { echo "FAIL: $*"; failed=1; }
if [ -n "$plugin" ]; then
  m=mrcache
  if [ "${stale[$m]}" != 0 ] || [ "${corrupt[$m]}" != 0 ]; then
    verdict "mrcache: ${stale[$m]} stale and ${corrupt[$m]} corrupt deliveries"
  fi
  if [ "${status[$m]}" != ok ] || [ "${errors[$m]}" != 0 ]; then
    verdict "mrcache: the run did not complete (status ${status[$m]}, exit ${rc_of[$m]})"
  fi
  [ $import_ok = 1 ] ||
    verdict "mrcache: the plugin did not import its monitor; the row measured libfabric's default"
  [ "${hits[$m]:-0}" != 0 ] ||
    verdict "mrcache: the cache served no control message: it was not in use, the row" \
      "proves nothing"
fi
if [ "${stale[memhooks]}" = 0 ] && [ "${stale[userfaultfd]}" = 0 ]; then
  verdict "neither memhooks nor userfaultfd showed a stale delivery: this lane cannot tell an" \
    "exact monitor from a broken one (is the cache in use? cache hits: memhooks" \
    "${hits[memhooks]}, userfaultfd ${hits[userfaultfd]})"
fi
if [ "${stale[cache-off]}" != 0 ] || [ "${corrupt[cache-off]}" != 0 ]; then
  verdict "cache-off: ${stale[cache-off]} stale and ${corrupt[cache-off]} corrupt deliveries" \
    "with no cache at all: a bug of the oracle"
fi
[ "${status[cache-off]}" = ok ] ||
  verdict "cache-off: the control run did not complete (status ${status[cache-off]})"
if [ $failed = 0 ]; then
  echo "fi-oracle matrix: PASS"
else
  echo "fi-oracle matrix: FAIL"
fi
exit $failed
