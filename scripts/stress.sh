#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The main job: set-up, build mrcache-stress, and run it for 30 seconds with its defaults: exact
# mode, where a stale registration counts also in the unmap window (--fast: fast mode, which
# reports in-window hits without counting them). mrcache-stress exits non-zero on any stale
# registration, leak or error; so does this script.
#
# usage: scripts/stress.sh [-B BUILD_DIR] [--no-setup] [-j N] [STRESS_ARGS...] [-- CMAKE_ARGS...]
#   STRESS_ARGS   passed to mrcache-stress after --duration 30 (a later --duration wins)
#   the rest as in scripts/test.sh
set -euo pipefail
# shellcheck source=scripts/lib/build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build.sh"
mrc_parse_args "$@"

mrc_run_setup
mrc_configure

stress=$mrc_build_dir/tools/stress/mrcache-stress
# Capture first: grep -q closing the pipe early would fail the pipeline (SIGPIPE, pipefail).
targets=$(cmake --build "$mrc_build_dir" --target help 2>/dev/null || true)
if ! grep -q '^mrcache-stress:' <<<"$targets"; then
  echo "stress.sh: this tree has no mrcache-stress target yet (tools/stress/ is not in)." >&2
  echo "stress.sh: nothing to run; scripts/test.sh runs the test suite." >&2
  exit 1
fi
mrc_build --target mrcache-stress
if [[ ! -x $stress ]]; then
  echo "stress.sh: mrcache-stress was built but is not at $stress" >&2
  exit 1
fi

mrc_log "$stress --duration 30 ${mrc_rest_args[*]}"
exec "$stress" --duration 30 "${mrc_rest_args[@]}"
