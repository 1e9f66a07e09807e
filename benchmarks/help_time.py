"""Time every command's `ddpdoctor <cmd> --help` against `python -c pass`.

Budget (issue 14): any command's `--help` under 0.3 s wall on the project's 2-core machine. `--help`
imports the command's module (and the root `ddpdoctor --help` all of them) and typer, but never torch.
Prints the times and ratios; asserts nothing.

    python benchmarks/help_time.py [--repeat 5]    (or python -m benchmarks.help_time)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.common import cli_command, wall_times
from ddpdoctor.cli import COMMANDS
from tests.support import clean_env

BUDGET_S = 0.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    env = clean_env()
    commands = [[], *([name] for name in COMMANDS), ["stacks", "merge"]]
    for words in commands:  # untimed: caches ddpdoctor's bytecode, as an install has it
        wall_times([*cli_command(), *words, "--help"], 1, env=env)
    times: dict[str, list[float]] = {" ".join(words): [] for words in commands}
    startup: list[float] = []
    for _ in range(args.repeat):  # interleaved, so that load from other work hits every series alike
        startup += wall_times([sys.executable, "-c", "pass"], 1, env=env)
        for words in commands:
            times[" ".join(words)] += wall_times([*cli_command(), *words, "--help"], 1, env=env)
    base = min(startup)
    print(f"best (median) of {args.repeat}; python -c pass: {base:.3f} s ({statistics.median(startup):.3f} s)")
    for name, series in times.items():
        label = f"ddpdoctor {name + ' ' if name else ''}--help"
        print(f"  {label:<32} {min(series):.3f} s ({statistics.median(series):.3f} s)  "
              f"{min(series) / base:5.1f}x python start-up")
    worst_name, worst = max(((n, min(s)) for n, s in times.items()), key=lambda item: item[1])
    verdict = "within" if worst < BUDGET_S else "OVER"
    print(f"budget: every --help < {BUDGET_S} s: slowest is `ddpdoctor {worst_name + ' ' if worst_name else ''}"
          f"--help` at {worst:.3f} s, {verdict}")


if __name__ == "__main__":
    main()
