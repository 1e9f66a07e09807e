"""Time `ddpdoctor stacks` on a real hung 8-rank gloo job against the plain way: one `py-spy dump` plus
Python start-up.

Budget (issue 14): `ddpdoctor stacks` on 8 hung ranks under 0.5 s wall on the project's 2-core machine.
`ddpdoctor stacks` is the typer CLI plus one `py-spy dump --json` per rank, all started at once; so the
script also times the parts: the same command with nothing to dump (interpreter, imports, typer), and
the py-spy floor (all ranks' `py-spy dump`s started at once straight from this process, nothing else),
which no tool running py-spy per rank can beat. Prints the times and ratios; asserts nothing (timings on
shared machines are noise for a test).

    python benchmarks/stacks_time.py [--ranks 8] [--repeat 5]    (or python -m benchmarks.stacks_time)
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

from benchmarks.common import cli_command, wall_times
from ddpdoctor.stacks.engine import find_py_spy
from tests.stacks.test_stacks import hung_job
from tests.support import clean_env

BUDGET_S = 0.5


def _floor(py_spy: str, pids: list[str]) -> float:
    start = time.perf_counter()
    dumps = [subprocess.Popen([py_spy, "dump", "--json", "--pid", pid], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for pid in pids]
    for dump in dumps:
        dump.communicate(timeout=300)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    py_spy = find_py_spy()
    if py_spy is None:
        raise SystemExit("py-spy not installed")
    env = clean_env()
    with tempfile.TemporaryDirectory() as tmp, hung_job(Path(tmp), args.ranks, "barrier", 1) as job:
        pids = [str(job.rank_pids[r]) for r in sorted(job.rank_pids)]
        doctor_cmd = [*cli_command(), "stacks", "--job", str(job.agents[0].pid)]
        wall_times(doctor_cmd, 1, ok=(1,), env=env)  # untimed: caches ddpdoctor's bytecode, as an install has it
        doctor: list[float] = []
        cli_only: list[float] = []
        one_dump: list[float] = []
        startup: list[float] = []
        floor: list[float] = []
        for _ in range(args.repeat):  # interleaved, so that load from other work hits every series alike
            doctor += wall_times(doctor_cmd, 1, ok=(1,), env=env)
            # The same command with nothing to dump (a pid no process can have): start-up and parsing only.
            cli_only += wall_times([*cli_command(), "stacks", "--pid", "4194304"], 1, ok=(1,), env=env)
            one_dump += wall_times([py_spy, "dump", "--json", "--pid", pids[0]], 1, env=env)
            startup += wall_times([sys.executable, "-c", "pass"], 1, env=env)
            floor.append(_floor(py_spy, pids))
    plain = min(one_dump) + min(startup)
    print(f"ranks: {args.ranks}, {os.cpu_count()} cores, best (median) of {args.repeat}")

    def row(label: str, times: list[float]) -> None:
        print(f"  {label:<58} {min(times):.3f} s  ({statistics.median(times):.3f} s)")

    row(f"ddpdoctor stacks ({args.ranks} ranks: discover, py-spy each, group)", doctor)
    row("  same command, nothing to dump (start-up + typer)", cli_only)
    row(f"py-spy floor: {args.ranks} x `py-spy dump` at once, from this process", floor)
    row("one `py-spy dump --json`", one_dump)
    row("python -c pass", startup)
    print(f"plain way (one py-spy dump + python start-up):                  {plain:.3f} s")
    print(f"ratio ddpdoctor stacks / plain way:        {min(doctor) / plain:.2f}")
    print(f"ratio ddpdoctor stacks / py-spy floor:     {min(doctor) / min(floor):.2f}")
    verdict = "within" if min(doctor) < BUDGET_S else "OVER"
    print(f"budget: ddpdoctor stacks on {args.ranks} ranks < {BUDGET_S} s: {min(doctor):.3f} s, {verdict}")


if __name__ == "__main__":
    main()
