#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The README's C example is examples/minimal.c (without its licence line): fails when they differ.
# usage: readme_check.sh REPOSITORY
set -euo pipefail
repo=$1
diff -u <(tail -n +2 "$repo/examples/minimal.c") \
  <(awk '/^```c$/ { inside = 1; next } inside && /^```$/ { exit } inside' "$repo/README.md") ||
  { echo "README.md's C example differs from examples/minimal.c: copy the file into it"; exit 1; }
