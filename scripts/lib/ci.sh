# Helpers for .ci/run and the lanes run by hand (sourced, not run).

# mrc_label_targets BUILD_DIR LABEL: the names of the test programs (CMake targets) that carry
# ctest tests with LABEL (programs of the build, not scripts) in an already built and discovered BUILD_DIR. mrc_add_gtest names each
# program after its target, so the executable's file name is the target's name.
mrc_label_targets() {
  local build
  build=$(realpath "$1")
  ctest --test-dir "$build" -L "(^|,)$2(,|$)" --show-only=json-v1 2>/dev/null |
    tr -d '\n' | grep -oE '"command" *: *\[ *"[^"]+"' | sed -E 's/.*"([^"]+)"$/\1/' |
    grep -F "$build/" | xargs -r -n 1 basename | sort -u
}

# mrc_ctest_as_nobody BUILD_DIR CTEST_ARGS...: runs ctest on BUILD_DIR's tests as the user
# nobody (setpriv: no capabilities, no supplementary groups). ctest writes its logs into a
# fresh directory of nobody's whose CTestTestfile.cmake includes BUILD_DIR, so BUILD_DIR itself
# only needs to be readable and searchable by nobody.
mrc_ctest_as_nobody() {
  local build=$1
  shift
  local results
  results=$(mktemp -d /tmp/mrcache-nobody.XXXXXX)
  printf 'subdirs("%s")\n' "$build" >"$results/CTestTestfile.cmake"
  chown -R nobody:nogroup "$results"
  chmod 755 "$results"
  local status=0
  setpriv --reuid=nobody --regid=nogroup --clear-groups --inh-caps=-all --bounding-set=-all \
    --reset-env ctest --test-dir "$results" "$@" || status=$?
  rm -rf "$results"
  return "$status"
}

# mrc_nobody_can_read DIR: whether nobody can search DIR and read what is in it.
mrc_nobody_can_read() {
  setpriv --reuid=nobody --regid=nogroup --clear-groups \
    sh -c 'test -x "$1" && test -r "$1/CTestTestfile.cmake"' sh "$1" 2>/dev/null
}
