#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# scripts/rxe/pair-tests.sh BUILD_DIR: the two-node test list. Runs INSIDE nodea of the guest pair
# (scripts/rxe/ci.sh starts it with `scripts/rxe/vm.sh pair`, nodeb running
# scripts/rxe/pair/serve.sh), with rxe0 up on each node. Launches mrcache-mpi across both nodes
# with Open MPI (ob1/TCP on the private wire for MPI, rxe0 for the RDMA). Every step runs even
# after a failure; the exit status is 0 only when none failed. Last, it stops nodeb.
#
# Steps:
#   agent        nodeb's command channel answers (scripts/rxe/pair/agent.sh)
#   stress-*     mrcache-mpi stress: exact, fast, and exact with 2 ranks per node; then
#                through a cache that never invalidates, which must fail (the oracle's control)
#   bench-*      mrcache-mpi bench through exact, fast, ucx and none, then its report
#   netpipe      NetPIPE (NPopenmpi, a program mrcache did not write) over Open MPI's mtl/ofi on
#                libfabric's verbs;ofi_rxm, once with the monitor it gets by default (Open MPI's
#                own, imported) and once with mrcache's (libmrcache-fi.so, required); the
#                report gives both runs' latency and bandwidth per size and their ratios, and
#                mrcache's counters (MRC_STATS=1), which must show subscribes and valid checks
#                in both ranks. It measures; it does not check the data (NetPIPE's -i would,
#                instead of measuring)
#
# Environment: MRC_PAIR_NETPIPE_ARGS [-u 1048576 -n 20 -p 0], MRC_PAIR_STRESS_SECONDS [30]
# (the exact 2-rank stress; the others run half),
# MRC_PAIR_BENCH_ARGS [--sizes 4k,64k,1m --k 1,16,inf --messages 16 --max-bytes 8m],
# MRC_PAIR_BENCH_REPS [1], MRC_PAIR_PROBES [0] (deregistered keys each rank tries at the end of
# each stress run).
# shellcheck disable=SC2317  # the step functions are called through `step`
set -uo pipefail

if [ $# -ne 1 ] || [ ! -x "$1/tools/mpi/mrcache-mpi" ]; then
  echo "usage: $0 BUILD_DIR (with tools/mpi/mrcache-mpi built)" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
mpi=$build/tools/mpi/mrcache-mpi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
agent=$here/pair/agent.sh
stress_seconds=${MRC_PAIR_STRESS_SECONDS:-30}
read -r -a bench_args <<<"${MRC_PAIR_BENCH_ARGS:---sizes 4k,64k,1m --k 1,16,inf --messages 16 --max-bytes 8m}"
bench_reps=${MRC_PAIR_BENCH_REPS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

declare -a summary=()
failed=0
step() {  # step NAME COMMAND...: runs COMMAND, records its verdict and duration
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== rxe-pair: $name"
  "$@"
  rc=$?
  if [ $rc = 0 ]; then
    summary+=("PASS  $name ($((SECONDS - t0)) s)")
  else
    summary+=("FAIL  $name (exit $rc, $((SECONDS - t0)) s)")
    failed=1
  fi
}

agent_up() {
  local i
  for i in $(seq 150); do
    "$agent" "$RXE_PEER" true >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "nodeb's agent did not answer within 30 s"
  return 1
}

# --map-by node: ranks alternate between the nodes, so rank r's partners r+1 and r-1 are on the
# other node. MPI itself runs over TCP on the wire (ob1): its verbs transports are not under test.
# mpi_yield_when_idle: two ranks share each guest's one vCPU.
mpirun_pair() {  # mpirun_pair RANKS ARGS...
  local ranks=$1
  shift
  timeout -k 10 600 mpirun --mca plm_rsh_agent "$agent" -H "$RXE_IP:$((ranks / 2)),$RXE_PEER:$((ranks / 2))" \
    -np "$ranks" --map-by node --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include eth0 \
    --mca oob_tcp_if_include eth0 --mca mpi_yield_when_idle 1 --mca mpi_warn_on_fork 0 \
    -x RXE_GID "$@"
}

bench_out=/tmp/rxe-pair-bench.jsonl
bench_all() {
  local rep path rc=0
  : >"$bench_out"
  for rep in $(seq "$bench_reps"); do
    for path in exact none fast ucx; do  # ucx last in each repetition: UCM hooks libc
      mpirun_pair 2 "$mpi" bench --path "$path" --rep "$rep" --json "$bench_out" "${bench_args[@]}" ||
        rc=1
    done
  done
  return $rc
}

# The non-zero hardware counters of a node's rxe0 (retries and sequence errors tell of loss on
# the wire), as one line of shell for the agent.
counters='for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do read -r v <"$f"; [ "$v" = 0 ] || printf "%s=%s " "${f##*/}" "$v"; done; echo'

echo "rxe-pair: $(hostname) $RXE_IP, peer $RXE_PEER, rxe0 GID index $RXE_GID"
step agent agent_up
# Deregistered keys are not tried here (--probes 0) unless MRC_PAIR_PROBES says how many per
# run: every try ends in a remote access error, and after those the guests' rxe (Debian's
# 6.12.117) has corrupted its slab and crashed a guest (docs/DESIGN.md, the soft-RoCE guests).
probe_args=(--probes "${MRC_PAIR_PROBES:-0}" --probe-every 0)
step stress-exact mpirun_pair 2 "$mpi" stress --path exact --seconds "$stress_seconds" "${probe_args[@]}"
step stress-fast mpirun_pair 2 "$mpi" stress --path fast --seconds $((stress_seconds / 2)) \
  "${probe_args[@]}"
step stress-exact-2-per-node mpirun_pair 4 "$mpi" stress --path exact \
  --seconds $((stress_seconds / 2)) "${probe_args[@]}"
# The oracle's control: through a cache that never invalidates, the stress must see stale memory
# and fail. A pass here would mean the checks above cannot fail.
oracle_catches_a_stale_cache() {
  local out
  out=$(mpirun_pair 2 "$mpi" stress --path stale --seconds 10 --probes 0 2>&1)
  echo "$out" | grep -E 'stale reads|first problem|stress: (PASSED|FAILED)'
  grep -q 'mrcache-mpi stress: FAILED' <<<"$out" && grep -qE 'stale reads [1-9]' <<<"$out"
}
step stress-oracle-control oracle_catches_a_stale_cache
step bench bench_all
step bench-report "$mpi" report "$bench_out"

# NetPIPE through libfabric's own MR cache: Open MPI's cm PML and ofi MTL on verbs;ofi_rxm, which
# registers the rendezvous buffers through that cache (mtl/ofi asks for no FI_MR_LOCAL, so rxm
# registers each message's buffer itself: a cache search per rendezvous). The default run's
# monitor is the one Open MPI's mtl/ofi imports (its patcher; libfabric logs "setting imported
# memory monitor as default"), not libfabric's memhooks. FI_PROVIDER_PATH names the plugin's
# directory for the mrcache run only; Open MPI's own import, later, is refused and ignored.
# What rxm on rxe needs, as in the fi-oracle: FI_UNIVERSE_SIZE=16 (rxm sizes its verbs CQs by
# it; the default asks rxe for more than it allows and mtl/ofi fails: "PML cm cannot be
# selected"), FI_OFI_RXM_SAR_LIMIT=16384 (everything above 16 KiB is a rendezvous), and
# FI_VERBS_IFACE=eth0 (the wire's addresses only, no AF_IB entry, which rdma_cm over RoCE cannot
# use). mtl_ofi_provider_include is matched as a prefix of "verbs;ofi_rxm": "verbs" keeps the
# ";" off the orted command line, which the agent runs through a shell.
plugin_dir=$build/integrations/libfabric
read -r -a netpipe_args <<<"${MRC_PAIR_NETPIPE_ARGS:--u 1048576 -n 20 -p 0}"
mpirun_ofi() {  # mpirun_ofi OUTPUT_PREFIX [ENV=VALUE...]: NetPIPE across the nodes, one rank each
  local out=$1
  shift
  local -a env_args=()
  local assignment
  for assignment in "$@"; do env_args+=(-x "$assignment"); done
  timeout -k 10 600 env "$@" mpirun --mca plm_rsh_agent "$agent" -H "$RXE_IP:1,$RXE_PEER:1" -np 2 \
    --map-by node --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include verbs \
    --mca btl ^openib --mca oob_tcp_if_include eth0 --mca mpi_yield_when_idle 1 \
    --mca mpi_warn_on_fork 0 -x FI_PROVIDER="verbs;ofi_rxm" -x FI_VERBS_IFACE=eth0 \
    -x FI_UNIVERSE_SIZE=16 -x FI_OFI_RXM_SAR_LIMIT=16384 "${env_args[@]}" \
    NPopenmpi "${netpipe_args[@]}" -o "$out.np" >"$out.log" 2>&1
}
netpipe_table() {  # netpipe_table DEFAULT.np MRCACHE.np: both runs side by side, per size
  # NetPIPE's output file: bytes, Mbps, seconds per one-way transfer (half the round trip).
  awk 'NR == FNR { if (NF >= 3) { bw[$1] = $2; t[$1] = $3 } next }
       NF >= 3 && ($1 in bw) {
         if (!header++) printf "  %9s %12s %12s %7s %10s %10s %7s\n", "bytes", "usec default",
           "usec mrcache", "ratio", "Mbps dflt", "Mbps mrc", "ratio"
         printf "  %9d %12.1f %12.1f %7.2f %10.2f %10.2f %7.2f\n", $1, t[$1] * 1e6, $3 * 1e6,
           (t[$1] > 0 ? $3 / t[$1] : 0), bw[$1], $2, (bw[$1] > 0 ? $2 / bw[$1] : 0) }' "$1" "$2"
}
netpipe_summary() {  # the smallest size's latency and the largest's bandwidth, and their ratios
  awk 'NR == FNR { if (NF >= 3) { if (!n++) { b0 = $1; t0 = $3 } b1 = $1; w1 = $2 } next }
       NF >= 3 { if (!m++) u0 = $3; x1 = $2 }
       END { if (n == 0 || m == 0 || t0 <= 0 || w1 <= 0) { print "NetPIPE: no figures"; exit 1 }
             printf "NetPIPE latency at %d B: default %.1f usec, mrcache %.1f usec (ratio %.2f);" \
               " bandwidth at %d B: default %.2f Mbps, mrcache %.2f Mbps (ratio %.2f)\n",
               b0, t0 * 1e6, u0 * 1e6, u0 / t0, b1, w1, x1, x1 / w1 }' "$1" "$2"
}
netpipe() {
  local rc=0 log line stats n_stats n_used
  if ! command -v NPopenmpi >/dev/null; then
    echo "NPopenmpi is not installed (Debian: netpipe-openmpi)"
    return 1
  fi
  if [ ! -f "$plugin_dir/libmrcache-fi.so" ]; then
    echo "$plugin_dir/libmrcache-fi.so is not built (libfabric-dev missing?)"
    return 1
  fi
  # Both at FI_LOG_LEVEL=info (setup and teardown only: the timed loops log nothing), so that
  # each run shows which monitor libfabric took and its MR cache's searches and hits.
  mpirun_ofi /tmp/netpipe-default FI_LOG_LEVEL=info ||
    { echo "NetPIPE, default monitor: failed (log /tmp/netpipe-default.log)"; rc=1; }
  mpirun_ofi /tmp/netpipe-mrcache FI_PROVIDER_PATH="$plugin_dir" MRC_STATS=1 FI_LOG_LEVEL=info ||
    { echo "NetPIPE, mrcache's monitor: failed (log /tmp/netpipe-mrcache.log)"; rc=1; }
  for log in /tmp/netpipe-default.log /tmp/netpipe-mrcache.log; do
    echo "${log#/tmp/}: $(grep -ac 'setting imported memory monitor as default' "$log") ranks" \
      "took an imported monitor; libfabric's MR cache, per rank:"
    grep -a -h 'MR cache stats' "$log" | sed 's/^.*<info> /  /'
    grep -aE '^ *[0-9]+: +[0-9]+ bytes' "$log" | tail -n 1 | sed 's/^/  last NetPIPE line: /'
    grep -aE '(error|Error|ERROR|failed|abort)' "$log" | grep -av '<info>' | head -n 5 |
      sed 's/^/  /'
  done
  grep -a -h "imported mrcache's monitor" /tmp/netpipe-mrcache.log | sed 's/^.*<info> /  /'
  stats=$(grep -a -h '^mrcache-fi (' /tmp/netpipe-mrcache.log)
  if [ -n "$stats" ]; then
    while IFS= read -r line; do echo "  $line"; done <<<"$stats"
  else
    echo "  no mrcache-fi stats line in /tmp/netpipe-mrcache.log (MRC_STATS=1)"
  fi
  # One import and one stats line per rank, each with subscribes and cache hits checked
  # (valid checks): otherwise the mrcache row measured some other monitor, or no cache.
  if [ "$(grep -ac "imported mrcache's monitor" /tmp/netpipe-mrcache.log)" -lt 2 ]; then
    echo "the mrcache run did not import mrcache's monitor in both ranks"
    rc=1
  fi
  n_stats=$(grep -c . <<<"$stats")
  n_used=$(grep -cE '[ ,]subscribes [1-9][0-9]*,.* valid checks [1-9]' <<<"$stats")
  if [ -z "$stats" ] || [ "$n_stats" -lt 2 ] || [ "$n_used" -lt 2 ]; then
    echo "mrcache's monitor was not used by both ranks' caches (stats lines $n_stats, with" \
      "subscribes and valid checks $n_used)"
    rc=1
  fi
  if [ -s /tmp/netpipe-default.np ] && [ -s /tmp/netpipe-mrcache.np ]; then
    echo "NetPIPE ${netpipe_args[*]}, rank 0's figures (ratios mrcache/default):"
    netpipe_table /tmp/netpipe-default.np /tmp/netpipe-mrcache.np
    netpipe_summary /tmp/netpipe-default.np /tmp/netpipe-mrcache.np || rc=1
  else
    echo "NetPIPE left no output"
    rc=1
  fi
  return "$rc"
}
step netpipe netpipe
echo "rxe0 counters, $(hostname): $(bash -c "$counters")"
echo "rxe0 counters, $RXE_PEER: $("$agent" "$RXE_PEER" "$counters")"
"$agent" "$RXE_PEER" touch /run/rxe-pair-stop >/dev/null 2>&1

echo "=== rxe-pair summary"
printf '  %s\n' "${summary[@]}"
exit $failed
