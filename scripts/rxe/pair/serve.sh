#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# serve.sh: nodeb's script in the pair. Runs the commands nodea sends (agent.sh) until one of
# them creates /run/rxe-pair-stop. The listener is on the guests' private wire only, which the
# host cannot reach: acceptable in throwaway guests, not a pattern for anything else.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
here=$(dirname "$(readlink -f "$0")")
echo "serve: $(hostname) $RXE_IP, rxe0 GID index $RXE_GID"
socat -t 86400 TCP-LISTEN:2222,bind="$RXE_IP",reuseaddr,fork EXEC:"$here/rexec.sh" &
listener=$!
while [ ! -e /run/rxe-pair-stop ] && kill -0 $listener 2>/dev/null; do sleep 0.3; done
kill $listener 2>/dev/null
echo "serve: stopped at uptime $(cut -d' ' -f1 /proc/uptime) s"
