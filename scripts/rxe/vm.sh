#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# scripts/rxe/vm.sh: run commands against soft-RoCE (rdma_rxe) on a host whose own kernel has no RDMA
# stack, by booting a stock Debian kernel in a QEMU guest with a small busybox initramfs.
#
#   scripts/rxe/vm.sh setup                 install host packages, fetch + unpack the guest kernel
#   scripts/rxe/vm.sh build                 build the initramfs (skipped when up to date)
#   scripts/rxe/vm.sh run [OPTS] [--] [CMD...]
#                                           boot, bring up rxe0/rxe1, run CMD in the guest, power off
#   scripts/rxe/vm.sh all [OPTS] [--] [CMD...]  setup + build + run
#   scripts/rxe/vm.sh pair [--timeout SEC] [--b SCRIPT_B] [--] CMD...
#                                           two guests on one private wire, CMD on the first
#                                           (see cmd_pair)
#     OPTS: --rw DIR       share host DIR read-write (e.g. the build dir); all else is read-only
#           --timeout SEC  host-side bound on the whole guest run (default $RXEVM_TIMEOUT)
#
# What CMD sees: the host's own / (shared read-only over virtio-9p, so host-built binaries run
# unchanged) under an overlay whose writes land in guest memory and vanish at power-off, except
# in --rw DIR, which writes through to the host. Fresh /run, /dev, /proc, /sys. CMD runs as root
# with bash, in the caller's working directory, with the environment
#   RXE_DEV0=rxe0 RXE_DEV1=rxe1  RXE_GID0/RXE_GID1 (GID index of the RoCE v2 link-local GID)
#   RXE_LL0/RXE_LL1 (link-local IPv6 of veth0/veth1; rdma_cm wants "$RXE_LL0%veth0")
# rxe0 and rxe1 sit on the two ends of one veth pair; the guest has no NIC (-nic none).
# Cross-device traffic must use the link-local GIDs; rxe active_mtu is 1024 at the default
# veth MTU (RXEVM_MTU=9000 gives 4096).
#
# Result: the last line on stdout is `RXEVM-RESULT: PASS|FAIL (reason)`. The exit status is
# CMD's own; 124 when the host-side timeout ended the guest; 125 when the VM itself failed
# (missing tool, no space, boot or rxe bring-up failure, no result from the guest).
#
# Environment (defaults in brackets):
#   RXEVM_WORK [/var/tmp/mrcache-rxe-vm]  cache: unpacked kernel, initramfs, logs
#   RXEVM_KERNEL_META [linux-image-6.12-amd64 linux-image-amd64]  first meta package that resolves
#       names the guest kernel (an image package, e.g. linux-image-6.12.100+deb12-amd64, names
#       itself). 6.12 first: the cache relies on userfaultfd WP_ASYNC (6.7+) and
#       PROCMAP_QUERY (6.11+), which bookworm's 6.1 lacks.
#   RXEVM_TIMEOUT [900]  RXEVM_MEM [1024] MiB  RXEVM_SMP [2]  RXEVM_MTU [1500]
#   RXEVM_ACCEL [auto: kvm when usable, else tcg]  RXEVM_APPEND [quiet] extra kernel arguments,
#       last, so they override the rxevm.timeout=/rxevm.mtu=/rxevm.selftest= set from the above
#   RXEVM_SELFTEST [1]  RC pingpong rxe1 -> rxe0 before CMD (about 1 s), to tell a broken rxe
#       from a broken CMD
#
# Cache validity: the unpacked kernel is keyed by the resolved package name and version; the
# initramfs by that key, this script's hash and the versions of the host packages copied into
# it. A change to any of them rebuilds; nothing else is ever reused.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
export PATH=$PATH:/usr/sbin:/sbin  # depmod, modprobe for non-root callers
WORK=${RXEVM_WORK:-/var/tmp/mrcache-rxe-vm}
KERNEL_META=${RXEVM_KERNEL_META:-linux-image-6.12-amd64 linux-image-amd64}
TIMEOUT=${RXEVM_TIMEOUT:-900}
GUEST_MEM=${RXEVM_MEM:-1024}
GUEST_SMP=${RXEVM_SMP:-2}
GUEST_MTU=${RXEVM_MTU:-1500}
ACCEL=${RXEVM_ACCEL:-auto}
GUEST_APPEND=${RXEVM_APPEND:-quiet}
SELFTEST=${RXEVM_SELFTEST:-1}

ARCH_LIB=/usr/lib/x86_64-linux-gnu
HOST_PACKAGES=(qemu-system-x86 busybox-static kmod cpio gzip xz-utils rdma-core ibverbs-providers
  ibverbs-utils libibverbs-dev iproute2 rdmacm-utils)
HOST_TOOLS=(qemu-system-x86_64 busybox depmod modprobe cpio gzip xz dpkg-deb ldd ip rdma
  ibv_devinfo ibv_rc_pingpong timeout flock sha256sum)
# Packages whose files end up inside the initramfs: their versions key the cache.
INITRAMFS_PACKAGES=(busybox-static iproute2 rdma-core ibverbs-providers ibverbs-utils libibverbs1
  libc6 libgcc-s1)
# Modules /init loads, dependencies resolved from modules.dep. crc32_generic is not in it: rxe asks
# the crypto API for "crc32" at `rdma link add`, and without it that fails with ENOENT.
GUEST_MODULES=(crc32_generic rdma_rxe ib_uverbs rdma_ucm veth virtio_pci virtio_net 9pnet_virtio 9p overlay)
FREE_SPACE_MIB=1024  # kernel .deb plus its unpacked tree plus the initramfs, with margin

log() { echo "[rxe-vm] $*" >&2; }
result() {  # result PASS|FAIL reason...
  local verdict=$1; shift
  echo "RXEVM-RESULT: $verdict ($*)"
}
fail() {  # fail EXIT_CODE reason...: the loud way out of every step
  local code=$1; shift
  log "error: $*"
  result FAIL "$*"
  exit "$code"
}

usage() {
  sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$SELF" >&2
  exit 2
}

lock_work() {  # serialises setup/build between concurrent users of one WORK
  mkdir -p "$WORK" || fail 125 "cannot create work dir $WORK"
  exec 9>"$WORK/.lock"
  flock -w 1200 9 || fail 125 "could not lock $WORK/.lock within 20 min"
}

pkg_versions() { dpkg-query -W -f='${Package}=${Version}\n' "$@" 2>/dev/null | sort; }

missing_packages() {
  local p
  for p in "${HOST_PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || echo "$p"
  done
}

apt_lists_fresh() {  # package lists exist and are less than a day old
  [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null)" ]
}

apt_update() {
  [ "$(id -u)" = 0 ] || fail 125 "apt-get update needs root"
  log "apt-get update"
  apt-get update -qq || fail 125 "apt-get update failed (no network or Debian mirror?)"
}

# Prints "package version" of the guest kernel named by the first meta package that resolves.
resolve_kernel() {
  local meta name version
  for meta in $KERNEL_META; do
    name=$(apt-cache depends "$meta" 2>/dev/null |
      awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
    # No kernel among its dependencies: an image package itself (linux-image-6.12.100+deb12-amd64)
    # rather than a meta package (linux-image-6.12-amd64).
    [ -n "$name" ] || [[ ! $meta =~ ^linux-image-[0-9] ]] || name=$meta
    [ -n "$name" ] || continue
    version=$(apt-cache show --no-all-versions "$name" 2>/dev/null | awk '/^Version:/ {print $2; exit}')
    [ -n "$version" ] && { echo "$name $version"; return 0; }
  done
  return 1
}

check_space() {
  local avail
  avail=$(df -Pm "$WORK" | awk 'NR == 2 {print $4}')
  [ "${avail:-0}" -ge "$FREE_SPACE_MIB" ] ||
    fail 125 "only ${avail:-0} MiB free in $WORK, need $FREE_SPACE_MIB MiB (set RXEVM_WORK elsewhere)"
}

# ---------------------------------------------------------------------------------------------
cmd_setup() {
  local t0=$SECONDS
  [ "$(uname -m)" = x86_64 ] || fail 125 "x86_64 hosts only (found $(uname -m))"
  command -v apt-get >/dev/null || fail 125 "not a Debian host: apt-get missing"
  lock_work

  local -a missing
  mapfile -t missing < <(missing_packages)
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || fail 125 "packages missing and not root: ${missing[*]}"
    apt_lists_fresh || apt_update
    log "apt-get install ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >"$WORK/apt-install.log" 2>&1; then
      tail -5 "$WORK/apt-install.log" >&2
      fail 125 "apt-get install ${missing[*]} failed (see $WORK/apt-install.log)"
    fi
  fi
  local tool
  for tool in "${HOST_TOOLS[@]}"; do
    command -v "$tool" >/dev/null || fail 125 "$tool missing after installing ${HOST_PACKAGES[*]}"
  done

  # The guest kernel: whatever the meta package points at now. Debian drops superseded ABI
  # packages from the mirror, so a hard-coded name would break at the next kernel update.
  local kernel
  if [ "$(id -u)" = 0 ] && ! apt_lists_fresh; then apt_update; fi
  kernel=$(resolve_kernel) || { apt_update; kernel=$(resolve_kernel); } ||
    fail 125 "none of the meta packages '$KERNEL_META' resolves to a kernel package"
  local kname=${kernel% *} kversion=${kernel#* }
  if [ -f "$WORK/kernel/.key" ] && [ "$(cat "$WORK/kernel/.key")" = "$kernel" ]; then
    log "guest kernel $kname $kversion: cached"
    return 0
  fi
  check_space
  log "fetching $kname=$kversion (downloaded only, never installed on the host)"
  rm -rf "$WORK/debs" "$WORK/kernel.new"
  mkdir -p "$WORK/debs"
  # _apt must be able to write the download dir, or apt warns and falls back to root.
  chmod 755 "$WORK/debs"
  # As root, apt warns that the download runs unsandboxed: harmless, so not shown.
  if ! (cd "$WORK/debs" && apt-get download -q "$kname=$kversion" >"$WORK/download.log" 2>&1); then
    # A superseded version is gone from the mirror: refresh the lists and resolve again.
    apt_update
    kernel=$(resolve_kernel) || fail 125 "kernel meta package vanished after apt-get update"
    kname=${kernel% *} kversion=${kernel#* }
    (cd "$WORK/debs" && apt-get download -q "$kname=$kversion" >"$WORK/download.log" 2>&1) || {
      cat "$WORK/download.log" >&2
      fail 125 "apt-get download $kname=$kversion failed"
    }
  fi
  local deb
  deb=$(find "$WORK/debs" -name "${kname}_*.deb" | head -1)
  [ -n "$deb" ] || fail 125 "apt-get download left no ${kname}_*.deb"
  dpkg-deb -x "$deb" "$WORK/kernel.new" || fail 125 "dpkg-deb -x $deb failed (disk full?)"
  local kv
  kv=$(ls "$WORK/kernel.new/lib/modules")
  [ -f "$WORK/kernel.new/boot/vmlinuz-$kv" ] || fail 125 "$deb holds no boot/vmlinuz-$kv"
  # The package ships no modules.dep (its postinst runs depmod): generate it in our tree.
  depmod -b "$WORK/kernel.new" "$kv" || fail 125 "depmod -b failed"
  echo "$kernel" >"$WORK/kernel.new/.key"
  rm -rf "$WORK/kernel" "$WORK/debs"
  mv "$WORK/kernel.new" "$WORK/kernel"
  log "guest kernel $kv unpacked under $WORK/kernel in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------
initramfs_key() {
  cat "$WORK/kernel/.key"
  sha256sum <"$SELF" | cut -d' ' -f1
  pkg_versions "${INITRAMFS_PACKAGES[@]}"
}

cmd_build() {
  local t0=$SECONDS
  [ -f "$WORK/kernel/.key" ] || fail 125 "no guest kernel under $WORK/kernel: run setup first"
  lock_work
  local key
  key=$(initramfs_key)
  if [ -f "$WORK/initramfs.key" ] && [ "$(cat "$WORK/initramfs.key")" = "$key" ] &&
    [ -f "$WORK/initramfs.cpio.gz" ] && [ -f "$WORK/vmlinuz" ]; then
    log "initramfs: up to date"
    return 0
  fi
  check_space
  local kdir=$WORK/kernel kv root=$WORK/initramfs-root
  kv=$(ls "$kdir/lib/modules")
  rm -rf "$root"
  mkdir -p "$root"/{usr/bin,usr/lib,usr/lib64,etc,proc,sys,dev,tmp,run,ctl,lower,upper,newroot}
  # Merged-/usr like the host, so ldd's paths and libibverbs' compiled-in provider directory hold.
  ln -s usr/bin "$root/bin"
  ln -s usr/bin "$root/sbin"
  ln -s bin "$root/usr/sbin"
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"

  put() {
    local f
    for f; do
      mkdir -p "$root$(dirname "$f")"
      cp -L "$f" "$root$f" || fail 125 "cannot copy $f into the initramfs"
    done
  }
  put_elf() {  # an executable or library and everything ldd says it loads
    local f lib
    for f; do
      put "$f"
      for lib in $(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
        [ -e "$root$lib" ] || put "$lib"
      done
    done
  }

  local busybox applet
  busybox=$(command -v busybox)
  ldd "$busybox" >/dev/null 2>&1 && fail 125 "$busybox is not static: install busybox-static"
  cp "$busybox" "$root/usr/bin/busybox"
  # No `ip` applet: Debian's busybox sh prefers applets over PATH, and busybox ip cannot make a
  # veth pair. /init calls iproute2 by full path anyway.
  for applet in $("$busybox" --list); do
    case $applet in busybox | ip) continue ;; esac
    ln -sf busybox "$root/usr/bin/$applet"
  done
  put_elf /usr/bin/ip /usr/bin/rdma /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong
  # libibverbs dlopen()s its provider, and glibc dlopen()s libgcc_s on pthread_exit: ldd shows
  # neither.
  put_elf "$ARCH_LIB"/libibverbs/librxe-rdmav*.so
  put /etc/libibverbs.d/rxe.driver "$ARCH_LIB/libgcc_s.so.1"

  local module ko rel
  : >"$root/etc/modules.order"
  : >"$WORK/modules.txt"
  for module in "${GUEST_MODULES[@]}"; do
    modprobe -d "$kdir" -S "$kv" --show-depends "$module" >"$WORK/deps.txt" 2>&1 ||
      fail 125 "guest kernel $kv has no module $module: $(head -1 "$WORK/deps.txt")"
    awk '$1 == "insmod" {print $2}' "$WORK/deps.txt" >>"$WORK/modules.txt"
  done
  awk '!seen[$0]++' "$WORK/modules.txt" | while read -r ko; do
    rel=${ko#"$kdir"}
    mkdir -p "$root$(dirname "$rel")"
    case $ko in  # busybox insmod takes plain .ko only; 6.12 ships .ko.xz
      *.xz) rel=${rel%.xz}; xz -dc "$ko" >"$root$rel" ;;
      *.zst) fail 125 "zstd-compressed modules are not handled: $ko" ;;
      *) cp "$ko" "$root$rel" ;;
    esac
    echo "$rel" >>"$root/etc/modules.order"
  done
  rm -f "$WORK/modules.txt" "$WORK/deps.txt"
  grep -q '/rdma_rxe\.ko$' "$root/etc/modules.order" || fail 125 "rdma_rxe.ko missing from $kv"

  write_init >"$root/init"
  chmod 755 "$root/init"
  (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) |
    gzip -6 >"$WORK/initramfs.cpio.gz.new" || fail 125 "cpio/gzip of the initramfs failed"
  cp "$kdir/boot/vmlinuz-$kv" "$WORK/vmlinuz.new"
  # Renames keep a guest that is booting right now on a complete pair of files.
  mv "$WORK/vmlinuz.new" "$WORK/vmlinuz"
  mv "$WORK/initramfs.cpio.gz.new" "$WORK/initramfs.cpio.gz"
  echo "$key" >"$WORK/initramfs.key"
  rm -rf "$root"
  log "initramfs for $kv: $(du -h "$WORK/initramfs.cpio.gz" | cut -f1) in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------
# The guest's /init (busybox sh). The host talks to it through the `rxevmctl` 9p share:
#   in:  cmd.sh (what to run; absent = self-test only), rw (host path of the read-write dir)
#   out: status, lines STAGE=<how far it got> RC=<CMD's exit status> REASON=<why it failed>
# Kernel arguments: rxevm.timeout=SEC (bound on CMD) rxevm.mtu=N rxevm.selftest=0|1.
write_init() {
  cat <<'INIT'
#!/bin/sh
export PATH=/usr/bin
ip() { /usr/bin/ip "$@"; }
up() { cut -d' ' -f1 /proc/uptime; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "RXEVM: /init at guest uptime $(up) s"

CTL=
status() { [ -n "$CTL" ] && echo "$*" >>/ctl/status; }
finish() {
  echo "RXEVM: power-off at guest uptime $(up) s"
  sync
  [ -n "$CTL" ] && umount /ctl
  poweroff -f
  sleep 5
  echo o >/proc/sysrq-trigger
}
die() {
  echo "RXEVM: FATAL: $*"
  status "REASON=$*"
  dmesg | tail -20
  finish
}

STO=600 MTU=1500 SELFTEST=1 NODE_IP= NODE_PEER= NODE_NAME=
for word in $(cat /proc/cmdline); do
  case $word in
    rxevm.timeout=*) STO=${word#*=} ;;
    rxevm.mtu=*) MTU=${word#*=} ;;
    rxevm.selftest=*) SELFTEST=${word#*=} ;;
    rxevm.ip=*) NODE_IP=${word#*=} ;;       # two-node mode: eth0 address, e.g. 10.77.0.1/24
    rxevm.peer=*) NODE_PEER=${word#*=} ;;
    rxevm.name=*) NODE_NAME=${word#*=} ;;
  esac
done

for ko in $(cat /etc/modules.order); do insmod "$ko" || die "insmod $ko failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=512000 rxevmctl /ctl || die "mount of the control share failed"
CTL=1
status "STAGE=boot"

sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
ip link set lo up
if [ -n "$NODE_IP" ]; then
  # Two-node mode: one guest of a pair. rxe0 on the virtio-net NIC eth0, whose other end is the
  # peer guest's eth0 (QEMU's dgram netdev over the host's loopback). IPv4 only on this wire.
  hostname "${NODE_NAME:-node}"
  ip link set eth0 mtu "$MTU" up || die "no eth0 (virtio-net) in two-node mode"
  ip addr add "$NODE_IP" dev eth0 || die "ip addr add $NODE_IP failed"
  rdma link add rxe0 type rxe netdev eth0 || die "rdma link add rxe0 failed"
  gid_of() {  # gid_of DEV PREFIX: index of the first RoCE v2 GID starting with PREFIX
    d=/sys/class/infiniband/$1/ports/1
    for i in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
      read -r g <"$d/gids/$i" 2>/dev/null || continue
      read -r t <"$d/gid_attrs/types/$i" 2>/dev/null || continue
      case $g in $2*) [ "$t" = "RoCE v2" ] && { echo "$i"; return 0; } ;; esac
    done
    return 1
  }
  n=0
  until G4=$(gid_of rxe0 0000:0000:0000:0000:0000:ffff:) && GLL=$(gid_of rxe0 fe80:); do
    n=$((n + 1))
    [ $n -gt 100 ] && die "no RoCE v2 IPv4/link-local GID on rxe0 after 10 s"
    usleep 100000
  done
  G0=$G4 G1= LL0=$(ip -6 -o addr show dev eth0 scope link | awk '{print $4}' | cut -d/ -f1) LL1=
  ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE || die "rxe0 port is not PORT_ACTIVE"
  echo "RXEVM: $NODE_NAME rxe0 on eth0 ${NODE_IP}, gid[$G4] IPv4, gid[$GLL] $LL0, ready at guest uptime $(up) s"
  status "STAGE=rxe-up"
  status "STAGE=selftest-passed"
else
# rxe0 and rxe1 on the two ends of a veth pair, IPv6 link-local only. accept_dad=0 makes the
# addresses (and with them the GIDs) usable at once.
ip link add veth0 mtu "$MTU" type veth peer name veth1 mtu "$MTU" || die "ip link add veth failed"
ip link set veth0 up && ip link set veth1 up || die "veth up failed"
rdma link add rxe0 type rxe netdev veth0 || die "rdma link add rxe0 failed"
rdma link add rxe1 type rxe netdev veth1 || die "rdma link add rxe1 failed"

# Index of the first RoCE v2 link-local GID. Shell builtins over 16 slots only: forking a reader
# per slot over all 1024 takes about 20 s per device under TCG.
gid_index() {
  d=/sys/class/infiniband/$1/ports/1
  for i in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
    read -r g <"$d/gids/$i" 2>/dev/null || continue
    read -r t <"$d/gid_attrs/types/$i" 2>/dev/null || continue
    case $g in fe80:*) [ "$t" = "RoCE v2" ] && { echo "$i"; return 0; } ;; esac
  done
  return 1
}
n=0
until G0=$(gid_index rxe0) && G1=$(gid_index rxe1); do
  n=$((n + 1))
  [ $n -gt 100 ] && die "no RoCE v2 link-local GID on rxe0/rxe1 after 10 s"
  usleep 100000
done
LL0=$(ip -6 -o addr show dev veth0 scope link | awk '{print $4}' | cut -d/ -f1)
LL1=$(ip -6 -o addr show dev veth1 scope link | awk '{print $4}' | cut -d/ -f1)
ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE || die "rxe0 port is not PORT_ACTIVE"
echo "RXEVM: rxe0 gid[$G0] $LL0 (veth0), rxe1 gid[$G1] $LL1 (veth1), ready at guest uptime $(up) s"
status "STAGE=rxe-up"

if [ "$SELFTEST" = 1 ]; then
  # RC pingpong, server on rxe0 and client on rxe1: registration, RC QPs and real packets over
  # the veth pair. QP numbers travel over TCP on 127.0.0.1:18515.
  timeout 60 ibv_rc_pingpong -d rxe0 -g "$G0" -n 100 >/tmp/pp.srv 2>&1 &
  server=$!
  n=0
  while ! netstat -ltn 2>/dev/null | grep -q ':18515 '; do
    n=$((n + 1))
    [ $n -gt 300 ] && break
    usleep 100000
  done
  timeout 60 ibv_rc_pingpong -d rxe1 -g "$G1" -n 100 127.0.0.1 >/tmp/pp.cli 2>&1
  client_rc=$?
  wait $server
  server_rc=$?
  if [ $client_rc != 0 ] || [ $server_rc != 0 ]; then
    sed 's/^/  pingpong server| /' /tmp/pp.srv
    sed 's/^/  pingpong client| /' /tmp/pp.cli
    die "self-test RC pingpong rxe1 -> rxe0 failed (server rc=$server_rc, client rc=$client_rc)"
  fi
  echo "RXEVM: self-test RC pingpong rxe1 -> rxe0: $(grep -m1 'bytes in' /tmp/pp.cli)"
fi
status "STAGE=selftest-passed"
fi

if [ -f /ctl/cmd.sh ]; then
  # The host's / read-only, under an overlay whose writes stay in guest memory.
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower ||
    die "mount of the host root failed"
  mount -t tmpfs -o mode=755 tmpfs /upper
  mkdir -p /upper/data /upper/work
  mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot ||
    die "overlay mount over the host root failed"
  R=/newroot
  mount -t proc proc $R/proc
  mount -t sysfs sysfs $R/sys
  mount -t devtmpfs devtmpfs $R/dev
  mkdir -p $R/dev/shm $R/dev/pts
  # devtmpfs has no /dev/fd: bash process substitution <(...) needs it.
  ln -sf /proc/self/fd $R/dev/fd
  ln -sf /proc/self/fd/0 $R/dev/stdin; ln -sf /proc/self/fd/1 $R/dev/stdout; ln -sf /proc/self/fd/2 $R/dev/stderr
  mount -t tmpfs tmpfs $R/dev/shm
  mount -t devpts devpts $R/dev/pts
  mount -t tmpfs -o mode=755 tmpfs $R/run
  RW=
  [ -f /ctl/rw ] && read -r RW </ctl/rw
  if [ -n "$RW" ]; then
    mkdir -p "$R$RW"
    mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=512000,cache=loose rwdir "$R$RW" ||
      die "mount of the read-write dir $RW failed"
  fi
  mkdir -p $R/run/rxevm
  cp /ctl/cmd.sh $R/run/rxevm/cmd.sh
  if [ -n "$NODE_IP" ]; then  # names of the pair for MPI; the overlay keeps the host's file intact
    printf '127.0.0.1 localhost\n10.77.0.1 nodea\n10.77.0.2 nodeb\n' >$R/etc/hosts
    echo "$NODE_NAME" >$R/etc/hostname
  fi
  echo "RXEVM: running the command (bound ${STO} s) at guest uptime $(up) s"
  status "STAGE=command"
  t0=$(cut -d. -f1 /proc/uptime)
  chroot $R /usr/bin/timeout -k 10 "$STO" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RXE_DEV0=rxe0 RXE_DEV1=rxe1 RXE_GID0="$G0" RXE_GID1="$G1" RXE_LL0="$LL0" RXE_LL1="$LL1" \
    RXE_GID="$G0" RXE_GID_LL="${GLL:-}" RXE_IP="${NODE_IP%/*}" RXE_PEER="$NODE_PEER" RXE_NAME="$NODE_NAME" \
    /bin/bash /run/rxevm/cmd.sh </dev/null
  rc=$?
  t1=$(cut -d. -f1 /proc/uptime)
  echo "RXEVM: command exited $rc after $((t1 - t0)) s"
  status "RC=$rc"
  [ $rc = 124 ] && status "REASON=command timed out after ${STO} s in the guest"
  sync
  [ -n "$RW" ] && umount "$R$RW"
fi
status "STAGE=done"
finish
INIT
}

# ---------------------------------------------------------------------------------------------
accel_args() {
  local accel=$ACCEL
  if [ "$accel" = auto ]; then
    accel=tcg
    if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then accel=kvm; fi
  fi
  case $accel in
    kvm) echo "-accel kvm -cpu host" ;;
    tcg) echo "-accel tcg${RXEVM_TB_SIZE:+,tb-size=$RXEVM_TB_SIZE}" ;;  # tb-size: MiB of TCG code cache (default 1 GiB, most of the RSS)
    *) fail 125 "RXEVM_ACCEL must be auto, kvm or tcg (got $accel)" ;;
  esac
}

# What every boot needs: a timeout with room for boot, QEMU, a kernel and an initramfs.
check_bootable() {  # check_bootable TIMEOUT
  if ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 60 ]; then
    fail 125 "--timeout wants seconds >= 60"
  fi
  command -v qemu-system-x86_64 >/dev/null || fail 125 "qemu-system-x86_64 missing: run setup"
  if [ ! -f "$WORK/vmlinuz" ] || [ ! -f "$WORK/initramfs.cpio.gz" ]; then
    fail 125 "no guest kernel/initramfs in $WORK: run setup and build first"
  fi
  if [ -f "$WORK/kernel/.key" ] && [ "$(cat "$WORK/initramfs.key" 2>/dev/null)" != "$(initramfs_key)" ]; then
    log "warning: the initramfs is older than its inputs: run build"
  fi
}

# The script a guest's /init runs: CMD in the caller's working directory (or /).
write_cmd() {  # write_cmd FILE CMD...
  local file=$1
  shift
  {
    echo '#!/bin/bash'
    printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
    printf '%q ' "$@"
    echo
  } >"$file"
}

cmd_run() {
  local rw="" timeout=$TIMEOUT
  while [ $# -gt 0 ]; do
    case $1 in
      --rw) [ $# -ge 2 ] || usage; rw=$2; shift 2 ;;
      --timeout) [ $# -ge 2 ] || usage; timeout=$2; shift 2 ;;
      --) shift; break ;;
      -*) usage ;;
      *) break ;;
    esac
  done
  check_bootable "$timeout"

  mkdir -p "$WORK/runs" "$WORK/logs"
  local ctl
  ctl=$(mktemp -d "$WORK/runs/run.XXXXXX")
  # shellcheck disable=SC2064  # expand now: ctl is local
  trap "rm -rf '$ctl'" EXIT
  local -a share=(-virtfs "local,path=$ctl,mount_tag=rxevmctl,security_model=none")
  if [ $# -gt 0 ]; then
    write_cmd "$ctl/cmd.sh" "$@"
    # multidevs=remap: the host's / spans several filesystems whose inode numbers would collide.
    share+=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
  fi
  if [ -n "$rw" ]; then
    [ $# -gt 0 ] || fail 125 "--rw needs a command"
    [ -d "$rw" ] || fail 125 "--rw $rw: not a directory"
    rw=$(readlink -f "$rw")
    echo "$rw" >"$ctl/rw"
    share+=(-virtfs "local,path=$rw,mount_tag=rwdir,security_model=none,multidevs=remap")
  fi
  # The guest bounds the command itself, leaving the host-side timeout for boot and power-off,
  # so that a slow command is reported as such and not as a hung guest.
  local guest_timeout=$((timeout - 90))
  [ $guest_timeout -ge 30 ] || guest_timeout=$((timeout * 2 / 3))
  # RXEVM_APPEND comes last so that it can override any rxevm.* value.
  local append="console=ttyS0 panic=-1 rxevm.timeout=$guest_timeout rxevm.mtu=$GUEST_MTU"
  append+=" rxevm.selftest=$SELFTEST $GUEST_APPEND"
  local accel
  accel=$(accel_args)
  local logf
  logf=$WORK/logs/guest-$(date +%Y%m%d-%H%M%S)-$$.log
  # Keep the 30 newest logs.
  find "$WORK/logs" -name 'guest-*.log' -printf '%T@ %p\n' | sort -rn | tail -n +31 |
    cut -d' ' -f2- | xargs -r rm -f

  local t0 qrc attempt
  for attempt in 1 2; do
    log "booting the guest ($accel, bound ${timeout} s), log: $logf"
    t0=$SECONDS
    # -nic none: no network device; all RDMA traffic stays on the guest's veth pair.
    # -no-reboot with panic=-1: a crashed /init ends QEMU instead of looping.
    # </dev/null: QEMU must not eat the caller's stdin. sed -u: live output, no CRs or escapes.
    # --foreground keeps QEMU in the caller's process group, so Ctrl-C or a CI runner's signal
    # ends it too; QEMU ignores SIGPIPE and would otherwise run on until the timeout.
    set +e
    # shellcheck disable=SC2086  # accel is a list of words
    timeout --foreground -k 10 "$timeout" qemu-system-x86_64 -nographic -no-reboot -nic none \
      -m "$GUEST_MEM" -smp "$GUEST_SMP" $accel \
      -kernel "$WORK/vmlinuz" -initrd "$WORK/initramfs.cpio.gz" -append "$append" \
      "${share[@]}" </dev/null 2>&1 | sed -u 's/\r$//; s/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g' | tee "$logf"
    qrc=${PIPESTATUS[0]}
    set -e
    log "guest ran $((SECONDS - t0)) s (qemu exit $qrc)"
    # A guest kernel that dies before /init mounted the control share ran none of this project's
    # code: under TCG with two vCPUs it has been seen to oops on a stale int3 left by kernel text
    # patching during boot. That one fault gets a second boot, said loudly; anything later is
    # the run's own result.
    if [ "$attempt" = 1 ] && [ "$qrc" = 0 ] && [ ! -s "$ctl/status" ] &&
      grep -qE 'Kernel panic|Oops|BUG:' "$logf"; then
      log "the guest kernel died before /init (see $logf): booting it once more"
      logf=${logf%.log}-retry.log
      continue
    fi
    break
  done
  local elapsed=$((SECONDS - t0))

  local stage rc reason
  touch "$ctl/status"  # absent when the guest died before mounting the control share
  stage=$(sed -n 's/^STAGE=//p' "$ctl/status" | tail -1)
  rc=$(sed -n 's/^RC=//p' "$ctl/status" | tail -1)
  reason=$(sed -n 's/^REASON=//p' "$ctl/status" | head -1)
  # A failure before the control share was mounted is only on the console.
  [ -n "$reason" ] || reason=$(sed -n 's/^RXEVM: FATAL: //p' "$logf" | head -1)
  if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    result FAIL "guest killed by the ${timeout} s host-side timeout at stage ${stage:-before-boot}; log $logf"
    return 124
  fi
  if [ "$qrc" != 0 ]; then
    result FAIL "qemu exited $qrc at stage ${stage:-before-boot}; log $logf"
    return 125
  fi
  if [ "$stage" != "done" ]; then
    result FAIL "${reason:-guest stopped at stage ${stage:-before-boot}}; log $logf"
    return 125
  fi
  if [ $# -eq 0 ]; then
    result PASS "rxe0/rxe1 up, self-test passed, ${elapsed} s"
    return 0
  fi
  [[ $rc =~ ^[0-9]+$ ]] || { result FAIL "guest reported no exit status; log $logf"; return 125; }
  if [ "$rc" = 0 ]; then
    result PASS "command exited 0, guest ran ${elapsed} s"
  else
    result FAIL "${reason:-command exited $rc}; log $logf"
  fi
  return "$rc"
}


# ---------------------------------------------------------------------------------------------
# pair [--timeout SEC] [--b SCRIPT_B] [--] CMD...: two guests at once, nodea (10.77.0.1) and nodeb
# (10.77.0.2), each with rxe0 on its own virtio-net eth0 and no other link. The two NICs are
# joined by QEMU's dgram netdev: UDP between 127.0.0.1:$RXEVM_WIRE_PORT and the next port, so the
# wire never leaves the host's loopback and needs no tap, bridge or privilege (RXEVM_WIRE=udp,
# socket or stream pick older or TCP spellings; TCP costs ~15x in latency). nodea runs CMD,
# nodeb SCRIPT_B (default scripts/rxe/pair/serve.sh: the command channel nodea's
# scripts/rxe/pair/agent.sh talks to, also Open MPI's rsh agent). Each runs
# in the host's / under chroot, as in `run`, with RXE_NAME, RXE_IP, RXE_PEER,
# RXE_GID (IPv4 RoCE v2 GID index) and RXE_GID_LL (link-local). B is expected to end when A's
# command tells it to; it is killed by pid RXEVM_B_GRACE [30] seconds after A ends. Defaults
# differ from `run`: RXEVM_SMP 1, RXEVM_MEM 512, RXEVM_TB_SIZE 128 (MiB of TCG code cache), as
# four vCPU threads on a 2-core host starve each other's pollers. A kernel Oops, BUG or panic on
# either console fails the pair. Exit status: CMD's; 125 when a guest itself failed.
cmd_pair() {
  local timeout=$TIMEOUT sb
  sb=$(dirname "$SELF")/pair/serve.sh
  while [ $# -gt 0 ]; do
    case $1 in
      --timeout) [ $# -ge 2 ] || usage; timeout=$2; shift 2 ;;
      --b) [ $# -ge 2 ] || usage; sb=$2; shift 2 ;;
      --) shift; break ;;
      -*) usage ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || usage
  check_bootable "$timeout"
  GUEST_SMP=${RXEVM_SMP:-1} GUEST_MEM=${RXEVM_MEM:-512}
  export RXEVM_TB_SIZE=${RXEVM_TB_SIZE:-128}
  sb=$(readlink -f "$sb")
  [ -f "$sb" ] || fail 125 "pair: nodeb's script $sb is not a file"
  local port=${RXEVM_WIRE_PORT:-17701} grace=${RXEVM_B_GRACE:-30}
  local accel guest_timeout=$((timeout - 90))
  accel=$(accel_args)
  mkdir -p "$WORK/runs" "$WORK/logs"
  local ca cb stamp
  ca=$(mktemp -d "$WORK/runs/a.XXXXXX") cb=$(mktemp -d "$WORK/runs/b.XXXXXX")
  stamp=$(date +%Y%m%d-%H%M%S)-$$
  local loga=$WORK/logs/pair-$stamp-a.log logb=$WORK/logs/pair-$stamp-b.log
  # Keep the 30 newest.
  find "$WORK/logs" -name 'pair-*.log' -printf '%T@ %p\n' | sort -rn | tail -n +31 |
    cut -d' ' -f2- | xargs -r rm -f
  # shellcheck disable=SC2064
  trap "rm -rf '$ca' '$cb'" EXIT
  write_cmd "$ca/cmd.sh" "$@"
  write_cmd "$cb/cmd.sh" bash "$sb"
  ss -Htuln "( sport = :$port or sport = :$((port + 1)) )" | grep -q . &&
    fail 125 "127.0.0.1:$port or $((port + 1)) is in use (set RXEVM_WIRE_PORT)"
  local common="console=ttyS0 panic=-1 rxevm.timeout=$guest_timeout rxevm.mtu=$GUEST_MTU $GUEST_APPEND"
  boot() {  # boot NAME IP PEER MAC NETDEV CTL LOG
    # shellcheck disable=SC2086
    timeout -k 10 "$timeout" qemu-system-x86_64 -nographic -no-reboot \
      -m "$GUEST_MEM" -smp "$GUEST_SMP" $accel \
      -kernel "$WORK/vmlinuz" -initrd "$WORK/initramfs.cpio.gz" \
      -append "$common rxevm.name=$1 rxevm.ip=$2/24 rxevm.peer=$3" \
      -netdev "$5" -device "virtio-net-pci,netdev=wire,mac=$4" \
      -virtfs "local,path=$6,mount_tag=rxevmctl,security_model=none" \
      -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
      </dev/null >"$7" 2>&1 &
  }
  local t0=$SECONDS pa pb
  log "booting nodea ($accel), log $loga"
  # The wire, always on 127.0.0.1. dgram (UDP, default): no ordering, no Nagle. socket/stream
  # (TCP): B's connect fails unless A already listens, so A is started first and polled for.
  local na nb lo=127.0.0.1 wire=${RXEVM_WIRE:-dgram}
  case $wire in
    dgram)
      na="dgram,id=wire,local.type=inet,local.host=$lo,local.port=$port,remote.type=inet,remote.host=$lo,remote.port=$((port + 1))"
      nb="dgram,id=wire,local.type=inet,local.host=$lo,local.port=$((port + 1)),remote.type=inet,remote.host=$lo,remote.port=$port" ;;
    udp) na="socket,id=wire,udp=$lo:$((port + 1)),localaddr=$lo:$port"
      nb="socket,id=wire,udp=$lo:$port,localaddr=$lo:$((port + 1))" ;;
    socket) na="socket,id=wire,listen=$lo:$port" nb="socket,id=wire,connect=$lo:$port" ;;
    stream) na="stream,id=wire,server=on,addr.type=inet,addr.host=$lo,addr.port=$port"
      nb="stream,id=wire,server=off,addr.type=inet,addr.host=$lo,addr.port=$port" ;;
    *) fail 125 "RXEVM_WIRE must be dgram, udp, socket or stream" ;;
  esac
  log "wire: $wire on $lo:$port"
  # The wire's sockets take the host's default receive buffer (212 KiB on Debian): less than
  # one burst of RDMA READ responses, whose loss sends rxe into its retry paths (where the
  # guest kernel's rxe has crashed). Raised while the guests start, when this may.
  local rmem rmem_set=
  rmem=$(cat /proc/sys/net/core/rmem_default 2>/dev/null || echo 0)
  if [ "$rmem" -lt 8388608 ] && echo 8388608 2>/dev/null >/proc/sys/net/core/rmem_default; then
    rmem_set=$rmem
  fi
  boot nodea 10.77.0.1 10.77.0.2 52:54:00:77:00:01 "$na" "$ca" "$loga"
  pa=$!
  local n=0
  case $wire in socket | stream)
    until ss -Htln "sport = :$port" | grep -q .; do
      n=$((n + 1)); [ $n -gt 100 ] && { kill "$pa"; fail 125 "nodea never listened on $port"; }
      sleep 0.1
    done ;;
  esac
  log "booting nodeb, log $logb"
  boot nodeb 10.77.0.2 10.77.0.1 52:54:00:77:00:02 "$nb" "$cb" "$logb"
  pb=$!
  echo "$pa $pb" >"$ca/pids"  # for a caller that must end them by pid
  if [ -n "$rmem_set" ]; then  # QEMU opens its sockets at start-up
    for n in $(seq 100); do
      [ "$(ss -Huln "( sport = :$port or sport = :$((port + 1)) )" | wc -l)" -ge 2 ] && break
      sleep 0.1
    done
    echo "$rmem_set" >/proc/sys/net/core/rmem_default
    log "wire sockets opened with an 8 MiB receive buffer (host default $rmem_set restored)"
  fi
  local qa qb
  # A nodeb whose kernel crashed leaves nodea's command waiting for it until its time-out: end
  # nodea at once (the crash fails the pair below).
  while kill -0 "$pa" 2>/dev/null; do
    if ! kill -0 "$pb" 2>/dev/null && grep -qE 'Oops|BUG:|Kernel panic' "$logb"; then
      log "nodeb's kernel crashed: ending nodea"
      kill "$pa" 2>/dev/null
      break
    fi
    sleep 1
  done
  wait "$pa"; qa=$?
  log "nodea ended after $((SECONDS - t0)) s (qemu exit $qa)"
  n=0
  while kill -0 "$pb" 2>/dev/null && [ $n -lt $((grace * 10)) ]; do sleep 0.1; n=$((n + 1)); done
  kill -0 "$pb" 2>/dev/null && { log "nodeb still running: killing pid $pb"; kill "$pb"; }
  wait "$pb"; qb=$?
  log "nodeb ended after $((SECONDS - t0)) s (qemu exit $qb)"
  sed 's/\r$//; s/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g; s/^/A| /' "$loga"
  sed 's/\r$//; s/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g; s/^/B| /' "$logb"
  touch "$ca/status" "$cb/status"
  local rca rcb
  rca=$(sed -n 's/^RC=//p' "$ca/status" | tail -1) rcb=$(sed -n 's/^RC=//p' "$cb/status" | tail -1)
  local oops
  oops=$(grep -lE 'Oops|BUG:|Kernel panic' "$loga" "$logb" | tr '\n' ' ' || true)
  if [ -n "$oops" ]; then
    result FAIL "a guest kernel crashed (nodea rc=${rca:-none}); see $oops"
    return 125
  fi
  if [ "$rca" = 0 ]; then
    result PASS "nodea command exited 0 (nodeb rc=${rcb:-none}), pair ran $((SECONDS - t0)) s"
  else
    result FAIL "nodea rc=${rca:-none} stage=$(sed -n 's/^STAGE=//p' "$ca/status" | tail -1), nodeb rc=${rcb:-none}; logs $loga $logb"
  fi
  [[ $rca =~ ^[0-9]+$ ]] && return "$rca"
  return 125
}

# ---------------------------------------------------------------------------------------------
case ${1:-} in
  setup) cmd_setup ;;
  build) cmd_build ;;
  run) shift; cmd_run "$@" ;;
  pair) shift; cmd_pair "$@" ;;
  all) shift; cmd_setup; cmd_build; cmd_run "$@" ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
