#!/usr/bin/env bash
# What the NVML source meets on a real GPU node, as root and as an unprivileged user:
# `gpuconsole doctor` (JSON and text) and the NVML tests, each under a time limit, the whole
# run inside 4.5 minutes. Everything lands as flat files in $OUT (8 at most):
#   run.log                   what ran, exit codes, times; the node (nvidia-smi, /dev/nvidia*, params)
#   doctor-root.json/.txt     doctor as root
#   doctor-user.json/.txt     doctor as an unprivileged user made for the run
#   doctor-root-image-pynvml.txt  doctor as root with the image's own nvidia-ml-py, not the pin
#   pytest-root.txt, pytest-user.txt   tests/test_nvml_real.py and the fake-library NVML tests
#   guest.txt                 `agent --guest` on the real driver, asked as a host asks it (unix
#                             socket and vsock), as root and as the unprivileged user
#
# Run from the repository root, as root, with python3 on PATH and the wheels in .whl/
# (nvidia-ml-py, orjson and pytest-asyncio: see the download commands in the report):
#   OUT=/some/folder bash contrib/device-check.sh
# Nothing is downloaded; nothing outside /tmp and the new user is changed.
set -u

OUT=${OUT:-$PWD/device-check-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
LOG=$OUT/run.log
ERR=/tmp/gpuconsole-check-step.stderr  # outside $OUT: only the eight files come back
: >"$LOG"
START=$(date +%s)
DEADLINE=$((START + 320))
PY=$(command -v python3)
SITE=/tmp/gpuconsole-site
ASYNCIO_SITE=/tmp/gpuconsole-site-asyncio
SRC=/tmp/gpuconsole-src
HOME_DIR=/tmp/gpuconsole-user-home
USER_NAME=gpucheck

say() { echo "$*" | tee -a "$LOG"; }

# The seconds a step may take: its own cap, or what is left before the deadline.
budget() {
    local left=$((DEADLINE - $(date +%s) - 5))
    ((left < 1)) && left=1
    ((left < $1)) && echo "$left" || echo "$1"
}

# step NAME CAP OUTFILE COMMAND...: run with a time limit, its output to OUTFILE, a line in the log.
step() {
    local name=$1 cap=$2 outfile=$3
    shift 3
    local limit began rc ms
    limit=$(budget "$cap")
    began=$(date +%s%N)
    timeout --kill-after=5 "$limit" "$@" >"$outfile" 2>"$ERR"
    rc=$?
    ms=$((($(date +%s%N) - began) / 1000000))
    say "[$name] exit $rc in $((ms / 1000)).$((ms % 1000 / 100)) s (limit $limit s) -> $(basename "$outfile")"
    sed "s/^/    [$name stderr] /" "$ERR" >>"$LOG"
}

say "== gpuconsole device check, $(date -u +%FT%TZ), $(uname -srm)"
say "python3: $PY ($("$PY" --version 2>&1))"
{
    "$PY" -m pip show nvidia-ml-py pytest 2>/dev/null | grep -E '^(Name|Version):'
    echo "-- nvidia-smi"
    timeout 20 nvidia-smi 2>&1
    timeout 20 nvidia-smi -q 2>&1 | grep -E -i 'driver version|cuda version|product name|mig mode|current *:|persistence|bus id|virtualization' | head -40
    echo "-- /dev/nvidia*"
    ls -l /dev/nvidia* 2>&1
    echo "-- /proc/driver/nvidia/params (profiling)"
    grep -i profil /proc/driver/nvidia/params 2>&1
    echo "-- libnvidia-ml"
    ldconfig -p 2>/dev/null | grep -i nvidia-ml
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} >>"$LOG" 2>&1

# The project's pinned nvidia-ml-py and orjson over the image's; pytest-asyncio only where the
# image's pytest is new enough for it (it is a plugin: a mismatch would stop every test run).
rm -rf "$SITE" "$ASYNCIO_SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
    .whl/nvidia_ml_py-*.whl .whl/orjson-*.whl >>"$LOG" 2>&1 || say "wheel install failed"
EXTRA=""
if "$PY" -c 'import sys, pytest; sys.exit(pytest.version_tuple < (8, 4))' 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$ASYNCIO_SITE" \
        .whl/pytest_asyncio-*.whl >>"$LOG" 2>&1 && EXTRA=":$ASYNCIO_SITE"
else
    say "pytest older than 8.4: the async NVML source tests run without pytest-asyncio"
fi

# A copy of the tree every user can read (the checkout may sit under root's home).
rm -rf "$SRC" && mkdir -p "$SRC"
tar --exclude=./.whl --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C "$SRC"
chmod -R a+rX "$SRC" "$SITE" ${EXTRA:+"$ASYNCIO_SITE"}

if id "$USER_NAME" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$USER_NAME" >>"$LOG" 2>&1; then
    RUN_AS=$USER_NAME
else
    RUN_AS=nobody
    say "useradd failed: running as nobody"
fi
mkdir -p "$HOME_DIR" && chown "$RUN_AS" "$HOME_DIR" 2>/dev/null
say "unprivileged user: $(id "$RUN_AS" 2>&1)"

ENV=(env -i "PATH=$PATH" "HOME=$HOME_DIR" "LANG=C.UTF-8" "PYTHONDONTWRITEBYTECODE=1"
    "PYTHONPATH=$SITE:$SRC$EXTRA" "GPUCONSOLE_REAL_NVML=1" "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")
AS_ROOT=("${ENV[@]}" HOME=/root)
if command -v setpriv >/dev/null; then
    AS_USER=(setpriv --reuid="$RUN_AS" --regid="$(id -g "$RUN_AS")" --clear-groups "${ENV[@]}")
else
    AS_USER=(runuser -u "$RUN_AS" -- "${ENV[@]}")
fi
cd "$SRC" || exit 1
{
    echo "-- $RUN_AS's python3:"
    "${AS_USER[@]}" "$PY" -c 'import sys, pynvml; print(sys.version.split()[0], pynvml.__file__)' 2>&1
} >>"$LOG"

DOCTOR=("$PY" -m gpuconsole doctor --timeout 30)
step "doctor json, root" 45 "$OUT/doctor-root.json" "${AS_ROOT[@]}" "${DOCTOR[@]}" --json
step "doctor text, root" 45 "$OUT/doctor-root.txt" "${AS_ROOT[@]}" "${DOCTOR[@]}"
step "doctor json, $RUN_AS" 45 "$OUT/doctor-user.json" "${AS_USER[@]}" "${DOCTOR[@]}" --json
step "doctor text, $RUN_AS" 45 "$OUT/doctor-user.txt" "${AS_USER[@]}" "${DOCTOR[@]}"
step "doctor text, root, image's nvidia-ml-py" 45 "$OUT/doctor-root-image-pynvml.txt" \
    "${AS_ROOT[@]}" "PYTHONPATH=$SRC" "${DOCTOR[@]}"

# The guest agent on the real driver (this node is itself a VM with its GPU passed through):
# asked over a unix socket as a host's TenancySource asks it, then listening on vsock.
GUEST_ASK=$(cat <<'PYEOF'
import asyncio, sys, time
from gpuconsole.readings.tenancy import Guest
from gpuconsole.sources.tenancy.guest_agent import GuestRefused, ask_guest
sock = sys.argv[1]
async def main():
    end = time.monotonic() + 40
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(sock)
            writer.write(b"GET gpuconsole/1\n"); await writer.drain()
            raw = await reader.read(); writer.close()
            if raw:
                break
        except OSError:
            pass
        if time.monotonic() > end:
            print("no answer in 40 s"); return 1
        await asyncio.sleep(0.5)
    import json
    body = json.loads(raw)
    buses = [g["pci_bus_id"] for g in body["gpus"]]
    print("protocol", body["protocol"], "driver", body["driver_version"], "shared", body["shared"])
    from gpuconsole.readings.base import normal_bus_id
    host = [(f"0000:f{k}:00.0", normal_bus_id(b)) for k, b in enumerate(buses)]
    guest = Guest("probe", "running", tuple(h for h, _ in host), "libvirt", vsock_cid=3, addresses=tuple(host))
    async def connect(_g):
        return await asyncio.open_unix_connection(sock)
    try:
        gpus = await ask_guest(guest, connect, 10.0)
    except GuestRefused as exc:
        print("REFUSED:", exc); return 1
    for g in gpus:
        print(g.pci_bus_id, g.name, g.state, "util", g.util_gpu_pct, "mem", g.mem_used_bytes, "/", g.mem_total_bytes,
              "temp", g.temp_gpu_c, "power", g.power_w, "xids", g.xids, "processes", g.processes, "denied", g.denied)
    print(f"{len(raw)} bytes")
    return 0
sys.exit(asyncio.run(main()))
PYEOF
)
guest_probe() {  # WHO: start the agent on a unix socket, ask it, stop it; then vsock for 6 s
    local who=$1
    shift
    local sock=/tmp/gpuconsole-guest-$who.sock cfg=/tmp/gpuconsole-guest.toml
    : >"$cfg" && chmod a+r "$cfg"
    echo "== $who: agent --guest --unix $sock"
    "$@" "$PY" -m gpuconsole agent --guest --unix "$sock" -c "$cfg" 2>&1 &
    local pid=$!
    timeout 50 "$@" "$PY" -c "$GUEST_ASK" "$sock" 2>&1
    echo "ask exit $?"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "== $who: agent --guest on vsock (listens for 6 s; exit 124 = still listening)"
    timeout 6 "$@" "$PY" -m gpuconsole agent --guest -c "$cfg" 2>&1 | tail -3
    echo "vsock exit ${PIPESTATUS[0]}"
}
{
    guest_probe root "${AS_ROOT[@]}"
    guest_probe "$RUN_AS" "${AS_USER[@]}"
} >"$OUT/guest.txt" 2>&1
say "[guest agent] -> guest.txt"

TESTS=(tests/test_nvml_real.py tests/test_doctor.py tests/test_nvml_source.py
    tests/test_nvml_source_pynvml.py tests/test_fakenvml.py)
PYTEST=("$PY" -m pytest -q -rfEs -p no:cacheprovider "${TESTS[@]}")
step "pytest, root" 100 "$OUT/pytest-root.txt" "${AS_ROOT[@]}" "${PYTEST[@]}"
step "pytest, $RUN_AS" 100 "$OUT/pytest-user.txt" "${AS_USER[@]}" "${PYTEST[@]}"

rm -f "$ERR"
say "== done in $(($(date +%s) - START)) s"
