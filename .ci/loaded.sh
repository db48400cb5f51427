#!/usr/bin/env bash
# `make test-loaded`: run the command given (the default suite) while two busy-loop processes
# hold both cores, as a loaded CI host does; the loops end when the command ends, pass or fail.
set -uo pipefail
loops=()
stop_loops() { kill "${loops[@]}" 2>/dev/null; wait "${loops[@]}" 2>/dev/null; }
trap stop_loops EXIT
trap 'exit 130' INT TERM
for _ in 1 2; do
    bash -c 'while :; do :; done' &
    loops+=($!)
done
echo "busy loops: ${loops[*]}"
"$@"
