"""Time `ddpdoctor stacks` on a real hung 8-rank gloo job against a loop of `py-spy dump` (one per rank).

Target (issue 5): `ddpdoctor stacks` within 2x of one `py-spy dump` plus Python start-up. Prints the
times and ratios; asserts nothing (timings on shared machines are noise for a test).

It also times the py-spy floor: all ranks' `py-spy dump` started at once straight from this process,
with no interpreter start-up, discovery or grouping. No tool that runs py-spy once per rank can beat it
(on a machine with fewer cores than ranks it is several dumps long), which is why `ddpdoctor stacks`
reads CPython 3.11-3.13 stacks from memory itself and keeps py-spy for --native, --all-threads and other
interpreters. `--all-threads` is timed too, as that py-spy path.

    python benchmarks/stacks_time.py [--ranks 8] [--repeat 3]    (or python -m benchmarks.stacks_time)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.common import cli_command, user_env
from ddpdoctor.stacks.engine import discover, dump_all, find_py_spy
from tests.stacks.test_stacks import hung_job
from tests.support import clean_env


def _best(cmd: list[str], repeat: int, ok: tuple[int, ...] = (0,)) -> float:
    """Best-of-N wall time of a command (best, not mean: other load only ever adds time)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=user_env(clean_env()), timeout=300)
        times.append(time.perf_counter() - start)
        if res.returncode not in ok:
            raise SystemExit(f"{cmd} failed ({res.returncode}): {res.stderr[-500:]}")
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    py_spy = find_py_spy()
    if py_spy is None:
        raise SystemExit("py-spy not installed")
    with tempfile.TemporaryDirectory() as tmp, hung_job(Path(tmp), args.ranks, "barrier", 1) as job:
        pids = [str(job.rank_pids[r]) for r in sorted(job.rank_pids)]
        agent = str(job.agents[0].pid)
        doctor_cmd = [*cli_command(), "stacks", "--job", agent]
        _best(doctor_cmd, 1, ok=(1,))  # untimed: caches ddpdoctor's bytecode, as an installed copy has it
        doctor = _best(doctor_cmd, args.repeat, ok=(1,))
        doctor_py_spy = _best([*doctor_cmd, "--all-threads"], args.repeat, ok=(1,))
        # The same command with nothing to dump (a pid that cannot exist): interpreter, CLI imports and
        # option parsing only, so the report shows how much of the total is start-up rather than dumping.
        cli_only = _best([*cli_command(), "stacks", "--pid", "4194304"], args.repeat, ok=(1,))
        one_dump = _best([py_spy, "dump", "--pid", pids[0]], args.repeat)
        startup = _best([sys.executable, "-c", "pass"], args.repeat)
        engines = []
        for _ in range(args.repeat):  # the engine alone, without interpreter and CLI start-up
            start = time.perf_counter()
            dumped = dump_all(discover(job=agent)).processes
            engines.append(time.perf_counter() - start)
            assert all(p.error is None for p in dumped), [p.error for p in dumped]
        engine = min(engines)
        floors = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            dumps = [subprocess.Popen([py_spy, "dump", "--json", "--pid", pid], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE) for pid in pids]
            for dump in dumps:
                dump.communicate(timeout=300)
            floors.append(time.perf_counter() - start)
        floor = min(floors)
        loops = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            for pid in pids:
                subprocess.run([py_spy, "dump", "--pid", pid], capture_output=True, check=True, timeout=300)
            loops.append(time.perf_counter() - start)
        loop = min(loops)
    print(f"ranks: {args.ranks}  (best of {args.repeat})")
    print(f"ddpdoctor stacks (discover + read {args.ranks} ranks + group): {doctor:.3f} s")
    print(f"  of which discovery + reading (in-process):           {engine:.3f} s")
    print(f"  of which CLI start-up (same command, nothing to dump): {cli_only:.3f} s")
    print(f"ddpdoctor stacks --all-threads ({args.ranks} parallel py-spy): {doctor_py_spy:.3f} s")
    print(f"loop of {args.ranks} x `py-spy dump`:                        {loop:.3f} s")
    print(f"one `py-spy dump`: {one_dump:.3f} s   python start-up: {startup:.3f} s")
    print(f"ratio ddpdoctor / py-spy loop:                      {doctor / loop:.2f}")
    print(f"ratio engine / py-spy loop:                         {engine / loop:.2f}")
    print(f"py-spy floor: {args.ranks} x `py-spy dump` started at once, nothing else: {floor:.3f} s "
          f"(on {os.cpu_count()} cores)")
    print(f"ratio ddpdoctor / (one py-spy dump + python start): {doctor / (one_dump + startup):.2f} (target <= 2)")
    print(f"ratio floor / (one py-spy dump + python start):     {floor / (one_dump + startup):.2f} "
          "(the best any tool running py-spy per rank could do here)")


if __name__ == "__main__":
    main()
