#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# agent.sh [-opts...] HOST CMD...: the ssh of the two-guest pair (scripts/rxe/vm.sh pair), also
# Open MPI's plm_rsh_agent. Sends CMD as one line to serve.sh's listener on HOST:2222, prints
# what it prints (stderr included) and exits with its status (255: no answer).
while [[ ${1:-} == -* ]]; do shift; done
host=$1
shift
# -t 86400: the connection lives until the remote command closes its output (socat's default
# half-close time-out, 0.5 s, loses the output of anything slower).
printf '%s\n' "$*" | socat -t 86400 - TCP:"$host":2222,connect-timeout=5 |
  awk '/^__RXEPAIR_RC=/ {rc = substr($0, 14); next} {print; fflush()} END {exit rc == "" ? 255 : rc}'
