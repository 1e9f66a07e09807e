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

# -- watch (issue 25): hangs as they look on NCCL, and what completion tracking costs ---------------------
# Within 4 minutes in total: each step under its own timeout, its log under $OUT/watch (default: ./gpu-out).
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/watch"
echo "== watch: tests/gpu/test_watch_gpu.py (kernel that never ends, DataLoader deadlock, healthy NCCL DDP)"
timeout 180 "$PY" -m pytest -q -ra tests/gpu/test_watch_gpu.py "$@" 2>&1 | tee "$OUT/watch/pytest.log" \
    || echo "watch GPU tests: FAILED or timed out (rc=${PIPESTATUS[0]}), see $OUT/watch/pytest.log"
echo "== watch: benchmarks/watch_overhead.py --gpu (small transformer DDP step, bare vs watched)"
timeout 60 "$PY" benchmarks/watch_overhead.py --gpu 2>&1 | tee "$OUT/watch/overhead.txt" \
    || echo "watch GPU benchmark: FAILED or timed out (rc=${PIPESTATUS[0]}), see $OUT/watch/overhead.txt"

echo "== tests/gpu"
# test_watch_gpu.py ran in the watch section above (minutes of GPU time: not twice).
exec "$PY" -m pytest -q -ra tests/gpu --ignore=tests/gpu/test_watch_gpu.py "$@"
