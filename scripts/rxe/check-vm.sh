#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# scripts/rxe/check-vm.sh: self-check of scripts/rxe/vm.sh (no ctest: it boots a dozen guests, about 3
# minutes under TCG). Run as root after `scripts/rxe/vm.sh setup`:
#   scripts/rxe/check-vm.sh
# Each case states the contract it pins; the script exits non-zero when any case fails.
# shellcheck disable=SC2016  # the guest commands are single-quoted on purpose
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VM=$ROOT/scripts/rxe/vm.sh
SCRATCH=$(mktemp -d /var/tmp/rxe-vm-check.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
failures=0
cases=0

# expect NAME WANT_EXIT WANT_RESULT_REGEX COMMAND...: runs COMMAND (output kept in a log) and
# checks its exit status and its `RXEVM-RESULT:` line.
expect() {
  local name=$1 want_rc=$2 want_result=$3 log=$SCRATCH/case.log rc result
  shift 3
  cases=$((cases + 1))
  "$@" >"$log" 2>&1
  rc=$?
  result=$(grep '^RXEVM-RESULT: ' "$log" | tail -1)
  if [ "$rc" = "$want_rc" ] && [[ $result =~ $want_result ]]; then
    echo "ok    $name"
  else
    echo "FAIL  $name: exit $rc (want $want_rc), result '$result' (want /$want_result/)"
    tail -15 "$log" | sed 's/^/      | /'
    failures=$((failures + 1))
  fi
}
check() {  # check NAME CONDITION...: a plain assertion on the host
  cases=$((cases + 1))
  local name=$1
  shift
  if "$@"; then echo "ok    $name"; else echo "FAIL  $name"; failures=$((failures + 1)); fi
}

expect "build is a no-op when its inputs are unchanged" 0 '' \
  bash -c "'$VM' build && '$VM' build 2>&1 | grep -q 'up to date'"
expect "build redoes the initramfs when the recorded key differs" 0 '' \
  bash -c "echo stale >>'${RXEVM_WORK:-/var/tmp/mrcache-rxe-vm}/initramfs.key' &&
           '$VM' build 2>&1 | grep -q 'initramfs for' && '$VM' build 2>&1 | grep -q 'up to date'"

expect "run without a command: rxe up and self-test" 0 '^RXEVM-RESULT: PASS' "$VM" run
expect "exit status 0 passes" 0 '^RXEVM-RESULT: PASS' "$VM" run -- true
expect "a command's exit status is propagated" 7 '^RXEVM-RESULT: FAIL \(command exited 7' \
  "$VM" run -- bash -c 'exit 7'
expect "arguments keep their quoting" 0 'PASS' \
  "$VM" run -- bash -c '[ "$1" = "a b" ] && [ "$2" = "*" ]' _ "a b" "*"
expect "rxe0 is active and the RXE_* environment is set" 0 'PASS' \
  "$VM" run -- bash -c 'ibv_devinfo -d "$RXE_DEV0" | grep -q PORT_ACTIVE &&
    [ "$RXE_DEV1" = rxe1 ] && [ -n "$RXE_GID0" ] && [ -n "$RXE_GID1" ] &&
    [ -n "$RXE_LL0" ] && ip -6 addr show dev veth0 | grep -q "$RXE_LL0"'

mkdir -p "$SCRATCH/rw" "$SCRATCH/ro"
echo host >"$SCRATCH/ro/marker"
expect "--rw DIR writes through, the rest of the host is read, never written" 0 'PASS' \
  "$VM" run --rw "$SCRATCH/rw" -- bash -c "
    [ \"\$(cat '$SCRATCH/ro/marker')\" = host ] &&
    echo guest >'$SCRATCH/rw/out' && echo guest >'$SCRATCH/ro/new' && rm '$SCRATCH/ro/marker'"
check "a file written in the --rw dir reaches the host" grep -qx guest "$SCRATCH/rw/out"
check "a file written outside the --rw dir stays in the guest" test ! -e "$SCRATCH/ro/new"
check "a file removed outside the --rw dir stays on the host" test -e "$SCRATCH/ro/marker"
expect "the command runs in the caller's working directory" 0 'PASS' \
  bash -c "cd '$SCRATCH/ro' && '$VM' run -- bash -c '[ \"\$PWD\" = \"$SCRATCH/ro\" ]'"

expect "a command over its bound is stopped in the guest (exit 124)" 124 \
  'FAIL \(command timed out' "$VM" run --timeout 60 -- sleep 300
# RXEVM_APPEND overrides the guest-side bound, so the guest outlives the host-side timeout.
expect "a guest over the host-side bound is killed (exit 124)" 124 \
  'FAIL \(guest killed by the 60 s host-side timeout' \
  env RXEVM_APPEND="quiet rxevm.timeout=600" "$VM" run --timeout 60 -- sleep 300
check "no QEMU of ours is left running" \
  bash -c "! pgrep -f '[q]emu-system-x86_64.*${RXEVM_WORK:-/var/tmp/mrcache-rxe-vm}/vmlinuz' >/dev/null"
expect "a guest that cannot boot fails with 125" 125 '^RXEVM-RESULT: FAIL' \
  env RXEVM_APPEND="quiet rdinit=/no-such-init" "$VM" run -- true
expect "an empty work dir fails loudly" 125 'FAIL \(no guest kernel/initramfs' \
  env RXEVM_WORK="$SCRATCH/empty" "$VM" run -- true

echo "check-rxe-vm: $((cases - failures))/$cases passed"
[ $failures = 0 ]
