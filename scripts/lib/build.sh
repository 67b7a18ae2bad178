# SPDX-License-Identifier: BSD-3-Clause
# Shared by scripts/test.sh and scripts/stress.sh (sourced, not run): argument parsing, set-up and
# the configure step, so that both build the tree the same way.
#
# Options: -B DIR | --build-dir DIR   build directory (default: $MRC_BUILD_DIR or <repo>/build)
#          --no-setup                 skip scripts/setup.sh (packages already installed)
#          -j N                       parallel jobs (default: $MRC_JOBS or nproc)
#          -- ARGS...                 extra arguments for cmake's configure step
# Env:     MRC_CMAKE_ARGS             extra configure arguments (split on blanks), before ARGS

mrc_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mrc_build_dir=${MRC_BUILD_DIR:-$mrc_repo/build}
mrc_jobs=${MRC_JOBS:-$(nproc)}
mrc_setup=1
mrc_extra_cmake_args=()
# shellcheck disable=SC2206
mrc_extra_cmake_args+=(${MRC_CMAKE_ARGS:-})
mrc_rest_args=()

mrc_parse_args() {
  while (($#)); do
    case $1 in
      -B | --build-dir) mrc_build_dir=$2; shift 2 ;;
      -B*) mrc_build_dir=${1#-B}; shift ;;
      --no-setup) mrc_setup=0; shift ;;
      -j) mrc_jobs=$2; shift 2 ;;
      -j*) mrc_jobs=${1#-j}; shift ;;
      -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      --) shift; mrc_extra_cmake_args+=("$@"); break ;;
      *) mrc_rest_args+=("$1"); shift ;;
    esac
  done
  [[ $mrc_build_dir == /* ]] || mrc_build_dir=$PWD/$mrc_build_dir
}

mrc_log() { printf '\n==> %s\n' "$*"; }

mrc_run_setup() {
  ((mrc_setup)) || return 0
  mrc_log "set-up (scripts/setup.sh)"
  "$mrc_repo/scripts/setup.sh"
}

# Ninja, RelWithDebInfo, warnings as errors; the caller's arguments come last and win.
mrc_configure() {
  mrc_log "configure $mrc_build_dir"
  local generator=()
  # An existing build directory keeps its generator.
  [[ -f $mrc_build_dir/CMakeCache.txt ]] || generator=(-G Ninja)
  cmake -S "$mrc_repo" -B "$mrc_build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMRC_WERROR=ON "${mrc_extra_cmake_args[@]}"
}

mrc_build() {
  mrc_log "build ($mrc_jobs jobs) $*"
  cmake --build "$mrc_build_dir" -j "$mrc_jobs" "$@"
}
