#!/bin/sh
# ipmi_sim chassis control: `get power` prints power:N; `set power N`, `set shutdown 1`
# (soft off) and `set reset 1` change the state kept in power.state beside the script.
state="$(dirname "$0")/power.state"
[ -f "$state" ] || echo 1 > "$state"
case "$1" in
get) echo "power:$(cat "$state")" ;;
set)
    shift
    while [ $# -ge 2 ]; do
        case "$1" in
        power) echo "$2" > "$state" ;;
        shutdown) echo 0 > "$state" ;;
        esac
        shift 2
    done
    ;;
esac
