#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs the whole build, library and programs, into a fresh prefix (cmake --install --prefix)
# and into a staging tree (DESTDIR), and runs every installed program (--help) from each tree with
# no LD_LIBRARY_PATH: a program must start, and one that needs libmrcache.so must load the one of
# its own tree, wherever that tree is (the programs that link the shared library carry a RUNPATH
# relative to themselves; the others link libmrcache.a).
#
# usage: programs_test.sh BUILD_DIR WORK_DIR [PROGRAM...]   (the programs this build installs)
# env:   CMAKE  (the build's own cmake)
#        MRC_FI_PROBE  a libfabric program (tests/integrations/fi_init_probe.c): when the build
#                      installs libmrcache-fi.so, libfabric must load it from the installed tree
#                      and take its monitor
set -euo pipefail

build=$(realpath "$1")
work=$2
shift 2
expected=()
for p in "$@"; do [[ -n $p ]] && expected+=("$p"); done
CMAKE=${CMAKE:-cmake}

step() { printf '== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
work=$(realpath "$work")

# check_tree ROOT: ROOT is where the tree's prefix landed.
check_tree() {
  local root=$1 so libdir soname prog name needed line loaded
  so=$(find "$root" -name 'libmrcache.so.*.*.*' -type f | head -1)
  [[ -n $so ]] || fail "no libmrcache.so.X.Y.Z under $root"
  libdir=$(dirname "$so")
  soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  for name in "${expected[@]}"; do
    [[ -x $root/bin/$name ]] || fail "$name is not installed in $root/bin"
  done
  local count=0
  for prog in "$root"/bin/*; do
    [[ -f $prog && -x $prog ]] || continue
    count=$((count + 1))
    needed=$(readelf -d "$prog" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    if [[ $needed == *"$soname"* ]]; then
      # "libmrcache.so.0 => /path/libmrcache.so.0 (0x...)", or "libmrcache.so.0 => not found".
      line=$(env -u LD_LIBRARY_PATH ldd "$prog" | awk -v s="$soname" '$1 == s' | xargs)
      loaded=$(awk '{print $3}' <<<"$line")
      [[ $loaded == /* && $(realpath "$loaded") == "$(realpath "$libdir/$soname")" ]] ||
        fail "$prog does not load $libdir/$soname (ldd: '$line'); its RUNPATH:" \
          "'$(readelf -d "$prog" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')'"
    fi
    env -u LD_LIBRARY_PATH "$prog" --help >"$work/out" 2>&1 ||
      fail "$prog --help exited with $?: $(head -c 2000 "$work/out")"
    echo "ok: $prog${needed:+ (needs: $needed)}"
  done
  ((count > 0)) || fail "no program installed in $root/bin"
  check_plugin "$root" "$libdir" "$soname"
}

# check_plugin ROOT LIBDIR SONAME: the libfabric plugin, when installed, loads its tree's
# libmrcache and is taken by libfabric from there.
check_plugin() {
  local root=$1 libdir=$2 soname=$3 plugin line loaded
  plugin=$(find "$root" -name libmrcache-fi.so -type f | head -1)
  [[ -n $plugin ]] || return 0
  [[ $(dirname "$plugin") == "$libdir/libfabric" ]] ||
    fail "libmrcache-fi.so is installed in $(dirname "$plugin"), not $libdir/libfabric"
  line=$(env -u LD_LIBRARY_PATH ldd "$plugin" | awk -v s="$soname" '$1 == s' | xargs)
  loaded=$(awk '{print $3}' <<<"$line")
  [[ $loaded == /* && $(realpath "$loaded") == "$(realpath "$libdir/$soname")" ]] ||
    fail "$plugin does not load $libdir/$soname (ldd: '$line')"
  if [[ -n ${MRC_FI_PROBE:-} ]]; then
    env -u LD_LIBRARY_PATH FI_PROVIDER_PATH="$libdir/libfabric" FI_LOG_LEVEL=info FI_PROVIDER=tcp \
      "$MRC_FI_PROBE" >"$work/probe" 2>&1 || fail "$MRC_FI_PROBE: $(head -c 2000 "$work/probe")"
    grep -q "imported mrcache's monitor" "$work/probe" ||
      fail "libfabric did not take the installed plugin's monitor: $(head -c 2000 "$work/probe")"
  fi
  echo "ok: $plugin (taken by libfabric)"
}

step "cmake --install $build --prefix $work/prefix"
"$CMAKE" --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install --prefix"; }
check_tree "$work/prefix"

# A staging tree, as a package build makes it: the prefix named at install is not where the files
# are, so nothing may rely on the prefix's absolute path.
step "DESTDIR=$work/stage cmake --install $build --prefix /opt/mrcache-test"
DESTDIR=$work/stage "$CMAKE" --install "$build" --prefix /opt/mrcache-test \
  >"$work/stage.log" 2>&1 || { cat "$work/stage.log"; fail "cmake --install with DESTDIR"; }
check_tree "$work/stage/opt/mrcache-test"
step "every installed program runs from both trees"
