#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs a build of mrcache into a fresh prefix and builds programs against the INSTALLED tree
# only: the C and the C++ consumer, linked shared and static, once through pkg-config and once
# through find_package(mrcache) (a C+C++ project and a C-only one). Each program runs; shared
# ones must load libmrcache.so from the prefix, static ones must not need it at all.
#
# usage: install_test.sh BUILD_DIR WORK_DIR
# env:   CMAKE, CC, CXX, CMAKE_GENERATOR, CMAKE_MAKE_PROGRAM  (the build's own tools)
#        MRC_SANITIZE_FLAGS  (the build's -fsanitize flags: consumers need the same runtime)
set -euo pipefail

build=$(realpath "$1")
work=$2
here=$(dirname "$(realpath "${BASH_SOURCE[0]}")")
CMAKE=${CMAKE:-cmake}
CC=${CC:-cc}
CXX=${CXX:-c++}
san=${MRC_SANITIZE_FLAGS:-}

step() { printf '== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
work=$(realpath "$work")
prefix=$work/prefix

# The library's own install components (cmake/MrcInstall.cmake): what a consumer needs, and
# nothing that depends on the programs of the build having been built.
for component in mrcache_runtime mrcache_development; do
  step "cmake --install $build --prefix $prefix --component $component"
  "$CMAKE" --install "$build" --prefix "$prefix" --component "$component" >>"$work/install.log" ||
    { cat "$work/install.log"; fail "cmake --install --component $component"; }
done

# What must be there.
for f in include/mrcache/mrcache.h; do [[ -f $prefix/$f ]] || fail "missing $f"; done
so=$(find "$prefix" -name 'libmrcache.so.*.*.*' -type f | head -1)
[[ -n $so ]] || fail "no libmrcache.so.X.Y.Z installed"
libdir=$(dirname "$so")
[[ -L $libdir/libmrcache.so && -e $libdir/libmrcache.so ]] || fail "no libmrcache.so link"
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ -n $soname && -L $libdir/$soname ]] || fail "no soname link $soname"
[[ -f $libdir/libmrcache.a ]] || fail "no libmrcache.a"
[[ -f $libdir/pkgconfig/mrcache.pc ]] || fail "no mrcache.pc in $libdir/pkgconfig"
[[ -f $libdir/cmake/mrcache/mrcacheConfig.cmake ]] || fail "no CMake package"
echo "installed: $(cd "$prefix" && find . -type f -print | sort | tr '\n' ' ')"

# check_program PATH shared|static
check_program() {
  local prog=$1 link=$2 needed
  needed=$(readelf -d "$prog" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  if [[ $link == shared ]]; then
    [[ $needed == *"$soname"* ]] || fail "$prog does not need $soname (NEEDED: $needed)"
    local loaded
    loaded=$(env -u LD_LIBRARY_PATH ldd "$prog" | awk -v s="$soname" '$1 == s {print $3}')
    [[ $(realpath "$loaded") == "$(realpath "$libdir/$soname")" ]] ||
      fail "$prog loads '$loaded', not the installed $libdir/$soname"
  else
    [[ $needed != *libmrcache* ]] || fail "$prog (static) still needs libmrcache: $needed"
  fi
  env -u LD_LIBRARY_PATH "$prog" || fail "$prog exited with $?"
}

step "pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig
unset PKG_CONFIG_LIBDIR
pkg-config --exists --print-errors mrcache || fail "pkg-config cannot find mrcache"
pc_prefix=$(realpath -m "$(pkg-config --variable=prefix mrcache)")
[[ $pc_prefix == "$prefix" ]] || fail "mrcache.pc resolves prefix to $pc_prefix, not $prefix"
read -ra cflags <<<"$(pkg-config --cflags mrcache)"
read -ra libs <<<"$(pkg-config --libs mrcache)"
read -ra static_libs <<<"$(pkg-config --static --libs mrcache)"
# Static: the archive instead of -lmrcache, then everything Requires.private/Libs.private add.
static_link=()
for word in "${static_libs[@]}"; do
  if [[ $word == -lmrcache ]]; then
    static_link+=(-Wl,-Bstatic -lmrcache -Wl,-Bdynamic)
  else
    static_link+=("$word")
  fi
done
echo "pkg-config --cflags: ${cflags[*]}"
echo "pkg-config --static --libs: ${static_libs[*]}"
pc=$work/pkg-config
mkdir -p "$pc"
# shellcheck disable=SC2086
for lang in c cxx; do
  if [[ $lang == c ]]; then
    compiler=$CC src=$here/consumer.c std=-std=c11
  else
    compiler=$CXX src=$here/consumer.cc std=-std=c++17
  fi
  $compiler $std -Wall -Wextra -Werror $san "${cflags[@]}" "$src" -o "$pc/${lang}_shared" \
    "${libs[@]}" -Wl,-rpath,"$libdir" || fail "pkg-config $lang shared: compile/link"
  check_program "$pc/${lang}_shared" shared
  $compiler $std -Wall -Wextra -Werror $san "${cflags[@]}" "$src" -o "$pc/${lang}_static" \
    "${static_link[@]}" || fail "pkg-config $lang static: compile/link"
  check_program "$pc/${lang}_static" static
done

step "find_package(mrcache)"
cmake_args=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX"
  "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror $san" "-DCMAKE_CXX_FLAGS=-Wall -Wextra -Werror $san"
  "-DCMAKE_EXE_LINKER_FLAGS=$san")
[[ -n ${CMAKE_GENERATOR:-} ]] && cmake_args+=(-G "$CMAKE_GENERATOR")
[[ -n ${CMAKE_MAKE_PROGRAM:-} ]] && cmake_args+=(-DCMAKE_MAKE_PROGRAM="$CMAKE_MAKE_PROGRAM")
for project in consumer consumer-c; do
  out=$work/$project
  "$CMAKE" -S "$here/$project" -B "$out" "${cmake_args[@]}" >"$out.log" 2>&1 ||
    { cat "$out.log"; fail "configure $project"; }
  found=$(sed -n 's/.*mrcache package: //p' "$out.log")
  [[ $(realpath "$found") == "$libdir/cmake/mrcache" ]] ||
    fail "$project found the package in '$found', not in $libdir/cmake/mrcache"
  "$CMAKE" --build "$out" >>"$out.log" 2>&1 || { cat "$out.log"; fail "build $project"; }
done
for prog in consumer/c_shared consumer/cxx_shared consumer-c/c_only_shared; do
  check_program "$work/$prog" shared
done
for prog in consumer/c_static consumer/cxx_static consumer-c/c_only_static; do
  check_program "$work/$prog" static
done
step "all consumers built against $prefix and ran"
