#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The test command: set-up (Debian packages), configure (Ninja, RelWithDebInfo, -DMRC_WERROR=ON),
# build everything, run every test with ctest. Exits with ctest's status. Tests that need a
# privilege, a kernel feature or a device the machine lacks skip themselves and say why.
#
# usage: scripts/test.sh [-B BUILD_DIR] [--no-setup] [-j N] [-- CMAKE_ARGS...]
#   -B DIR        build directory (default: build/ in the repository, or $MRC_BUILD_DIR)
#   --no-setup    do not run scripts/setup.sh
#   -j N          build and test jobs (default: nproc, or $MRC_JOBS)
#   -- ARGS       extra cmake configure arguments, e.g. -- -DMRC_SANITIZE=address,undefined
# env: MRC_CMAKE_ARGS (extra configure arguments), MRC_CTEST_ARGS (extra ctest arguments,
#      e.g. "-L uffd" or "-R pgtable"), MRC_TEST_TIMEOUT (seconds a test without a TIMEOUT of
#      its own may run before ctest kills it and fails it; default 300)
set -euo pipefail
# shellcheck source=scripts/lib/build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build.sh"
mrc_parse_args "$@"
if ((${#mrc_rest_args[@]})); then
  echo "test.sh: unknown argument(s): ${mrc_rest_args[*]} (see --help)" >&2
  exit 2
fi

mrc_run_setup
mrc_configure
mrc_build

mrc_log "ctest"
# shellcheck disable=SC2206
ctest_args=(${MRC_CTEST_ARGS:-})
status=0
# A hung test must fail, not hang the command: every test gets a default timeout.
ctest --test-dir "$mrc_build_dir" --output-on-failure -j "$mrc_jobs" \
  --timeout "${MRC_TEST_TIMEOUT:-300}" "${ctest_args[@]}" || status=$?
exit "$status"
