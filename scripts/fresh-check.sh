#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Proves that the README's test command works on a fresh Debian 12: debootstrap a minimal
# bookworm (cached under /var/tmp between runs), copy it, put the repository in, chroot, and run
# scripts/test.sh there. Needs root (debootstrap, mount, chroot) and the network to Debian's
# archive. Everything it mounts is unmounted on exit, whatever happens.
#
# usage: sudo scripts/fresh-check.sh [--worktree] [--dest DIR] [--keep] [--shell] [-- TEST_ARGS...]
#   --worktree  copy the work tree's tracked and untracked (not ignored) files instead of a
#               clone of HEAD (default: a fresh clone of the committed HEAD)
#   --dest DIR  where the repository goes in the chroot (default /root/mrcache: where root's
#               `git clone` puts it; /root is mode 0700 there, as on Debian, so tests that run
#               helpers as another user must not need to reach the build tree)
#   --keep      keep the chroot (printed at the end) instead of deleting it
#   --shell     open a shell in the chroot instead of running the test command
#   TEST_ARGS   passed to scripts/test.sh
# env: MRC_FRESH_CACHE (default /var/tmp/mrcache-fresh), MRC_DEBIAN_MIRROR
#      (default http://deb.debian.org/debian)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${MRC_FRESH_CACHE:-/var/tmp/mrcache-fresh}
mirror=${MRC_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mode=clone dest=/root/mrcache keep=0 shell=0 test_args=()
while (($#)); do
  case $1 in
    --worktree) mode=worktree; shift ;;
    --dest) dest=${2:?--dest needs a directory}; shift 2 ;;
    --keep) keep=1; shift ;;
    --shell) shell=1; shift ;;
    --) shift; test_args=("$@"); break ;;
    *) echo "fresh-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
((EUID == 0)) || { echo "fresh-check: needs root (debootstrap, mount, chroot)" >&2; exit 2; }
log() { printf '[fresh-check %(%T)T] %s\n' -1 "$*"; }
started=$SECONDS

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap on the host"
  DEBIAN_FRONTEND=noninteractive apt-get -qq -y install debootstrap >/dev/null
fi

# 1. The pristine base system, made once. A partial one (interrupted debootstrap) is redone.
base=$cache/bookworm-minbase
mkdir -p "$cache" "$cache/apt-archives/partial"
if [[ ! -f $base/.mrcache-complete ]]; then
  log "debootstrap --variant=minbase bookworm $base ($mirror)"
  rm -rf "$base"
  t0=$SECONDS
  debootstrap --variant=minbase bookworm "$base" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
    { tail -n 30 "$cache/debootstrap.log"; log "debootstrap failed"; exit 1; }
  touch "$base/.mrcache-complete"
  log "debootstrap took $((SECONDS - t0)) s"
else
  log "reusing $base"
fi

# 2. A throw-away copy of it for this run.
root=$(mktemp -d "$cache/run.XXXXXX")
chmod 755 "$root"
mounts=()
cleanup() {
  local status=$? m
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    m=${mounts[i]}
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
  if ((keep)); then
    log "chroot kept at $root"
  else
    # Never delete through a mount that is still there.
    if grep -q "^$root/" <<<"$(findmnt -rn -o TARGET)"; then
      log "mounts remain under $root: not deleting it"
    else
      rm -rf --one-file-system "$root"
    fi
  fi
  log "finished in $((SECONDS - started)) s with status $status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log "copying the base system to $root"
cp -a "$base/." "$root/"
rm -f "$root/.mrcache-complete"

bind() {  # bind SOURCE TARGET [mount options...]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
}
mount -t proc proc "$root/proc" && mounts+=("$root/proc")
bind /sys "$root/sys"
bind /dev "$root/dev"
bind /dev/pts "$root/dev/pts"
# A fresh /dev/shm of its own: shared segments made by the tests stay inside the chroot.
mkdir -p "$root/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm" && mounts+=("$root/dev/shm")
# Downloaded .debs are kept between runs (the packages are still installed from scratch).
bind "$cache/apt-archives" "$root/var/cache/apt/archives"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

# 3. The repository: a clone of HEAD (what CI sees) or the work tree.
[[ $dest == /* && $dest != *..* ]] || { echo "fresh-check: --dest must be an absolute path" >&2; exit 2; }
src=$root$dest
mkdir -p "$src"
chmod 700 "$root/root"
if [[ $mode == clone ]]; then
  log "cloning $(git -C "$repo" rev-parse --short HEAD) into the chroot"
  git clone -q "$repo" "$src"
else
  log "copying the work tree into the chroot"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
    tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$src"
fi

# 4. The README's test command, as root in the fresh system.
chroot_env=(env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin CI="${CI:-}")
if ((shell)); then
  "${chroot_env[@]}" chroot "$root" /bin/bash -c 'cd "$1" && exec bash -i' bash "$dest" </dev/tty
  exit 0
fi
log "chroot: cd $dest && scripts/test.sh ${test_args[*]}"
t0=$SECONDS
status=0
"${chroot_env[@]}" chroot "$root" /bin/bash -c 'cd "$1" && shift && exec scripts/test.sh "$@"' \
  test.sh "$dest" "${test_args[@]}" </dev/null || status=$?
log "scripts/test.sh in the fresh chroot: status $status after $((SECONDS - t0)) s"
exit "$status"
