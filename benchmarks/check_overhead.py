"""Cost of a full `ddpdoctor check` against a bare torchrun job that only initialises gloo and does one
all_reduce, at 2, 8 and 16 local ranks, interleaved in one run. Prints the ratio for each n (target:
<= 1.3x) and where ddpdoctor's time goes (from its JSON's ``elapsed_s`` and ``phases_s``).

    python benchmarks/check_overhead.py [--repeats 3] [--nproc 2 8 16]

Run on a shared machine, so each n alternates bare and ddpdoctor runs and reports medians: load from
others falls on both sides of the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.common import cli_command, user_env
from tests.support import clean_env, free_port, torchrun_cmd

BARE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1024)
dist.all_reduce(t)
dist.destroy_process_group()
"""
TARGET = 1.3


def timed(cmd: list[str], ok: tuple[int, ...] = (0,)) -> float:
    """Wall seconds of ``cmd`` outside any launcher's environment (under srun it would run as one rank)."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=user_env(clean_env()), timeout=600)
    elapsed = time.perf_counter() - start
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 8, 16])
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"# {os.cpu_count()} CPUs, load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "bare.py")
        report = os.path.join(tmp, "report.json")
        with open(script, "w") as handle:
            handle.write(BARE)
        # Exit 0 (pass/warn) is expected; on a crowded host the bandwidth check warns, which is still 0.
        timed([*cli_command(), "check", "--nproc", "2"])  # warms the bytecode cache (see common.user_env)
        for nproc in args.nproc:
            bare, doctor, inside = [], [], []
            phases: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                bare.append(timed([*torchrun_cmd(), "--nproc-per-node", str(nproc),
                                   "--master-port", str(free_port()), "--monitor-interval", "0.1", script]))
                doctor.append(timed([*cli_command(), "check", "--nproc", str(nproc), "--json", report]))
                data = json.loads(Path(report).read_text())
                inside.append(float(data["elapsed_s"]))
                for name, seconds in data.get("phases_s", {}).items():
                    phases.setdefault(name, []).append(float(seconds))
            b, d = statistics.median(bare), statistics.median(doctor)
            ratio = d / b
            print(f"{nproc} ranks: bare torchrun+gloo+all_reduce {b:.2f} s, ddpdoctor check {d:.2f} s, "
                  f"ratio {ratio:.2f} (target <= {TARGET}) {'ok' if ratio <= TARGET else 'OVER'}"
                  f"  [ratios {', '.join(f'{x / y:.2f}' for x, y in zip(doctor, bare, strict=True))}]")
            spent = ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in phases.items())
            print(f"    rank 0 inside the run {statistics.median(inside):.2f} s (the rest is start-up: python, "
                  f"torch import, launcher): {spent}")


if __name__ == "__main__":
    main()
