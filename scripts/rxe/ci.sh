#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# scripts/rxe/ci.sh: the rxe soft-RoCE CI lanes. The host kernel has no RDMA stack, so the verbs tests
# run in QEMU guests with rdma_rxe (scripts/rxe/vm.sh) against the host's own build; so do the
# eBPF monitor's, whose programs the host kernel refuses and the guest's stock kernel loads.
#
#   scripts/rxe/ci.sh            one guest: the verbs and eBPF monitor tests (as root: it
#                                installs Debian packages on first use)
#   scripts/rxe/ci.sh --pair     two guests on one private wire: mrcache-mpi across them
#
# 1. scripts/rxe/vm.sh setup + build: host packages, guest kernel, initramfs (cached).
# 2. The project build: build/ when it is configured (.ci/run builds it first; brought up to
#    date here, a no-op then), else build-rxe/ configured Release without the benchmarks.
#    MRC_RXE_BUILD_DIR=DIR picks another one (configured here when it is not yet). Only what
#    the guests run is built: the test programs labelled verbs or bpf, mrcache-stress, and where
#    libfabric-dev is installed mrcache-fi-oracle and the libfabric plugin libmrcache-fi.so (the
#    eBPF monitor's programs, BUILD/bpf/changes.bpf.o, come with the library where clang,
#    bpftool and libbpf-dev were installed at configure time; the line `eBPF programs:` says
#    whether they are here); with --pair, mrcache-mpi (and UCX's rcache module where libucx-dev
#    is installed, and the libfabric plugin for the NetPIPE step where libfabric-dev is).
# 3. scripts/rxe/selfcheck.c compiled into BUILD/rxe-selfcheck/.
# 4. One guest, BUILD shared read-write: scripts/rxe/guest-tests.sh BUILD (sanity, self-check,
#    ctest -L verbs which must select at least one test, mrcache-stress --backend verbs, the
#    fi-oracle matrix: libfabric's own MR cache under each monitor, mrcache's plugin included;
#    Debian's fi_pingpong under libfabric's default monitor and mrcache's; ctest -L bpf with
#    MRC_BPF_REQUIRED=1, which must select at least one test, where the build has the eBPF
#    programs: skipped where it has not, a failure with MRC_RXE_BPF_REQUIRED=1).
#    --pair: `scripts/rxe/vm.sh pair`, nodea running scripts/rxe/pair-tests.sh BUILD (stress
#    with remote oracles, 1 and 2 ranks per node; the rendezvous benchmark and its report;
#    NetPIPE over Open MPI's mtl/ofi under Open MPI's monitor and mrcache's);
#    again, up to MRC_PAIR_ATTEMPTS [5] times in all, when a guest's kernel crashed.
# The last line is `RXE-LANE: PASS|FAIL (...)`; the exit status is non-zero on any failure.
#
# Environment: MRC_RXE_BUILD_DIR, MRC_JOBS [2], MRC_RXE_TIMEOUT [600] (bound on the guest run,
# seconds), RXEVM_* for scripts/rxe/vm.sh, MRC_PAIR_* for scripts/rxe/pair-tests.sh,
# MRC_RXE_BPF_REQUIRED [1 when CI=true (.ci/run sets it), else 0]: 1 makes a build without the
# eBPF programs fail the guest's bpf step instead of skipping it. That is the caller's policy,
# not read from the build: what the build could tell (its CMakeCache.txt has no MRC_BPF_ENABLED,
# only the tools it found) says the programs are missing, never that they should be there. In
# .ci/run they should: scripts/setup.sh installs bpftool and libbpf-dev and the thread-safety
# lane clang before the test lane configures build/, so a build without them there is a lost
# toolchain, which fails the lane instead of skipping the step unseen. (MRC_CI_LANES=rxe alone
# on a machine without clang therefore fails that step: MRC_RXE_BPF_REQUIRED=0 skips it.)
# The guest starts with an empty environment (scripts/rxe/vm.sh): the variable reaches
# scripts/rxe/guest-tests.sh on its command line.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VM=$ROOT/scripts/rxe/vm.sh
JOBS=${MRC_JOBS:-2}
GUEST_TIMEOUT=${MRC_RXE_TIMEOUT:-600}
if [ "${CI:-}" = true ]; then
  BPF_REQUIRED=${MRC_RXE_BPF_REQUIRED:-1}
else
  BPF_REQUIRED=${MRC_RXE_BPF_REQUIRED:-0}
fi
PAIR=0
case ${1:-} in
  --pair) PAIR=1 ;;
  "") ;;
  *) echo "usage: $0 [--pair]" >&2; exit 2 ;;
esac

declare -a timings=()
lane_t0=$SECONDS
stage=start
report() {
  echo "=== rxe lane timings"
  printf '  %s\n' "${timings[@]}" "total: $((SECONDS - lane_t0)) s"
}
lane_fail() {
  trap - EXIT
  report
  echo "RXE-LANE: FAIL ($*)"
  exit 1
}
trap 'rc=$?; [ $rc = 0 ] || { report; echo "RXE-LANE: FAIL (stage $stage, exit $rc)"; }' EXIT
timed() {  # timed LABEL COMMAND...
  local label=$1 t0=$SECONDS
  shift
  stage=$label
  echo "=== rxe lane: $label"
  "$@"
  timings+=("$label: $((SECONDS - t0)) s")
}

configure_build_dir() {
  local dir=$1
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMRC_BUILD_BENCH=OFF \
    -DMRC_WITH_VERBS=ON
}

# What the guest runs, and nothing else (benchmarks, header checks, other tools and tests are
# not this lane's job): the GoogleTest programs whose tests carry the verbs or the bpf label,
# found on their post-build discovery command (-D "TEST_PROPERTIES=LABELS;backend,verbs"; the
# eBPF programs come with the library they link), plus mrcache-stress,
# plus mrcache-fi-oracle and libmrcache-fi.so when configured (they are not without libfabric).
# When no program is found that way (a label mechanism this does not know), every program under
# tests/ is built: slower, never wrong, and ctest still fails when it selects nothing.
needed_targets() {
  if [ $PAIR = 1 ]; then
    # libmrcache-fi.so: the netpipe step's mrcache run loads it (where libfabric-dev is installed)
    ninja -C "$BUILD" -t targets all |
      awk -F': ' '$1 ~ /(^|\/)(mrcache-(mpi|ucx-rcache\.so)|libmrcache-fi\.so)$/ { print $1 }'
    return
  fi
  local programs labelled
  ninja -C "$BUILD" -t targets all |
    awk -F': ' '$1 ~ /(^|\/)(mrcache-fi-oracle|libmrcache-fi\.so)$/ { print $1 }' | sort -u
  programs=$(ninja -C "$BUILD" -t targets all | awk -F': ' '
    $2 ~ /^(C|CXX)_EXECUTABLE_LINKER__/ && $1 !~ /_tests\.cmake$/ &&
      ($1 ~ /^tests\// || $1 ~ /(^|\/)mrcache-stress$/) { print $1 }' | sort -u)
  labelled=$(grep -oE -- \
    '-D TEST_TARGET=[^ ]+ .*-D "TEST_PROPERTIES=LABELS;([^"]*[;,])?(verbs|bpf)[,;"]' \
    "$BUILD/build.ninja" | sed -E 's/^-D TEST_TARGET=([^ ]+) .*/\1/' | sort -u || true)
  if [ -n "$labelled" ]; then
    echo "$labelled"
    grep -E '(^|/)mrcache-stress$' <<<"$programs" || true
  else
    echo "$programs"
  fi
}

project_build() {
  local dir
  if [ -n "${MRC_RXE_BUILD_DIR:-}" ]; then
    dir=$MRC_RXE_BUILD_DIR
  elif [ -f "$ROOT/build/CMakeCache.txt" ]; then
    dir=$ROOT/build
  else
    dir=$ROOT/build-rxe
  fi
  mkdir -p "$dir"
  BUILD=$(cd "$dir" && pwd)
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    configure_build_dir "$BUILD"
  else
    # Test folders are globbed at configure time: a folder added since needs a new configure.
    cmake -S "$ROOT" -B "$BUILD" >/dev/null
  fi
  grep -q '^MRC_WITH_VERBS:BOOL=ON' "$BUILD/CMakeCache.txt" ||
    lane_fail "$BUILD is configured with MRC_WITH_VERBS=OFF: no verbs backend to test"
  echo "build dir: $BUILD"
  local -a targets=()
  if [ -f "$BUILD/build.ninja" ]; then
    mapfile -t targets < <(needed_targets)
    echo "targets: ${targets[*]:-(none: no test program is declared)}"
  else
    targets=(all)  # not a Ninja tree: no cheap way to pick targets
  fi
  [ ${#targets[@]} = 0 ] || cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}"
  if [ $PAIR = 1 ] && [ ! -x "$BUILD/tools/mpi/mrcache-mpi" ]; then
    lane_fail "no mrcache-mpi in $BUILD (configure says why: no libopenmpi-dev, or MRC_WITH_VERBS=OFF)"
  fi
  if [ $PAIR = 1 ]; then
    :  # the pair runs no eBPF test
  elif [ -f "$BUILD/bpf/changes.bpf.o" ]; then
    echo "eBPF programs: $BUILD/bpf/changes.bpf.o (the guest's bpf step runs them)"
  else
    echo "eBPF programs: none in $BUILD (configured without clang, bpftool or libbpf-dev):" \
      "the guest's bpf step $([ "$BPF_REQUIRED" = 1 ] && echo fails || echo skips)" \
      "(MRC_RXE_BPF_REQUIRED=$BPF_REQUIRED)"
  fi
  mkdir -p "$BUILD/rxe-selfcheck"
  gcc -std=c11 -O2 -Wall -Wextra -Wshadow -Wconversion -Wformat=2 -Wstrict-prototypes -Werror \
    -o "$BUILD/rxe-selfcheck/rxe_selfcheck" "$ROOT/scripts/rxe/selfcheck.c" -libverbs
}

timed "vm setup" "$VM" setup
timed "vm build" "$VM" build
timed "project build" project_build
stage="guest run"
t0=$SECONDS
echo "=== rxe lane: guest run"
set +e
if [ $PAIR = 1 ]; then
  # The guests' rdma_rxe crashes its kernel now and then under this traffic, with mrcache out
  # of the picture too (docs/DESIGN.md, the soft-RoCE guests): a pair that ended that way has no
  # verdict on mrcache and runs again, at most MRC_PAIR_ATTEMPTS [5] times in all. Any other
  # failure is final.
  pair_log=$(mktemp /tmp/mrcache-rxe-pair.XXXXXX)
  for attempt in $(seq "${MRC_PAIR_ATTEMPTS:-5}"); do
    "$VM" pair --timeout "$GUEST_TIMEOUT" -- bash "$ROOT/scripts/rxe/pair-tests.sh" "$BUILD" |
      tee "$pair_log"
    rc=${PIPESTATUS[0]}
    grep -q '^RXEVM-RESULT: FAIL (a guest kernel crashed' "$pair_log" || break
    timings+=("attempt $attempt: ended by a guest kernel crash (rdma_rxe)")
    echo "=== rxe lane: attempt $attempt ended by a guest kernel crash; the pair runs again"
  done
  rm -f "$pair_log"
else
  "$VM" run --rw "$BUILD" --timeout "$GUEST_TIMEOUT" -- env MRC_RXE_BPF_REQUIRED="$BPF_REQUIRED" \
    bash "$ROOT/scripts/rxe/guest-tests.sh" "$BUILD"
fi
rc=$?
set -e
timings+=("guest run: $((SECONDS - t0)) s")
[ $rc = 0 ] || lane_fail "guest tests exited $rc; see the summary above"
trap - EXIT
report
echo "RXE-LANE: PASS"
