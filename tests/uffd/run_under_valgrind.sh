#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Runs PROGRAM under valgrind and fails if it does not finish in time (the first cache used to
# hang under valgrind). Exit 77 (skipped) without valgrind.
# usage: run_under_valgrind.sh PROGRAM [SECONDS]
program=$1
limit=${2:-120}
if ! command -v valgrind >/dev/null 2>&1; then
  echo "SKIP: valgrind is not installed (apt-get install valgrind)"
  exit 77
fi
# SIGKILL: a thread stuck in munmap under valgrind ignores SIGTERM.
timeout -s KILL "$limit" valgrind -q "$program"
status=$?
if [ "$status" -eq 137 ]; then
  echo "FAIL: $program still ran after $limit s under valgrind (killed): a hang"
fi
exit "$status"
