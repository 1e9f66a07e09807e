"""`ddpdoctor fr` at scale: 512 ranks x 2,000 entries, seconds and peak memory, against PyTorch's analyser.

The dumps are generated (512 GPUs cannot exist here) in the layout PyTorch's NCCL Flight Recorder writes
(FlightRecorder.cpp, dump version 2.10: process_group, collective_seq_id, profiling_name 'nccl:...',
frames innermost first, pg_config ranks as "[0, 1, ...]"), pickled with strings shared as torch's pickler
memoises them. The same dumps go to both tools. Rank 300 runs a barrier where the others all_reduce at
the 1,990th collective; ranks 0-511 ring buffers hold the last 2,000 entries each.

Memory is measured at several world sizes: flat means the peak barely grows with the number of ranks
(one raw dump is held at a time; calls are interned).

    python benchmarks/fr_scale.py [--ranks 512] [--entries 2000]
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import user_env

TORCH = "/venv/lib/python3.11/site-packages/torch/"


def _frames(line: int, depth: int) -> list[dict[str, object]]:
    frames: list[dict[str, object]] = [
        {"name": "all_reduce", "filename": TORCH + "distributed/distributed_c10d.py", "line": 2500},
        {"name": "wrapper", "filename": TORCH + "distributed/c10d_logger.py", "line": 83},
        {"name": "train_step", "filename": "/job/train.py", "line": line}]
    frames += [{"name": f"layer{i}", "filename": "/job/model.py", "line": 100 + i} for i in range(depth)]
    return frames


def write_dumps(folder: Path, ranks: int, entries: int, odd_rank: int) -> int:
    """One pickle per rank, named like PyTorch's default (nccl_trace_rank_<N>); returns total bytes."""
    ranks_text = str(list(range(ranks)))
    pg = ("0", "default_pg")
    normal = _frames(41, 12)
    odd = _frames(42, 12)
    total = 0
    start_seq = 5000  # the buffer wrapped long ago: entries #5000-#6999
    for rank in range(ranks):
        rows = []
        for i in range(entries):
            seq = start_seq + i
            diverged = rank == odd_rank and i == entries - 10
            rows.append({"record_id": seq, "pg_id": 0, "process_group": pg, "collective_seq_id": seq,
                         "p2p_seq_id": 0, "op_id": seq, "is_p2p": False,
                         "profiling_name": "nccl:barrier" if diverged else "nccl:all_reduce",
                         "time_created_ns": 1_700_000_000_000_000_000 + seq, "input_sizes": [[1024, 1024]],
                         "input_dtypes": ["Float"], "output_sizes": [[1024, 1024]], "output_dtypes": ["Float"],
                         "state": "completed" if i < entries - 1 else "started", "timeout_ms": 600000,
                         "retired": i < entries - 1, "time_discovered_started_ns": None,
                         "time_discovered_completed_ns": None, "duration_ms": None,
                         "frames": odd if diverged else normal})
        doc = {"version": "2.10", "comm_lib_version": "2.21.5",
               "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks_text}},
               "pg_status": {"0": {"last_enqueued_collective": start_seq + entries - 1,
                                   "last_started_collective": start_seq + entries - 1,
                                   "last_completed_collective": start_seq + entries - 2}},
               "entries": rows}
        path = folder / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(doc, protocol=2))
        total += path.stat().st_size
    return total


# Runs a module as `python -m` would and prints its own peak RSS at exit: each tool's peak, measured alike.
# The peak is the larger of the process's own and its largest child's (fr's dump readers run in workers).
PROBE = ("import atexit, resource, runpy, sys; "
         "atexit.register(lambda: print('MAXRSS_KIB', max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
         "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss), file=sys.stderr)); "
         "module = sys.argv[1]; sys.argv = sys.argv[1:]; "
         "runpy.run_module(module, run_name='__main__', alter_sys=True)")


def measure(module: str, args: list[str], timeout: float = 600) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS MiB, exit code, the verdict line) of ``python -m module args``."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE, module, *args], capture_output=True, text=True,
                              timeout=timeout, env=user_env())
    except subprocess.TimeoutExpired:
        return timeout, float("nan"), 124, "timed out"
    wall = time.perf_counter() - start
    peak = next((int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KIB")), 0)
    lines = [line for line in (proc.stdout + proc.stderr).strip().splitlines() if not line.startswith("MAXRSS")]
    last = next((line for line in lines if line.startswith("Result:") or "Culprit" in line or "Error" in line),
                lines[-1] if lines else "")
    return wall, peak / 1024, proc.returncode, last[:200]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch's analyser")
    args = parser.parse_args()
    sizes = sorted({n for n in (64, 128, 256, args.ranks) if n <= args.ranks})
    root = Path(tempfile.mkdtemp(prefix="fr_scale_"))
    try:
        print(f"{'ranks':>6} {'dumps MB':>9} {'fr s':>7} {'fr peak MiB':>12}  verdict")
        for ranks in sizes:  # smallest first: the children's peak RSS only grows, so each row is its own peak
            folder = root / str(ranks)
            folder.mkdir()
            size = write_dumps(folder, ranks, args.entries, odd_rank=min(300, ranks - 1))
            measure("ddpdoctor", ["--help"])  # bytecode cached before timing (benchmarks/common.py)
            wall, peak, code, verdict = measure("ddpdoctor", ["fr", str(folder)])
            print(f"{ranks:>6} {size / 1e6:>9.1f} {wall:>7.2f} {peak:>12.0f}  exit {code}: {verdict}")
            if ranks != args.ranks:
                shutil.rmtree(folder)
        if not args.no_torch:
            folder = root / str(args.ranks)
            wall_t, peak_t, code_t, last_t = measure("torch.distributed.flight_recorder.fr_trace",
                                                     ["-p", "nccl_trace_rank_", str(folder)])
            wall_f, peak_f, _, _ = measure("ddpdoctor", ["fr", str(folder)])
            print(f"\nPyTorch's analyser (fr_trace) on the {args.ranks}-rank dumps: {wall_t:.2f} s, peak "
                  f"{peak_t:.0f} MiB, exit {code_t}: {last_t}")
            print(f"ddpdoctor fr on the same dumps: {wall_f:.2f} s, peak {peak_f:.0f} MiB; "
                  f"time ratio fr_trace / fr = {wall_t / wall_f:.2f}x, memory ratio {peak_t / peak_f:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
