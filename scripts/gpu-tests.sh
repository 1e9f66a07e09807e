#!/usr/bin/env bash
# Run ddpdoctor's GPU suite (tests/gpu) on a machine with an NVIDIA GPU and a CUDA build of torch already
# installed, without network access, in under SUITE_LIMIT seconds (default 290: one 5-minute call), and print
# one summary line (also in $OUT/summary.txt). Exit 0 only when every step passed on a real GPU.
#
#   scripts/gpu-tests.sh [WHEEL_DIR] [-- PYTEST_ARGS...]
#
# The machines: one NVIDIA GPU (an H100 or an H200; nothing here may assume which), 16 cores. The steps run
# in two phases, because one GPU is shared by everything started on it:
#
#   1. shared (`shared_step`, `shared_pytest_step`): started together, in the background. Functional tests:
#      each asserts what is true however busy the GPU and the cores are (a verdict, a diagnosis, a file),
#      never a speed. Their jobs are mostly waits (a hang timeout, a watchdog timeout, a rank that never
#      joins), so side by side the phase takes about as long as its longest step instead of their sum.
#      A test that sees another process on the GPU may add a warning; none may fail for it (the tests say so).
#   2. exclusive (`step`, `pytest_step`): one after the other, once phase 1 is over, with the GPU to itself:
#      the steps whose figures are timings (bench against a plain loop, bandwidth against expectations,
#      watch's overhead). A kernel of another step would be in their numbers.
#
# Every step runs under `timeout` (never past what is left of SUITE_LIMIT; phase 1 leaves EXCLUSIVE_RESERVE
# seconds for phase 2), its output goes to $OUT/NAME.log, and its result (pass, fail with the exit code,
# timeout, skipped) to $OUT/steps.txt and the summary. A failing step does not stop the others. Steps that
# need the GPU itself rather than pytest (`gpu_step`) are skipped on a machine without one; pytest steps run
# there too and every test in them skips (their requires_cuda mark), so a dry run exercises the script.
# OUT defaults to a new folder under /tmp; PYTEST_ARGS after `--` go to every pytest step.
#
# The project is installed next to the preinstalled torch without touching it (pip --no-deps, no build
# isolation), unless this checkout is already what `import ddpdoctor` loads. Its other dependencies, and
# pytest-xdist (pyproject's addopts has `--dist loadscope`, an option only that plugin knows), come from
# WHEEL_DIR (default: ./wheels, or $GPU_TEST_WHEELS; git-ignored) where missing. Without pytest-xdist after
# that, pytest runs with `-o addopts=-ra` (the suite's addopts minus --dist). Fill the folder beforehand on a
# machine with network, for the GPU machine's Python (3.12) and platform:
#
#   pip download --no-deps --dest wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#       --platform any pytest-xdist execnet py-spy 'typer<0.29' annotated-doc click rich shellingham typing-extensions \
#       markdown-it-py mdurl pygments tabulate psutil nvidia-ml-py pytest iniconfig pluggy packaging numpy \
#       setuptools wheel
set -uo pipefail  # no -e: a failing step is recorded and the suite goes on

cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
WHEELS=${GPU_TEST_WHEELS:-wheels}
if [[ $# -gt 0 && $1 != "--" ]]; then WHEELS=$1; shift; fi
[[ ${1:-} == "--" ]] && shift
PYTEST_ARGS=("$@")
OUT=${OUT:-$(mktemp -d /tmp/ddpdoctor-gpu-tests.XXXXXX)}
mkdir -p "$OUT/status"
rm -f "$OUT"/status/* "$OUT/summary.txt"
: >"$OUT/steps.txt"
# pytest's own temporary folders: one per step (concurrent runs never share or clean each other's), outside
# $OUT (FR dumps and checkpoints are not results to bring back).
TMP_ROOT=$(mktemp -d /tmp/ddpdoctor-gpu-tmp.XXXXXX)
SUITE_LIMIT=${SUITE_LIMIT:-290}
EXCLUSIVE_RESERVE=${EXCLUSIVE_RESERVE:-140}
# At most this many phase-1 steps at a time (all of them on the 16-core GPU machine; a dry run on a small,
# busy machine wants fewer, e.g. MAX_SHARED=3 TIME_SCALE=4 SUITE_LIMIT=2400).
MAX_SHARED=${MAX_SHARED:-16}
# Every step's own limit times this (a dry run there: TIME_SCALE=4, SUITE_LIMIT=2400).
TIME_SCALE=${TIME_SCALE:-1}
SUITE_START=$SECONDS
STEPS=()        # every step's name, in the order declared
SHARED_PIDS=()  # phase 1's background steps
NO_GPU=""       # why the GPU steps cannot run here, when they cannot
PYTEST_OPTS=(-q -ra -p no:cacheprovider)

left_s() { echo $((SUITE_LIMIT - (SECONDS - SUITE_START))); }

# record NAME RESULT SECONDS NOTE: one line in steps.txt (appended whole) and the step's status file.
record() {
    printf '%-22s %-15s %4ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$OUT/steps.txt"
    echo "$2" >"$OUT/status/$1"
}

# run_step NAME TIMEOUT RESERVE CMD...: CMD under `timeout`, output in $OUT/NAME.log, the result recorded;
# at most what is left of SUITE_LIMIT minus RESERVE seconds.
run_step() {
    local name=$1 limit=$(($2 * TIME_SCALE)) reserve=$3 left rc start result
    shift 3
    left=$(($(left_s) - reserve))
    if ((left < 10)); then
        record "$name" skipped 0 "(no time left of ${SUITE_LIMIT} s)"
        return 0
    fi
    ((limit > left)) && limit=$left
    start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    if ((rc == 0)); then
        result=pass
    elif ((rc == 124 || rc == 137)); then
        result="timeout(${limit}s)"
    else
        result="fail(rc=$rc)"
    fi
    record "$name" "$result" $((SECONDS - start)) "$OUT/$name.log"
    if ((rc != 0)); then tail -n 25 "$OUT/$name.log" | sed "s/^/    $name | /"; fi
    return 0
}

# step NAME TIMEOUT CMD...: an exclusive step (phase 2), in the foreground.
step() {
    STEPS+=("$1")
    run_step "$1" "$2" 0 "${@:3}"
}

# gpu_step NAME TIMEOUT CMD...: an exclusive step that needs the GPU itself; skipped without one.
gpu_step() {
    if [[ -n $NO_GPU ]]; then
        STEPS+=("$1")
        record "$1" skipped-no-gpu 0 "($NO_GPU)"
        return 0
    fi
    step "$@"
}

# shared_step NAME TIMEOUT CMD...: a phase-1 step, started in the background.
shared_step() {
    STEPS+=("$1")
    while (($(jobs -rp | wc -l) >= MAX_SHARED)); do wait -n; done
    run_step "$1" "$2" "$EXCLUSIVE_RESERVE" "${@:3}" &
    SHARED_PIDS+=($!)
}

# pytest_step / shared_pytest_step NAME TIMEOUT PYTEST_ARGS...: one pytest run as a step (skip reasons shown).
pytest_step() {
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" "$PY" -m pytest "${PYTEST_OPTS[@]}" --basetemp "$TMP_ROOT/$name" "$@" \
        ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"}
}

shared_pytest_step() {
    local name=$1 limit=$2
    shift 2
    shared_step "$name" "$limit" "$PY" -m pytest "${PYTEST_OPTS[@]}" --basetemp "$TMP_ROOT/$name" "$@" \
        ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"}
}

# The end of phase 1: every background step has finished (each is bounded by its own timeout).
wait_shared() {
    local pid
    for pid in ${SHARED_PIDS[@]+"${SHARED_PIDS[@]}"}; do wait "$pid"; done
    SHARED_PIDS=()
}

SUMMARY_DONE=""
INTERRUPTED=""
summary() {
    [[ -n $SUMMARY_DONE ]] && return "$SUMMARY_RC"
    SUMMARY_DONE=1
    # Stopped by a signal: the background steps are not waited for (they show as never finished).
    [[ -z $INTERRUPTED ]] && wait_shared
    local name status passed=() failed=() timed_out=() skipped=() no_gpu=() missing=()
    for name in ${STEPS[@]+"${STEPS[@]}"}; do
        status=$(cat "$OUT/status/$name" 2>/dev/null || echo missing)
        case $status in
            pass) passed+=("$name") ;;
            timeout*) timed_out+=("$name") ;;
            skipped-no-gpu) no_gpu+=("$name") ;;
            skipped) skipped+=("$name") ;;
            missing) missing+=("$name") ;;
            *) failed+=("$name") ;;
        esac
    done
    local n=${#STEPS[@]} line
    if [[ -n $NO_GPU ]]; then
        line="gpu-tests: NO GPU here ($NO_GPU), nothing was tested on a GPU: ${#passed[@]}/$n steps passed"
        line+=" (pytest steps, every GPU test skipped), GPU-only steps skipped: ${no_gpu[*]:-none}"
    else
        line="gpu-tests: ${#passed[@]}/$n steps passed"
    fi
    ((${#failed[@]})) && line+=", failed: ${failed[*]}"
    ((${#timed_out[@]})) && line+=", timed out: ${timed_out[*]}"
    ((${#skipped[@]})) && line+=", skipped (no time left): ${skipped[*]}"
    ((${#missing[@]})) && line+=", never finished: ${missing[*]}"
    line+="; $((SECONDS - SUITE_START)) s of ${SUITE_LIMIT}; logs in $OUT"
    [[ ${KEEP_LOGS:-} == 1 ]] || line+=" (every step's in logs.tar.gz; the failed steps' beside it)"
    echo "$line" | tee "$OUT/summary.txt"
    SUMMARY_RC=1
    if [[ -z $NO_GPU ]] && ((${#passed[@]} == n)); then SUMMARY_RC=0; fi
    return "$SUMMARY_RC"
}

# A device machine hands back at most 8 files of $OUT (the first H100 run brought back 8 of 41: the logs to
# read were not among them). So every log goes into one archive, $OUT/logs.tar.gz, and beside it stay
# summary.txt, steps.txt and the logs of at most 5 steps that did not pass, to read first. KEEP_LOGS=1 leaves
# every file as it is (a local run).
pack_logs() {
    [[ ${KEEP_LOGS:-} == 1 ]] && return 0
    local name status keep=() entry base
    for name in ${STEPS[@]+"${STEPS[@]}"}; do
        status=$(cat "$OUT/status/$name" 2>/dev/null || echo missing)
        [[ $status == pass || $status == skipped* ]] && continue
        keep+=("$name.log")
        # What its tests left (watch's evidence folders, the ranks' logs), files under 1 MB: into the archive.
        [[ -d $TMP_ROOT/$name ]] && (cd "$TMP_ROOT" && find "$name" -type f -size -1024k -print0 |
            tar czf "$OUT/tmp-$name.tar.gz" --null -T - 2>/dev/null) || true
    done
    keep=("${keep[@]:0:5}" summary.txt steps.txt logs.tar.gz)
    tar czf "$TMP_ROOT/logs.tar.gz" -C "$OUT" . 2>/dev/null && mv "$TMP_ROOT/logs.tar.gz" "$OUT/logs.tar.gz" || return 0
    for entry in "$OUT"/* "$OUT"/.[!.]*; do
        [[ -e $entry ]] || continue
        base=${entry##*/}
        [[ " ${keep[*]} " == *" $base "* ]] || rm -rf -- "$entry"
    done
}

# Whatever ends the script (an error in it, a signal), the summary line is its last line.
on_exit() {
    local rc=$?
    trap - EXIT
    summary
    local code=$?
    pack_logs
    rm -rf "$TMP_ROOT"
    exit $((rc != 0 ? rc : code))
}
trap on_exit EXIT
trap 'INTERRUPTED=1; exit 143' TERM INT

versions() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=index,name,uuid,driver_version,pci.bus_id,memory.total --format=csv,noheader || true
    else
        echo "nvidia-smi: not found"
    fi
    # DataLoader workers pass batches and NCCL its proxy state through /dev/shm; a container's default (64 MB) is
    # shared by every phase-1 job (a DataLoader job once read as a crash there, cause unknown).
    df -h /dev/shm 2>/dev/null | awk 'NR == 2 {print "/dev/shm: " $2 " total, " $4 " free"}' || true
    "$PY" - <<'PY'
import os
import platform
import torch
print(f"python {platform.python_version()} ({platform.platform()}), {os.cpu_count()} cores")
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
    local missing=() mod
    for mod in typer:typer tabulate:tabulate psutil:psutil pynvml:nvidia-ml-py pytest:pytest numpy:numpy \
               xdist:pytest-xdist execnet:execnet; do
        "$PY" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod##*:}")
    done
    command -v py-spy >/dev/null || "$PY" -c "import os,sys; sys.exit(0 if os.path.exists(os.path.join(os.path.dirname(sys.executable),'py-spy')) else 1)" || missing+=(py-spy)
    if [[ ${#missing[@]} -gt 0 ]]; then
        echo "installing from $WHEELS: ${missing[*]}"
        if ! install_from_wheels "${missing[@]}"; then
            # pytest-xdist is optional (pytest then runs with -o addopts=-ra): a folder without it is not fatal.
            local needed=()
            for mod in "${missing[@]}"; do [[ $mod == pytest-xdist || $mod == execnet ]] || needed+=("$mod"); done
            if [[ ${#needed[@]} -gt 0 ]]; then install_from_wheels "${needed[@]}" || return 1; fi
        fi
    fi
    # Asked from / : `python -c` puts the working directory on sys.path, and a test's job that runs
    # `python -m ddpdoctor` from its own folder must find the installed package.
    local installed
    installed=$(cd / && "$PY" -c "import ddpdoctor, os; print(os.path.dirname(os.path.realpath(ddpdoctor.__file__)))" 2>/dev/null)
    if [[ -n $installed && $installed == "$(realpath ddpdoctor)" ]]; then
        echo "ddpdoctor is installed from this checkout already: not installed again"
    else
        # Building the editable install without network needs setuptools >= 64 and a bdist_wheel command
        # (setuptools >= 70.1 has one; older ones need the wheel package).
        "$PY" - <<'PY' || install_from_wheels setuptools wheel || return 1
import sys
import setuptools
major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
try:
    import wheel  # noqa: F401
    has_wheel = True
except ImportError:
    has_wheel = (major, minor) >= (70, 1)
sys.exit(0 if major >= 64 and has_wheel else 1)
PY
        "$PY" -m pip install --no-deps --no-build-isolation --no-index -e . >/dev/null \
            || "$PY" -m pip install --no-deps --no-index --find-links "$WHEELS" -e . || return 1
    fi
    "$PY" -c "import ddpdoctor, torch; print(f'ddpdoctor {ddpdoctor.__version__} installed next to torch {torch.__version__}')"
}

export PY WHEELS
# A step cut off by its timeout keeps what it printed (the first H100 run's watch-overhead.log was empty).
export PYTHONUNBUFFERED=1
export -f versions install install_from_wheels  # so that `timeout` can run them through bash

# --- phase 0: what this machine is, and what the suite needs -------------------------------------------
step versions 60 bash -c versions
cat "$OUT/versions.log"
case $(cat "$OUT/status/versions") in
    pass) ;;
    "fail(rc=1)") NO_GPU="torch.cuda.is_available() is False" ;;
    *) NO_GPU="the versions step ended $(cat "$OUT/status/versions"): see $OUT/versions.log" ;;
esac
if [[ -n $NO_GPU ]]; then
    echo "no usable CUDA GPU here: every GPU test skips, the GPU-only steps are skipped (a dry run)" >&2
    STEPS=()  # not a failure of the suite itself: the summary says what ran instead
fi
step install 120 bash -c install
if ! "$PY" -c "import xdist" 2>/dev/null; then
    # pyproject's addopts (-ra --dist loadscope) without its --dist: no plugin knows it here.
    PYTEST_OPTS+=(-o "addopts=-ra")
    echo "pytest-xdist is not installed: pytest runs with -o addopts=-ra" | tee -a "$OUT/install.log"
fi

# --- phase 1: functional steps, side by side (shared GPU, 16 cores) ------------------------------------
# check, explain, fr, env (issue 29): the README's `ddpdoctor check`, two ranks on one GPU,
# NCCL_SOCKET_IFNAME=ib0; explain on logs made here (a watchdog timeout and its Flight Recorder dump, an OOM,
# a device-side assert, a healthy NCCL_DEBUG=INFO run); fr on the timeout's dump; the GPU facts; env,
# stacks, ras.
# The README's `check` (PASS on a healthy GPU) runs in phase 2, with the GPU to itself: its pcie_bandwidth and
# memory_bandwidth measure the GPU, and beside the other steps' jobs they measure the sharing instead (the
# first H100 run: a copy at 25 % of the datasheet while eight test jobs used the GPU).
FAILING_CHECKS="test_two_ranks_on_one_gpu_are_one_fail_with_nccls_refusal_folded_under_it or test_nccl_socket_ifname_ib0_is_one_root_cause"
shared_pytest_step check-failing 200 tests/gpu/test_gpu_check.py -k "$FAILING_CHECKS"
shared_pytest_step check-binding 200 tests/gpu/test_gpu_binding.py
shared_pytest_step explain-fr 200 tests/gpu/test_gpu_explain_fr.py
shared_pytest_step fr-real-dump 100 "tests/gpu/test_gpu_watch_fr.py::test_fr_reads_a_real_nccl_flight_recorder_dump"
shared_pytest_step gpu-facts 100 tests/gpu/test_gpu_facts.py
shared_pytest_step env-stacks-ras 150 tests/gpu/test_gpu_env_stacks_ras.py
# bench on NCCL: the sweep's results verified, and CUDA-event timing at least a spin kernel's physical
# duration (a lower bound: a busier GPU only makes it longer).
shared_pytest_step bench 150 tests/gpu/test_gpu_bench.py

# explain (issue 26): real GPU logs: a watchdog timeout under torchrun and the SIGABRT it causes (the timeout
# is the root cause, the abort under it); an NCCL init waiting for a rank that never joins (a probable
# hang); single-process device-side assert and OOM (no DDP diagnosis, exit 0); a bad NCCL_SOCKET_IFNAME, no
# visible GPU, two ranks on one GPU. The jobs' own logs are kept under $OUT/explain-logs. Then the
# inventory's c10d messages (its .cpp part is from a 2.7.0a0 copy) looked up in this CUDA build's binaries
# (CPU only: it reads the .so files).
mkdir -p "$OUT/explain-logs"
export DDPDOCTOR_GPU_LOGS="$OUT/explain-logs"
shared_pytest_step explain-watchdog 200 "tests/gpu/test_gpu_explain_rank.py::test_watchdog_timeout_comes_before_its_sigabrt"
shared_pytest_step explain-rank 200 tests/gpu/test_gpu_explain_rank.py -k "not test_watchdog_timeout_comes_before_its_sigabrt"
shared_pytest_step explain-real 200 tests/gpu/test_gpu_explain.py
if [[ -z $NO_GPU ]]; then
    shared_step inventory-in-binaries 120 "$PY" scripts/check_inventory_in_binaries.py --out "$OUT/inventory_in_binaries.json"
else
    STEPS+=(inventory-in-binaries)
    record inventory-in-binaries skipped-no-gpu 0 "($NO_GPU: a CPU build has no NCCL messages to find)"
fi

# outputs (issue 27): the output policy with NCCL's own Flight Recorder dumps (a rank's write_dump under the
# umask and never over an older dump; fr never reading its own verdict, nor replacing it among the dumps).
shared_pytest_step outputs 120 tests/gpu/test_gpu_outputs.py

# watch (issue 25): hangs as they look on NCCL (a kernel that never ends, a DataLoader deadlock) and healthy
# NCCL DDP jobs that are not one; one step each, so that the hang timeouts run side by side.
shared_pytest_step watch-kernel-hang 150 "tests/gpu/test_watch_gpu.py::test_a_kernel_that_never_ends_is_a_hang_waiting_for_the_gpu_with_the_all_reduce_pending"
shared_pytest_step watch-dataloader 150 "tests/gpu/test_watch_gpu.py::test_a_deadlocked_dataloader_worker_on_a_gpu_job_is_named_with_its_stack"
shared_pytest_step watch-healthy 150 "tests/gpu/test_watch_gpu.py::test_a_healthy_nccl_ddp_job_is_not_a_hang" \
    "tests/gpu/test_gpu_watch_fr.py::test_watch_passes_a_healthy_nccl_ddp_job_through"
wait_shared
echo "phase 1 (shared) done at $((SECONDS - SUITE_START)) s"

# The timings need the GPU to themselves: a job a shared step left behind (a spin kernel of a test whose
# step timed out) is ended here, by its pid, if it is one of this suite's (its command line names this
# checkout's tests or the suite's temporary folder); anything else on the GPU is named in the log.
leftovers() {
    local pid cmd
    command -v nvidia-smi >/dev/null || return 0
    for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
        cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
        if [[ $cmd == *"$PWD/tests/"* || $cmd == *"$TMP_ROOT"* ]]; then
            echo "ending pid $pid, left on the GPU by a shared step: $cmd"
            kill -KILL "$pid" 2>/dev/null
        else
            echo "also on the GPU (not this suite's): pid $pid: $cmd"
        fi
    done
}
leftovers | tee "$OUT/leftovers.log"

# --- phase 2: timings, one at a time, the GPU to each alone ---------------------------------------------
# Issue 29 item 5: bench's row against a plain all_reduce loop on NCCL, interleaved in one process, several
# rounds per size; the median ratios (target >= 0.97x at every size) are in bench-vs-raw.log.
pytest_step check-readme 90 tests/gpu/test_gpu_check.py -k "not ($FAILING_CHECKS)"
pytest_step bench-vs-raw 100 tests/gpu/test_bench_vs_plain.py
pytest_step expect 120 tests/gpu/test_gpu_expect.py  # issue 34: host-device and memory bandwidth vs expectations
# What completion tracking costs on a small transformer's DDP step: watch --quiet against bare torchrun, with
# the bare/bare noise floor (target <= 1 %). One round of 300 steps: a run is mostly start-up, and two rounds
# of 100 did not end within 100 s on the first H100 run. Each run says its time as it ends.
gpu_step watch-overhead 120 "$PY" benchmarks/watch_overhead.py --gpu --rounds 1 --steps 300 --run-timeout 35
tail -n 6 "$OUT/watch-overhead.log" 2>/dev/null || true

summary
