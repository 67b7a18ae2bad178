#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# usage: check_references.sh PROGRAM NODE
# Every mrc_* function PROGRAM imports is versioned NODE: the program stands for one built
# against that release.
set -euo pipefail
prog=$1
node=$2
mapfile -t refs < <(objdump -T "$prog" | awk '/\*UND\*/ && $NF ~ /^mrc_/ {print $(NF-1) " " $NF}')
((${#refs[@]})) || { echo "FAIL: $prog imports no mrc_* function"; exit 1; }
bad=0
for ref in "${refs[@]}"; do
  [[ ${ref%% *} == "($node)" ]] || { echo "FAIL: $prog imports ${ref#* } as ${ref%% *}"; bad=1; }
done
((bad == 0)) || exit 1
echo "ok: $prog imports ${#refs[@]} mrc_* functions, all $node"
