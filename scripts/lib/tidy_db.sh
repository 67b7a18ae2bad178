# SPDX-License-Identifier: BSD-3-Clause
# Sourced by scripts/check-naming.sh and scripts/tidy.sh.

# mrc_tidy_database BUILD_DIR: prints a directory holding BUILD_DIR's compile_commands.json
# without the precompiled header's flags (MRC_PRECOMPILED_HEADERS): clang-tidy cannot read the
# .gch files GCC made, and every header the precompiled one holds is included by the file too.
# The caller removes the directory.
mrc_tidy_database() {
  local dir
  dir=$(mktemp -d /tmp/mrcache-tidy-db.XXXXXX)
  sed -E 's# -include [^ "]*/cmake_pch\.hxx##g; s# -Winvalid-pch##g' \
    "$1/compile_commands.json" >"$dir/compile_commands.json"
  echo "$dir"
}
