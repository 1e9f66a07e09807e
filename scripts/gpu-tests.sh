#!/usr/bin/env bash
# Run ddpdoctor's GPU suite (tests/gpu) on a machine with an NVIDIA GPU and a CUDA build of torch already
# installed, without network access.
#
#   scripts/gpu-tests.sh [WHEEL_DIR] [-- PYTEST_ARGS...]
#
# The project is installed next to the preinstalled torch without touching it (pip --no-deps, no build
# isolation). Its other dependencies are installed from WHEEL_DIR (default: ./wheels, or $GPU_TEST_WHEELS)
# only where missing. Fill that folder beforehand on a machine with network, for the GPU machine's Python
# version and platform, e.g. for Python 3.11 on x86_64:
#
#   pip download --dest wheels --only-binary=:all: --python-version 3.11 \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#       py-spy typer tabulate psutil nvidia-ml-py pytest numpy setuptools wheel
#
# (pip download also fetches their dependencies: click, rich, shellingham, typing-extensions, ...).
# It prints the device, driver, torch, CUDA and NCCL versions first, so the log says what it ran on.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${GPU_TEST_WHEELS:-wheels}
if [[ $# -gt 0 && $1 != "--" ]]; then WHEELS=$1; shift; fi
[[ ${1:-} == "--" ]] && shift

echo "== versions"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,uuid,driver_version,pci.bus_id,memory.total --format=csv,noheader || true
else
    echo "nvidia-smi: not found"
fi
"$PY" - <<'PY'
import platform
import torch
print(f"python {platform.python_version()} ({platform.platform()})")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print(f"devices: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
try:
    print("NCCL " + ".".join(map(str, torch.cuda.nccl.version())))
except Exception as exc:  # a CPU build has no NCCL
    print(f"NCCL: unavailable ({exc})")
PY

install_from_wheels() {
    if [[ -d $WHEELS ]]; then
        "$PY" -m pip install --no-index --find-links "$WHEELS" "$@"
    else
        echo "missing: $* -- and no wheel folder $WHEELS (see the top of $0 for pip download)" >&2
        return 1
    fi
}

echo "== dependencies"
missing=()
for mod in typer:typer tabulate:tabulate psutil:psutil pynvml:nvidia-ml-py pytest:pytest numpy:numpy; do
    "$PY" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod##*:}")
done
command -v py-spy >/dev/null || "$PY" -c "import shutil,sys,os; sys.exit(0 if os.path.exists(os.path.join(os.path.dirname(sys.executable),'py-spy')) else 1)" || missing+=(py-spy)
# Building the editable install without network needs setuptools >= 64 and a bdist_wheel command
# (setuptools >= 70.1 has one; older ones need the wheel package).
"$PY" - <<'PY' || missing+=(setuptools wheel)
import sys
import setuptools
major = int(setuptools.__version__.split(".")[0])
try:
    import wheel  # noqa: F401
    has_wheel = True
except ImportError:
    has_wheel = (major, int(setuptools.__version__.split(".")[1])) >= (70, 1)
sys.exit(0 if major >= 64 and has_wheel else 1)
PY
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "installing from $WHEELS: ${missing[*]}"
    install_from_wheels "${missing[@]}"
fi
"$PY" -m pip install --no-deps --no-build-isolation --no-index -e . >/dev/null \
    || "$PY" -m pip install --no-deps --no-index --find-links "$WHEELS" -e .
"$PY" -c "import ddpdoctor, torch; print(f'ddpdoctor {ddpdoctor.__version__} installed next to torch {torch.__version__}')"

# --- explain: root cause first, probable hangs, no false alarms (issue 26 part 3) ----------------------
# Real GPU logs: a watchdog timeout under torchrun and the SIGABRT it causes (the timeout must be the root
# cause, the abort under it); rank 0's NCCL communicator init waiting for a rank 1 that never joins (a
# probable hang); single-process device-side assert and OOM (no DDP diagnosis, exit 0). The step runs under
# `timeout`; its output and the jobs' logs are kept under $OUT.
OUT=${OUT:-$(mktemp -d /tmp/ddpdoctor-gpu-tests.XXXXXX)}
mkdir -p "$OUT/explain-rank"
echo "== explain (issue 26 part 3): output in $OUT/explain-rank.log, job logs in $OUT/explain-rank/"
DDPDOCTOR_GPU_LOGS="$OUT/explain-rank" timeout 480 "$PY" -m pytest -q -ra -p no:cacheprovider \
    tests/gpu/test_gpu_explain_rank.py "$@" >"$OUT/explain-rank.log" 2>&1 \
    && echo "explain-rank: passed" || echo "explain-rank: FAILED or timed out (rc=$?), see $OUT/explain-rank.log"
tail -n 5 "$OUT/explain-rank.log"

# -- explain on real NCCL failures (issue 26) ----------------------------------------------------------------
# Keeps what the installed torch + NCCL really print when a job fails in three ways, and explain's verdict on it,
# under $OUT/explain (the inventory's texts are NCCL 2.28.9's and torch 2.13's: these logs show the real ones).
# tests/gpu/test_gpu_explain.py asserts on the same jobs.
EXPLAIN_OUT=${OUT:-/tmp}/explain
mkdir -p "$EXPLAIN_OUT"
echo "== explain on real NCCL failures -> $EXPLAIN_OUT"
explain_job() {  # NAME ENV... -- CMD...: run the failing job, then explain its output
    local name=$1; shift
    local envs=()
    while [[ $1 != "--" ]]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout 240 "$@" >"$EXPLAIN_OUT/$name.log" 2>&1 || true
    timeout 120 "$PY" -m ddpdoctor explain --json "$EXPLAIN_OUT/$name.json" "$EXPLAIN_OUT/$name.log" \
        >"$EXPLAIN_OUT/$name.explain.txt" 2>&1 || true
    echo "$name: $(head -c 300 "$EXPLAIN_OUT/$name.explain.txt" | head -3 | tail -1)"
}
ONE_RANK=(RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29561)
explain_job no_interface "${ONE_RANK[@]}" CUDA_VISIBLE_DEVICES=0 NCCL_SOCKET_IFNAME=ddpdoctor_no_such_if \
    NCCL_DEBUG=WARN -- "$PY" tests/gpu/targets/nccl_init_fail.py
explain_job no_gpu "${ONE_RANK[@]}" CUDA_VISIBLE_DEVICES= -- "$PY" tests/gpu/targets/nccl_init_fail.py
explain_job duplicate_gpu CUDA_VISIBLE_DEVICES=0 NCCL_DEBUG=WARN DDPDOCTOR_TEST_DEVICE=0 -- \
    "$PY" -m torch.distributed.run --nproc-per-node=2 --master-port=29562 tests/gpu/targets/nccl_init_fail.py
# The inventory's c10d messages (ProcessGroupNCCL's from a 2.7.0a0 copy) against this CUDA build's binaries.
timeout 300 "$PY" scripts/check_inventory_in_binaries.py --out "$EXPLAIN_OUT/inventory_in_binaries.json" \
    >"$EXPLAIN_OUT/inventory_in_binaries.txt" 2>&1 || true
head -1 "$EXPLAIN_OUT/inventory_in_binaries.txt"

echo "== tests/gpu"
exec "$PY" -m pytest -q -ra tests/gpu --ignore=tests/gpu/test_gpu_explain_rank.py "$@"
