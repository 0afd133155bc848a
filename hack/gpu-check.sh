#!/usr/bin/env bash
# The node side on a real GPU machine (`make gpu-check`; docs/node-agent.md "Checking a real GPU node").
#
# Runs, from the source tree (PYTHONPATH, no install of gpuyard itself):
#   1. nvidia-smi -L and `nvidia-smi topo -m`, and `gpuyard devices import-topo` of that capture;
#   2. `gpuyard devices discover` (NVML through the real nvidia-ml-py);
#   3. `gpuyard agent --once --print`;
#   4. a short health watch: the agent's loop (NVML events, or polling) for GPU_CHECK_WATCH_S seconds;
#   5. MPS: an MPS control daemon with its own pipe and log directories, then two client processes on
#      GPU 0 with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8G: one allocates 6 GiB (must succeed), one
#      12 GiB (must fail), through libcuda.so.1 (ctypes; no torch), both printed; then `quit`.
# Prints each command and its result; exits non-zero when a step fails; exits 0 with SKIP when the
# machine has no NVIDIA GPU (no nvidia-smi or no libnvidia-ml.so.1). Not part of `make test`/`bench`.
#
# Python: the first of $PYTHON, python3.13, python3.12, python3.11, python3 that is >= 3.11. When it
# lacks gpuyard's dependencies they are installed into a virtual environment under $GPU_CHECK_VENV
# (default: a folder in $TMPDIR) from pyproject.toml, unless GPU_CHECK_NO_INSTALL=1.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WATCH_S="${GPU_CHECK_WATCH_S:-8}"
MPS_LIMIT="${GPU_CHECK_MPS_LIMIT:-0=8G}"
OK_GIB="${GPU_CHECK_OK_GIB:-6}"
FAIL_GIB="${GPU_CHECK_FAIL_GIB:-12}"
FAILED=()
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpuyard-gpu-check.XXXXXX")"
MPS_UP=0

say() { printf '\n=== %s\n' "$*"; }
show() { printf '+ %s\n' "$*"; }
pass() { printf 'PASS: %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$2"; FAILED+=("$1"); }  # fail STEP MESSAGE

cleanup() {
  if [ "$MPS_UP" = 1 ]; then
    show "echo quit | nvidia-cuda-mps-control"
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$WORK/mps-pipe" nvidia-cuda-mps-control || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- a GPU here? ---------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "SKIP: no nvidia-smi on this machine; gpu-check needs an NVIDIA GPU and its driver"
  exit 0
fi
if ! { ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1'; } \
  && ! python3 -c 'import ctypes; ctypes.CDLL("libnvidia-ml.so.1")' >/dev/null 2>&1; then
  echo "SKIP: libnvidia-ml.so.1 (the NVIDIA driver's NVML) is not loadable here"
  exit 0
fi

# --- Python and gpuyard's dependencies ------------------------------------------------------------
PY=""
for candidate in ${PYTHON:-} python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 \
    && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PY="$(command -v "$candidate")"
    break
  fi
done
if [ -z "$PY" ]; then
  echo "FAIL: gpuyard needs Python >= 3.11; found $(python3 --version 2>&1 || echo none). Set PYTHON=/path/to/python3.11"
  exit 1
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
deps_ok() { "$1" -c 'import gpuyard.cli, pynvml' >/dev/null 2>&1; }
# what pyproject.toml asks for: the main dependencies and the agent extra (nvidia-ml-py, gRPC)
mapfile -t REQS < <("$PY" - "$ROOT/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
for req in project["dependencies"] + project["optional-dependencies"]["agent"]:
    print(req)
EOF
)
if ! deps_ok "$PY"; then
  if [ "${GPU_CHECK_NO_INSTALL:-0}" = 1 ]; then
    echo "FAIL: $PY lacks gpuyard's dependencies; install them with:"
    printf '  %s -m pip install' "$PY"; printf " '%s'" "${REQS[@]}"; echo
    exit 1
  fi
  VENV="${GPU_CHECK_VENV:-${TMPDIR:-/tmp}/gpuyard-gpu-check-venv}"
  say "installing gpuyard's dependencies into $VENV"
  if [ ! -x "$VENV/bin/python" ]; then
    show "$PY -m venv $VENV"
    "$PY" -m venv "$VENV" || { echo "FAIL: cannot create a virtual environment (apt install python3-venv?)"; exit 1; }
  fi
  show "$VENV/bin/python -m pip install ${REQS[*]}"
  "$VENV/bin/python" -m pip install --quiet "${REQS[@]}" || { echo "FAIL: pip install of gpuyard's dependencies failed"; exit 1; }
  PY="$VENV/bin/python"
  deps_ok "$PY" || { echo "FAIL: gpuyard still does not import with $PY"; exit 1; }
fi
GPUYARD=("$PY" -m gpuyard.cli)
NODE="$(hostname)"
unset GPUYARD_SERVER GPUYARD_TOKEN
echo "python: $PY ($("$PY" --version 2>&1)), nvidia-ml-py $("$PY" -c 'from importlib.metadata import version; print(version("nvidia-ml-py"))' 2>/dev/null || echo '?')"
echo "source: $ROOT"

# --- 1. what the driver says ------------------------------------------------------------------------
say "1. the driver's view"
show "nvidia-smi -L"
nvidia-smi -L
show "nvidia-smi --query-gpu=name,memory.total,driver_version,mig.mode.current --format=csv"
nvidia-smi --query-gpu=name,memory.total,driver_version,mig.mode.current --format=csv
show "nvidia-smi topo -m > topo.txt"
if nvidia-smi topo -m >"$WORK/topo.txt" 2>&1; then
  cat "$WORK/topo.txt"
  show "gpuyard devices import-topo topo.txt --name $NODE"
  if "${GPUYARD[@]}" devices import-topo "$WORK/topo.txt" --name "$NODE" >"$WORK/imported.yaml"; then
    pass "import-topo read the capture ($(grep -c '^  - index:' "$WORK/imported.yaml" || true) GPUs)"
  else
    fail "import-topo" "gpuyard devices import-topo refused this machine's nvidia-smi topo -m"
  fi
else
  cat "$WORK/topo.txt"
  fail "topo" "nvidia-smi topo -m failed"
fi

# --- 2. discovery ------------------------------------------------------------------------------------
say "2. discovery through NVML"
show "gpuyard devices discover --name $NODE"
if "${GPUYARD[@]}" devices discover --name "$NODE" >"$WORK/discovered.yaml" 2>"$WORK/discover.err"; then
  cat "$WORK/discovered.yaml"
  cat "$WORK/discover.err"
  if grep -q "modelKey: ''" "$WORK/discovered.yaml" || grep -q "cpus: ''" "$WORK/discovered.yaml"; then
    fail "discover" "a GPU without a model key or a NUMA node without CPUs"
  else
    pass "discovery"
  fi
else
  cat "$WORK/discovered.yaml" "$WORK/discover.err"
  fail "discover" "gpuyard devices discover failed"
fi

# --- 3. the agent, once ------------------------------------------------------------------------------
say "3. the agent, once"
show "gpuyard agent --once --print --node $NODE"
if "${GPUYARD[@]}" agent --once --print --node "$NODE" >"$WORK/agent.yaml" 2>"$WORK/agent.err"; then
  cat "$WORK/agent.yaml"
  cat "$WORK/agent.err"
  pass "agent --once --print"
else
  cat "$WORK/agent.yaml" "$WORK/agent.err"
  fail "agent" "gpuyard agent --once --print failed"
fi

# --- 4. a short health watch ---------------------------------------------------------------------------
say "4. health watch, ${WATCH_S}s (the agent's loop: NVML events, polling where events are not supported)"
show "$PY - (Agent(Inventory(nvml=pynvml)).run() for ${WATCH_S}s, 1s health interval)"
if "$PY" - "$NODE" "$WATCH_S" <<'EOF'
import asyncio
import sys

import pynvml

from gpuyard.devices.agent.inventory import Inventory
from gpuyard.devices.agent.running import Agent, AgentTimings, PrintSink


async def main(node: str, seconds: float) -> int:
    sink = PrintSink()
    timings = AgentTimings(health_interval_s=1.0, resync_s=3600.0)
    agent = Agent(Inventory(node=node, nvml=pynvml), sink, timings=timings)
    task = asyncio.create_task(agent.run())
    await asyncio.sleep(seconds)
    alive = not task.done()
    if task.done() and task.exception() is not None:
        print(f"agent stopped: {task.exception()!r}")
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    topology = agent.current
    if topology is None:
        print("no topology after the watch")
        return 1
    bad = [g.index for g in topology.spec.gpus if g.health != "Healthy"]
    print(f"watched {seconds:.0f}s: agent running throughout: {alive}; GPUs: {len(topology.spec.gpus)};"
          f" unhealthy: {bad or 'none'}; annotations: {dict(topology.metadata.annotations) or 'none'}")
    return 0 if alive else 1


sys.exit(asyncio.run(main(sys.argv[1], float(sys.argv[2]))))
EOF
then
  pass "health watch"
else
  fail "health" "the agent's health watch stopped or found no topology"
fi

# --- 5. MPS: two clients on GPU 0, one over its pinned memory limit ---------------------------------------
say "5. MPS memory limit on GPU 0 (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$MPS_LIMIT)"
cat >"$WORK/alloc.py" <<'EOF'
"""Allocate GiB on GPU 0 through the CUDA driver API (libcuda.so.1), hold, free; the exit code says
whether the outcome was the expected one."""
import ctypes
import os
import sys
import time

gib, expect, hold = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])
cuda = ctypes.CDLL("libcuda.so.1")


def name(rc: int) -> str:
    text = ctypes.c_char_p()
    cuda.cuGetErrorName(rc, ctypes.byref(text))
    return text.value.decode() if text.value else str(rc)


def call(fn: str, *args: object) -> int:
    rc = getattr(cuda, fn)(*args)
    if rc != 0 and fn != "cuMemAlloc_v2":
        print(f"client {os.getpid()}: {fn} -> {name(rc)}", flush=True)
        sys.exit(1)
    return rc


call("cuInit", 0)
dev = ctypes.c_int()
call("cuDeviceGet", ctypes.byref(dev), 0)
ctx = ctypes.c_void_p()
call("cuCtxCreate_v2", ctypes.byref(ctx), 0, dev)
ptr = ctypes.c_uint64()
size = int(gib * (1 << 30))
rc = call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
got = "succeeded" if rc == 0 else f"failed ({name(rc)})"
print(f"client {os.getpid()}: cuMemAlloc_v2 of {gib:g} GiB on GPU 0 {got}; expected to {'succeed' if expect == 'ok' else 'fail'}", flush=True)
if rc == 0:
    time.sleep(hold)
    cuda.cuMemFree_v2(ptr)
cuda.cuCtxDestroy_v2(ctx)
sys.exit(0 if (rc == 0) == (expect == "ok") else 2)
EOF
if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  fail "mps" "nvidia-cuda-mps-control is not on PATH (it ships with the NVIDIA driver's utilities)"
else
  export CUDA_MPS_PIPE_DIRECTORY="$WORK/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$WORK/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  show "CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_LOG_DIRECTORY nvidia-cuda-mps-control -d"
  if nvidia-cuda-mps-control -d; then
    MPS_UP=1
    sleep 1
    show "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$MPS_LIMIT $PY alloc.py $OK_GIB ok   (holds 6s)"
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="$MPS_LIMIT" "$PY" "$WORK/alloc.py" "$OK_GIB" ok 6 &
    small=$!
    sleep 2
    show "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$MPS_LIMIT $PY alloc.py $FAIL_GIB fail"
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="$MPS_LIMIT" "$PY" "$WORK/alloc.py" "$FAIL_GIB" fail 0 &
    big=$!
    sleep 1
    show "echo get_server_list | nvidia-cuda-mps-control"
    servers="$(echo get_server_list | nvidia-cuda-mps-control)"
    echo "$servers"
    for server in $servers; do
      show "echo get_client_list $server | nvidia-cuda-mps-control"
      echo "get_client_list $server" | nvidia-cuda-mps-control
    done
    show "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    wait "$small"; small_rc=$?
    wait "$big"; big_rc=$?
    [ "$small_rc" = 0 ] && pass "$OK_GIB GiB under the 8G limit succeeded" \
      || fail "mps-small" "$OK_GIB GiB under the limit did not succeed (exit $small_rc)"
    [ "$big_rc" = 0 ] && pass "$FAIL_GIB GiB over the 8G limit failed as it must" \
      || fail "mps-big" "$FAIL_GIB GiB over the limit did not fail as expected (exit $big_rc)"
    [ -n "$servers" ] || fail "mps-server" "no MPS server was running while the clients held memory"
    show "tail mps-log/control.log"
    tail -n 20 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null || true
  else
    fail "mps" "nvidia-cuda-mps-control -d did not start"
  fi
fi

say "summary"
if [ ${#FAILED[@]} -eq 0 ]; then
  echo "gpu-check: every step passed"
  exit 0
fi
echo "gpu-check: failed steps: ${FAILED[*]}"
exit 1
