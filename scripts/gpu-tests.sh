#!/usr/bin/env bash
# Run ddpdoctor's GPU suite (tests/gpu) on a machine with an NVIDIA GPU and a CUDA build of torch already
# installed, without network access, in under SUITE_LIMIT seconds (default 300), and print one summary line.
#
#   scripts/gpu-tests.sh [WHEEL_DIR] [-- PYTEST_ARGS...]
#
# Every step is a call to `step NAME TIMEOUT CMD...` (or `pytest_step NAME TIMEOUT PYTEST_ARGS...`; a shell
# function as CMD runs as `bash -c FUNCTION` after `export -f FUNCTION`): it runs
# under `timeout` (never past what is left of SUITE_LIMIT), its output goes to $OUT/NAME.log, and its result
# (pass, fail with the exit code, timeout, or skipped when no time is left) is recorded for the summary and
# in $OUT/steps.txt. A failing step does not stop the others. Each engineer's scenarios are a section below.
# OUT defaults to a new folder under /tmp; PYTEST_ARGS after `--` go to every pytest step.
#
# The project is installed next to the preinstalled torch without touching it (pip --no-deps, no build
# isolation). Its other dependencies are installed from WHEEL_DIR (default: ./wheels, or $GPU_TEST_WHEELS)
# only where missing. Fill that folder beforehand on a machine with network, for the GPU machine's Python
# version and platform, e.g. for Python 3.12 on x86_64:
#
#   pip download --dest wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#       py-spy typer tabulate psutil nvidia-ml-py pytest numpy setuptools wheel
#
# (pip download also fetches their dependencies: click, rich, shellingham, typing-extensions, ...).
set -uo pipefail  # no -e: a failing step is recorded and the suite goes on

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${GPU_TEST_WHEELS:-wheels}
if [[ $# -gt 0 && $1 != "--" ]]; then WHEELS=$1; shift; fi
[[ ${1:-} == "--" ]] && shift
PYTEST_ARGS=("$@")
OUT=${OUT:-$(mktemp -d /tmp/ddpdoctor-gpu-tests.XXXXXX)}
mkdir -p "$OUT"
: >"$OUT/steps.txt"
SUITE_LIMIT=${SUITE_LIMIT:-300}
SUITE_START=$SECONDS
PASSED=() FAILED=() TIMED_OUT=() SKIPPED=()

# step NAME TIMEOUT CMD...: CMD under `timeout`, output in $OUT/NAME.log, the result recorded.
step() {
    local name=$1 limit=$2 left rc took result
    shift 2
    left=$((SUITE_LIMIT - (SECONDS - SUITE_START)))
    if ((left < 5)); then
        SKIPPED+=("$name")
        printf '%-24s %-14s %4ss  %s\n' "$name" "skipped" 0 "(no time left of ${SUITE_LIMIT} s)" | tee -a "$OUT/steps.txt"
        return 0
    fi
    ((limit > left)) && limit=$left
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    took=$((SECONDS - start))
    if ((rc == 0)); then
        result=pass; PASSED+=("$name")
    elif ((rc == 124 || rc == 137)); then
        result="timeout(${limit}s)"; TIMED_OUT+=("$name")
    else
        result="fail(rc=$rc)"; FAILED+=("$name")
    fi
    printf '%-24s %-14s %4ss  %s\n' "$name" "$result" "$took" "$OUT/$name.log" | tee -a "$OUT/steps.txt"
    if ((rc != 0)); then tail -n 25 "$OUT/$name.log" | sed 's/^/    | /'; fi
    return 0
}

# pytest_step NAME TIMEOUT PYTEST_ARGS...: one pytest run as a step (skip reasons shown: -ra).
pytest_step() {
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" "$PY" -m pytest -q -ra -p no:cacheprovider "$@" ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"}
}

summary() {
    local n=$((${#PASSED[@]} + ${#FAILED[@]} + ${#TIMED_OUT[@]} + ${#SKIPPED[@]}))
    local line="gpu-tests: ${#PASSED[@]}/$n steps passed"
    ((${#FAILED[@]})) && line+=", failed: ${FAILED[*]}"
    ((${#TIMED_OUT[@]})) && line+=", timed out: ${TIMED_OUT[*]}"
    ((${#SKIPPED[@]})) && line+=", skipped: ${SKIPPED[*]}"
    line+="; $((SECONDS - SUITE_START)) s of ${SUITE_LIMIT}; logs in $OUT"
    echo "$line" | tee "$OUT/summary.txt"
    ((${#FAILED[@]} + ${#TIMED_OUT[@]} + ${#SKIPPED[@]} == 0))
}

versions() {
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
raise SystemExit(0 if torch.cuda.is_available() else 1)
PY
}

install_from_wheels() {
    if [[ -d $WHEELS ]]; then
        "$PY" -m pip install --no-index --find-links "$WHEELS" "$@"
    else
        echo "missing: $* -- and no wheel folder $WHEELS (see the top of $0 for pip download)" >&2
        return 1
    fi
}

install() {
    local missing=()
    for mod in typer:typer tabulate:tabulate psutil:psutil pynvml:nvidia-ml-py pytest:pytest numpy:numpy; do
        "$PY" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod##*:}")
    done
    command -v py-spy >/dev/null || "$PY" -c "import os,sys; sys.exit(0 if os.path.exists(os.path.join(os.path.dirname(sys.executable),'py-spy')) else 1)" || missing+=(py-spy)
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
        install_from_wheels "${missing[@]}" || return 1
    fi
    "$PY" -m pip install --no-deps --no-build-isolation --no-index -e . >/dev/null \
        || "$PY" -m pip install --no-deps --no-index --find-links "$WHEELS" -e . || return 1
    "$PY" -c "import ddpdoctor, torch; print(f'ddpdoctor {ddpdoctor.__version__} installed next to torch {torch.__version__}')"
}

export PY WHEELS
export -f versions install install_from_wheels  # so that `timeout` can run them through bash
step versions 60 bash -c versions
cat "$OUT/versions.log"
if [[ ! " ${PASSED[*]} " == *" versions "* ]]; then
    echo "no usable CUDA GPU here: the GPU suite would only skip" >&2
    summary
    exit 1
fi
step install 180 bash -c install

# --- check, explain, fr, env (issue 29) -----------------------------------------------------------------
# The README's `ddpdoctor check`, two ranks on one GPU, NCCL_SOCKET_IFNAME=ib0; explain on logs made here
# (a watchdog timeout and its Flight Recorder dump, an OOM, a device-side assert, a healthy NCCL_DEBUG=INFO
# run); fr on the timeout's dump; the GPU facts; env, stacks, ras.
pytest_step check-scenarios 200 tests/gpu/test_gpu_check.py tests/gpu/test_gpu_binding.py
pytest_step explain-fr 200 tests/gpu/test_gpu_explain_fr.py
pytest_step fr-real-dump 100 "tests/gpu/test_gpu_watch_fr.py::test_fr_reads_a_real_nccl_flight_recorder_dump"
pytest_step gpu-facts 100 tests/gpu/test_gpu_facts.py
pytest_step env-stacks-ras 150 tests/gpu/test_gpu_env_stacks_ras.py

# --- bench ----------------------------------------------------------------------------------------------
# Issue 29 item 5: bench's row against a plain all_reduce loop on NCCL, interleaved in one process, several
# rounds per size; the median ratios (target >= 0.97x at every size) are in bench-vs-raw.log.
pytest_step bench 150 tests/gpu/test_gpu_bench.py tests/gpu/test_bench_vs_plain.py
pytest_step expect 120 tests/gpu/test_gpu_expect.py  # issue 34: host-device and memory bandwidth vs expectations
step bench-vs-raw 120 "$PY" benchmarks/bench_vs_raw.py --backend nccl --nproc 1 --rounds 7 --max-mib 256
tail -n 7 "$OUT/bench-vs-raw.log" 2>/dev/null || true

# --- explain (issue 26) ----------------------------------------------------------------------------------
# Real GPU logs: a watchdog timeout under torchrun and the SIGABRT it causes (the timeout is the root cause,
# the abort under it); an NCCL init waiting for a rank that never joins (a probable hang); single-process
# device-side assert and OOM (no DDP diagnosis, exit 0); a bad NCCL_SOCKET_IFNAME, no visible GPU, two ranks
# on one GPU. The jobs' own logs are kept under $OUT/explain-logs. Then the inventory's c10d messages (its
# .cpp part is from a 2.7.0a0 copy) looked up in this CUDA build's binaries.
mkdir -p "$OUT/explain-logs"
export DDPDOCTOR_GPU_LOGS="$OUT/explain-logs"
pytest_step explain-rank 240 tests/gpu/test_gpu_explain_rank.py
pytest_step explain-real 200 tests/gpu/test_gpu_explain.py
step inventory-in-binaries 120 "$PY" scripts/check_inventory_in_binaries.py --out "$OUT/inventory_in_binaries.json"

# --- outputs (issue 27) -------------------------------------------------------------------------------
# The output policy with NCCL's own Flight Recorder dumps (a rank's write_dump under the umask and never over
# an older dump; fr never reading its own verdict).
pytest_step outputs 120 tests/gpu/test_gpu_outputs.py

# --- watch (issue 25) -----------------------------------------------------------------------------------
# Hangs as they look on NCCL (a kernel that never ends, a DataLoader deadlock) and a healthy NCCL DDP job that
# is not one; then what completion tracking costs on a small transformer's DDP step, bare vs watched.
pytest_step watch 180 tests/gpu/test_watch_gpu.py \
    "tests/gpu/test_gpu_watch_fr.py::test_watch_passes_a_healthy_nccl_ddp_job_through"
step watch-overhead 60 "$PY" benchmarks/watch_overhead.py --gpu
tail -n 5 "$OUT/watch-overhead.log" 2>/dev/null || true

summary
