#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# scripts/rxe/guest-tests.sh BUILD_DIR: the test list of the rxe lane. Runs INSIDE the soft-RoCE guest
# (scripts/rxe/ci.sh starts it through `scripts/rxe/vm.sh run --rw BUILD_DIR`), with rxe0/rxe1
# up and RXE_DEV0/RXE_GID0... in the environment. Every step runs even after a failure, so that
# one log shows all of them; the exit status is 0 only when no step failed.
#
# Steps:
#   sanity     ibv_devinfo shows $RXE_DEV0 with PORT_ACTIVE
#   selfcheck  BUILD_DIR/rxe-selfcheck/rxe_selfcheck (scripts/rxe/selfcheck.c): registration,
#              RC RDMA READ loopback and rxe1 -> rxe0, rejection of a wrong rkey
#   ctest      ctest -L verbs in BUILD_DIR; running zero tests is a FAILURE, never a pass
#   stress     mrcache-stress --backend verbs --duration 20, when BUILD_DIR has it (else a note)
#   fi-oracle  scripts/rxe/fi-oracle-matrix.sh BUILD_DIR [PLUGIN_DIR]: libfabric's own MR cache under
#              its monitors (memhooks and userfaultfd must show stale deliveries, no cache none)
#              and, when BUILD_DIR/integrations/libfabric has libmrcache-fi.so, under mrcache's
#              (which must be exact); skipped (a note) when BUILD_DIR has no mrcache-fi-oracle
#   fi-pingpong  fi_pingpong (libfabric-bin, a program mrcache did not write) over verbs;ofi_rxm,
#              FI_EP_RDM, at 64 KiB and 1 MiB (rendezvous sizes), once under libfabric's default
#              monitor and once under mrcache's imported one (BUILD_DIR/integrations/libfabric):
#              both must complete, and the mrcache run must import mrcache's monitor and report
#              subscribes; prints both runs' figures and their ratio. Skipped (exit 77, a note)
#              when fi_pingpong or libmrcache-fi.so is missing.
#   bpf        ctest -L bpf in BUILD_DIR with MRC_BPF_REQUIRED=1 (the eBPF monitor's tests, whose
#              programs this stock kernel loads: a refusal fails them instead of skipping),
#              when BUILD_DIR has the programs (bpf/changes.bpf.o); running zero tests is a
#              FAILURE. Without the programs (configured without clang, bpftool or libbpf-dev):
#              a FAILURE when MRC_RXE_BPF_REQUIRED=1 (scripts/rxe/ci.sh sets it under CI),
#              else skipped (exit 77, a note). Last: every other step has run before the
#              programs are attached to this kernel.
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
# fi_pingpong runs, "SIZE:ITERATIONS" each: both above FI_OFI_RXM_SAR_LIMIT, so rendezvous.
read -r -a pingpong_runs <<<"${MRC_RXE_PINGPONG_RUNS:-65536:100 1048576:20}"
ctest_timeout=${MRC_RXE_CTEST_TIMEOUT:-300}
bpf_required=${MRC_RXE_BPF_REQUIRED:-0}

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
  [ -x "$bin" ] || { echo "$bin missing (scripts/rxe/ci.sh builds it)"; return 1; }
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

# fi_pingpong through libfabric's MR cache, as Debian ships it. What this can and cannot show:
# fi_pingpong always offers FI_MR_LOCAL (its hints, not an option), so rxm hands it FI_MR_LOCAL,
# it registers its one buffer once (through the verbs domain, hence the MR cache: one search, one
# subscribe) and passes that descriptor with every message; rxm's rendezvous then uses the
# descriptor and never searches the cache again. So the cache sees no hit and the monitor no
# valid check, whichever monitor it is: the step requires completion, the import and subscribes,
# and reports valid checks (0) and libfabric's own "MR cache stats" line for both runs. The
# fi-oracle step above is the one that sends every message through the cache.
# One device: the client's fi_getinfo resolves the server's link-local address, whose scope is
# the server's netdev, so a client on the other rxe finds no route from its device (ENODATA);
# both ends on RXE_DEV0 is rxe's loopback. The control channel is TCP on 127.0.0.1.
pingpong_port=${MRC_RXE_PINGPONG_PORT:-47592}
pingpong_pair() {  # pingpong_pair LOG_PREFIX SIZE ITERATIONS [ENV=VALUE...]: server and client
  local prefix=$1 size=$2 iters=$3 netdev spid rc src
  shift 3
  netdev=$(cat "/sys/class/infiniband/$RXE_DEV0/ports/1/gid_attrs/ndevs/0" 2>/dev/null)
  local -a common=(env -u FI_MR_CACHE_MONITOR -u FI_MR_CACHE_MAX_COUNT -u FI_PROVIDER_PATH
    FI_UNIVERSE_SIZE=16 FI_OFI_RXM_SAR_LIMIT=16384 FI_VERBS_IFACE="${netdev:-veth0}" "$@"
    timeout -k 5 90 fi_pingpong -p "verbs;ofi_rxm" -e rdm -d "$RXE_DEV0" -S "$size" -I "$iters"
    -c)
  "${common[@]}" -B "$pingpong_port" >"$prefix.server.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do  # the server listens on its control port before anything else
    ss -Hltn "sport = :$pingpong_port" 2>/dev/null | grep -q . && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  "${common[@]}" -P "$pingpong_port" 127.0.0.1 >"$prefix.client.log" 2>&1
  rc=$?
  wait "$spid" || rc=1
  for src in server client; do
    grep -a -E 'error|fail|timeout|expired' "$prefix.$src.log" | grep -av '<info>' | head -5 |
      sed "s/^/  $src: /"
  done
  return "$rc"
}
pingpong_figures() {  # the client's figures "bytes MB/s usec/xfer" (fi_pingpong's table row)
  awk 'NF == 8 && $3 ~ /^=/ && $5 ~ /s$/ { print $1, $6, $7 }' "$1.client.log" | tail -1
}
fi_pingpong_step() {
  local plugin=$build/integrations/libfabric out=/tmp/rxe-lane-pingpong rc=0 run size iters m
  local p d f subscribes valid t0 zero_valid side
  local -a menv
  if ! command -v fi_pingpong >/dev/null; then
    echo "note: fi_pingpong is not installed (Debian: libfabric-bin): step skipped"
    return 77
  fi
  if [ ! -f "$plugin/libmrcache-fi.so" ]; then
    echo "note: $plugin/libmrcache-fi.so is not built (no libfabric-dev at configure time):" \
      "step skipped"
    return 77
  fi
  mkdir -p "$out"
  declare -A fig=()
  for run in "${pingpong_runs[@]}"; do
    size=${run%%:*} iters=${run#*:}
    for m in default mrcache; do
      p=$out/$m-$size
      menv=(FI_LOG_LEVEL=info)
      [ "$m" = mrcache ] && menv+=(FI_PROVIDER_PATH="$plugin" MRC_STATS=1)
      t0=$SECONDS
      if pingpong_pair "$p" "$size" "$iters" "${menv[@]}"; then
        fig[$m $size]=$(pingpong_figures "$p")
        echo "fi_pingpong $size B x $iters, $m monitor: done in $((SECONDS - t0)) s:" \
          "${fig[$m $size]:-(no figures)} (bytes MB/s usec/xfer)"
      else
        echo "fi_pingpong $size B x $iters, $m monitor: FAILED ($((SECONDS - t0)) s; logs $p.*)"
        rc=1
      fi
      for side in server client; do  # libfabric's own count of searches and hits, any monitor
        grep -a -h 'MR cache stats' "$p.$side.log" | sed "s/^.*<info> /  $side: libfabric /"
      done
      [ "$m" = mrcache ] || continue
      zero_valid=0
      for side in server client; do
        f=$p.$side.log
        if ! grep -aq "imported mrcache's monitor" "$f"; then
          echo "  $side: no \"imported mrcache's monitor\": the run measured libfabric's own"
          rc=1
        fi
        grep -a -h "imported mrcache's monitor" "$f" | sed "s/^.*<info> /  $side: /"
        d=$(grep -a -h '^mrcache-fi (' "$f" | tail -1)
        echo "  $side: ${d:-no mrcache-fi stats line (MRC_STATS=1)}"
        subscribes=$(sed -nE 's/.*[ ,]subscribes ([0-9]+).*/\1/p' <<<"$d")
        valid=$(sed -nE 's/.*valid checks ([0-9]+).*/\1/p' <<<"$d")
        if [ "${subscribes:-0}" -le 0 ]; then
          echo "  $side: mrcache's monitor got no subscribe: libfabric's cache did not use it"
          rc=1
        fi
        [ "${valid:-0}" -gt 0 ] || zero_valid=1
      done
      [ "$zero_valid" = 0 ] ||
        echo "  note: valid checks 0 is expected: fi_pingpong registers its FI_MR_LOCAL buffer" \
          "once, so the cache never hits (the comment above fi_pingpong_step)"
    done
  done
  echo "fi_pingpong verbs;ofi_rxm on $RXE_DEV0 (client figures; ratio mrcache/default):"
  printf '  %-9s %-28s %-28s %s\n' size "default (MB/s, usec/xfer)" "mrcache (MB/s, usec/xfer)" \
    "ratio (MB/s, usec/xfer)"
  for run in "${pingpong_runs[@]}"; do
    size=${run%%:*}
    read -r _ dbw dlat <<<"${fig[default $size]:-- - -}"
    read -r _ mbw mlat <<<"${fig[mrcache $size]:-- - -}"
    printf '  %-9s %-28s %-28s %s\n' "$size" "$dbw $dlat" "$mbw $mlat" "$(awk -v a="$dbw" \
      -v b="$mbw" -v c="$dlat" -v d="$mlat" 'BEGIN { if (a + 0 > 0 && c + 0 > 0)
        printf "%.2f %.2f", b / a, d / c; else print "-" }')"
  done
  return "$rc"
}

bpf_ctest() {
  local out=/tmp/rxe-lane-bpf.log rc
  if [ ! -f "$build/bpf/changes.bpf.o" ]; then
    if [ "$bpf_required" = 1 ]; then
      echo "$build has no eBPF programs (bpf/changes.bpf.o) and MRC_RXE_BPF_REQUIRED=1:" \
        "it was configured without clang, bpftool or libbpf-dev (cmake's line" \
        "\"eBPF monitor:\" says which)"
      return 1
    fi
    echo "note: $build has no eBPF programs (bpf/changes.bpf.o): configured without clang," \
      "bpftool or libbpf-dev: step skipped"
    return 77
  fi
  # As in verbs_ctest: bpf as a whole element of the comma-joined label ("unit,bpf").
  MRC_BPF_REQUIRED=1 ctest --test-dir "$build" -L '(^|,)bpf(,|$)' --output-on-failure \
    --no-tests=error --timeout "$ctest_timeout" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if grep -q 'No tests were found' "$out"; then
    echo "ctest -L bpf selected no test: the eBPF monitor's tests are not built" \
      "(or lost their label)"
    return 1
  fi
  return "$rc"
}

step sanity sanity
step selfcheck selfcheck
step "ctest -L verbs" verbs_ctest
step "mrcache-stress --backend verbs" stress
step fi-oracle fi_oracle
step fi-pingpong fi_pingpong_step
step bpf bpf_ctest

echo "=== rxe-lane summary"
printf '  %s\n' "${summary[@]}"
exit $failed
