#!/usr/bin/env bash
# rxe-pair-tests.sh BUILD_DIR: the two-node test list. Runs INSIDE nodea of the guest pair
# (scripts/ci-rxe.sh starts it with `scripts/rxe-vm.sh pair`, nodeb running
# scripts/rxe-pair/serve.sh), with rxe0 up on each node. Launches mrcache-mpi across both nodes
# with Open MPI (ob1/TCP on the private wire for MPI, rxe0 for the RDMA). Every step runs even
# after a failure; the exit status is 0 only when none failed. Last, it stops nodeb.
#
# Steps:
#   agent        nodeb's command channel answers (scripts/rxe-pair/agent.sh)
#   stress-*     mrcache-mpi stress: exact, fast, and exact with 2 ranks per node; then
#                through a cache that never invalidates, which must fail (the oracle's control)
#   bench-*      mrcache-mpi bench through exact, fast, ucx and none, then its report
#   netpipe      NetPIPE (NPopenmpi, a program mrcache did not write) over Open MPI's mtl/ofi on
#                libfabric's verbs;ofi_rxm, once with libfabric's default monitor and once with
#                mrcache's imported (libmrcache-fi.so, when BUILD_DIR has it); -i checks every
#                byte; the report gives both runs' latency and bandwidth and their ratios, and
#                mrcache's counters (MRC_STATS=1)
#
# Environment: MRC_PAIR_NETPIPE_ARGS [-u 1048576 -n 20 -p 0], MRC_PAIR_STRESS_SECONDS [30] (the exact 2-rank stress; the others run half),
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
agent=$here/rxe-pair/agent.sh
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
# registers the rendezvous buffers through that cache. FI_PROVIDER_PATH names the plugin's
# directory for the mrcache run only; Open MPI's own import, later, is refused and ignored.
plugin_dir=$build/integrations/libfabric
read -r -a netpipe_args <<<"${MRC_PAIR_NETPIPE_ARGS:--u 1048576 -n 20 -p 0}"
mpirun_ofi() {  # mpirun_ofi OUTPUT_PREFIX [ENV=VALUE...]: NetPIPE across the nodes, one rank each
  local out=$1
  shift
  local -a env_args=()
  local assignment
  for assignment in "$@"; do env_args+=(-x "$assignment"); done
  timeout -k 10 600 env "$@" mpirun --mca plm_rsh_agent "$agent" -H "$RXE_IP:1,$RXE_PEER:1" -np 2 \
    --map-by node --mca pml cm --mca mtl ofi --mca btl ^openib \
    --mca oob_tcp_if_include eth0 --mca mpi_yield_when_idle 1 --mca mpi_warn_on_fork 0 \
    -x FI_PROVIDER="verbs;ofi_rxm" "${env_args[@]}" \
    NPopenmpi "${netpipe_args[@]}" -o "$out.np" >"$out.log" 2>&1
}
netpipe_line() {  # the last line of a NetPIPE output: bytes, Mbps, usec
  awk 'NF >= 3 { last = $0 } END { print last }' "$1"
}
netpipe() {
  local rc=0 first_default first_mrcache last_default last_mrcache
  if ! command -v NPopenmpi >/dev/null; then
    echo "NPopenmpi is not installed (Debian: netpipe-openmpi)"
    return 1
  fi
  if [ ! -f "$plugin_dir/libmrcache-fi.so" ]; then
    echo "$plugin_dir/libmrcache-fi.so is not built (libfabric-dev missing?)"
    return 1
  fi
  mpirun_ofi /tmp/netpipe-default FI_LOG_LEVEL=warn || { echo "NetPIPE, default monitor: failed"; rc=1; }
  mpirun_ofi /tmp/netpipe-mrcache FI_PROVIDER_PATH="$plugin_dir" MRC_STATS=1 FI_LOG_LEVEL=info ||
    { echo "NetPIPE, mrcache's monitor: failed"; rc=1; }
  tail -n 5 /tmp/netpipe-default.log /tmp/netpipe-mrcache.log
  grep -h "imported mrcache's monitor\|mrcache-fi (" /tmp/netpipe-mrcache.log | sort | uniq -c
  if ! grep -q "imported mrcache's monitor" /tmp/netpipe-mrcache.log; then
    echo "the mrcache run did not import mrcache's monitor"
    rc=1
  fi
  if [ -s /tmp/netpipe-default.np ] && [ -s /tmp/netpipe-mrcache.np ]; then
    first_default=$(awk 'NF >= 3 { print; exit }' /tmp/netpipe-default.np)
    first_mrcache=$(awk 'NF >= 3 { print; exit }' /tmp/netpipe-mrcache.np)
    last_default=$(netpipe_line /tmp/netpipe-default.np)
    last_mrcache=$(netpipe_line /tmp/netpipe-mrcache.np)
    echo "NetPIPE (bytes, Mbps, usec), default monitor: first $first_default; last $last_default"
    echo "NetPIPE (bytes, Mbps, usec), mrcache monitor: first $first_mrcache; last $last_mrcache"
    awk -v d="$first_default" -v m="$first_mrcache" -v D="$last_default" -v M="$last_mrcache" \
      'BEGIN { split(d, a); split(m, b); split(D, c); split(M, e);
               printf "NetPIPE ratios mrcache/default: latency at %s B %.2f, bandwidth at %s B %.2f\n",
                      a[1], b[3] / a[3], c[1], e[2] / c[2] }'
  else
    echo "NetPIPE left no output"
    rc=1
  fi
  return $rc
}
step netpipe netpipe
echo "rxe0 counters, $(hostname): $(bash -c "$counters")"
echo "rxe0 counters, $RXE_PEER: $("$agent" "$RXE_PEER" "$counters")"
"$agent" "$RXE_PEER" touch /run/rxe-pair-stop >/dev/null 2>&1

echo "=== rxe-pair summary"
printf '  %s\n' "${summary[@]}"
exit $failed
