#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs every Debian package mrcache needs to build, test, format-check and benchmark, on
# Debian 12 (bookworm). Idempotent: when everything is present it prints nothing and touches
# nothing (no apt-get update). Works as root, or through sudo as another user.
#
# usage: scripts/setup.sh [--check]     --check: list what is missing, exit 1 if anything is
# env:   MRC_SETUP_EXTRA="pkg ..."      more packages to install with the rest
set -euo pipefail

packages=(
  # compilers and build tools (a fresh Debian has none of them)
  build-essential cmake ninja-build pkg-config git ca-certificates
  # libraries the library links
  liburing-dev libfmt-dev libnuma-dev libibverbs-dev
  # the eBPF monitor: libbpf to load its programs, bpftool for their skeleton (clang, which
  # compiles them, comes with MRC_SETUP_EXTRA=clang; without it the build has no programs)
  libbpf-dev bpftool
  # RDMA user space: verbs providers (rxe included) and ibv_devices & co. for the verbs lane
  rdma-core ibverbs-providers ibverbs-utils
  # tests, tools and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libucx-dev
  gnuplot-nox valgrind
  # mrcache-mpi and the two-guest lane (Open MPI across the guests, socat for their agent)
  libopenmpi-dev openmpi-bin socat
  # the libfabric monitor plugin, and the programs we did not write that prove it in the guests
  libfabric-dev libfabric-bin netpipe-openmpi
  # style checks
  clang-format clang-tidy
  # scripts: setpriv (unprivileged lane), ps/pgrep/sysctl, nm/readelf (binutils), realpath
  util-linux procps binutils coreutils findutils grep sed
)
# shellcheck disable=SC2206
packages+=(${MRC_SETUP_EXTRA:-})

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$pkg")
done

if [[ ${1:-} == --check ]]; then
  if ((${#missing[@]})); then
    echo "setup: missing: ${missing[*]}"
    exit 1
  fi
  exit 0
fi
((${#missing[@]})) || exit 0

as_root=()
if ((EUID != 0)); then
  if ! command -v sudo >/dev/null; then
    echo "setup: not root and no sudo; as root run: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  as_root=(sudo)
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y
  -o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
log=$(mktemp /tmp/mrcache-setup.XXXXXX.log)
if ! { "${apt[@]}" update && "${apt[@]}" install --no-install-recommends "${missing[@]}"; } \
  >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "setup: apt-get failed (full log: $log)" >&2
  exit 1
fi
rm -f "$log"
echo "setup: done"
