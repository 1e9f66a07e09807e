"""Cost of a full `ddpdoctor check` against a bare torchrun job that only initialises gloo and does one
all_reduce, on 2 and 4 local ranks, interleaved in one run. Prints the ratio (target: <= 1.5x).

    python benchmarks/check_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from tests.support import clean_env, free_port, torchrun_cmd

BARE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1024)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def timed(cmd: list[str]) -> float:
    """Wall seconds of ``cmd`` outside any launcher's environment (under srun it would run as one rank)."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=600)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "bare.py")
        with open(script, "w") as handle:
            handle.write(BARE)
        for nproc in (2, 4):
            bare, doctor = [], []
            for _ in range(args.repeats):
                bare.append(timed([*torchrun_cmd(), "--nproc-per-node", str(nproc),
                                   "--master-port", str(free_port()), "--monitor-interval", "0.1", script]))
                doctor.append(timed([sys.executable, "-m", "ddpdoctor", "check", "--nproc", str(nproc)]))
            b, d = statistics.median(bare), statistics.median(doctor)
            print(f"{nproc} ranks: bare torchrun+gloo+all_reduce {b:.2f} s, ddpdoctor check {d:.2f} s, "
                  f"ratio {d / b:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
