# SPDX-License-Identifier: BSD-3-Clause
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
# only needs to be readable and searchable by nobody. When a test fails, that directory stays
# and mrc_nobody_results names it.
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
  # Kept when a test failed, for mrc_ctest_failures (mrc_nobody_results names it).
  if ((status == 0)); then rm -rf "$results"; else mrc_nobody_results=$results; fi
  return "$status"
}

# mrc_nobody_can_read DIR: whether nobody can search DIR and read what is in it.
mrc_nobody_can_read() {
  setpriv --reuid=nobody --regid=nogroup --clear-groups \
    sh -c 'test -x "$1" && test -r "$1/CTestTestfile.cmake"' sh "$1" 2>/dev/null
}

# mrc_ctest_failures DIR [LINES]: the tests that the last ctest run in DIR (a build directory,
# or the results directory of mrc_ctest_as_nobody) failed, each with the last LINES (default
# 30) lines of its output, from DIR/Testing/Temporary/LastTest.log. CI prints this in its
# summary so that the end of its output names what failed.
mrc_ctest_failures() {
  local dir=$1 lines=${2:-30} failed=$1/Testing/Temporary/LastTestsFailed.log
  [[ -s $failed ]] || return 0
  local name
  while IFS= read -r name; do
    name=${name#*:}
    printf '  --- %s: the last %d lines of its output\n' "$name" "$lines"
    awk -v name="$name" '
      $0 ~ /^[0-9]+\/[0-9]+ Test: / { sub(/^[0-9]+\/[0-9]+ Test: /, ""); mine = ($0 == name); next }
      mine && /^Output:$/ { getline; out = 1; next }
      mine && out && /^<end of output>$/ { getline; print "    (" $0 ")"; out = 0; mine = 0; next }
      mine && out { print "    " $0 }
    ' "$dir/Testing/Temporary/LastTest.log" | tail -n "$lines"
  done <"$failed"
}
