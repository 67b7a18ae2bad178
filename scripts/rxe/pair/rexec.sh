#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# rexec.sh: runs under serve.sh's listener, once per connection: the first line is a shell
# command (as ssh would get it); its output, stderr included, goes back, then its status.
IFS= read -r cmd
bash -c "$cmd" </dev/null 2>&1
echo "__RXEPAIR_RC=$?"
