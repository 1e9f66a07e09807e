"""Benchmark `ddpdoctor ckpt strip` against copying the same bytes with the same durability (prints ratios).

    python benchmarks/ckpt_strip.py                       # 1 GiB and 4 GiB, 5 rounds (the issue's settings)
    python benchmarks/ckpt_strip.py --sizes-gib 8 --repeat 3
    python benchmarks/ckpt_strip.py --sizes-gib 0.25 --repeat 3 --plain   # quick, with the plain torch way

For each size, builds a DDP-style checkpoint with ``torch.save`` (``{"epoch", "model": {"module.<layer>.weight":
...}, "config"}``; the tensors are memory-mapped from a scratch file, so building 8 GiB needs no 8 GiB of
memory), then runs, each in its own process with its peak RSS (``os.wait4``), round after round:

- ``cp`` to a new file, then ``strip -o`` to a new file: the same bytes, neither waits for the disk;
- ``cp`` + ``sync FILE``: the new file on disk (the issue's reference for ``-o`` at 4 and 8 GiB);
- ``cp`` to a temporary + ``sync`` + ``mv`` over the checkpoint, then ``strip --in-place``: both replace
  the same freshly restored file (copied back from the original, untimed, before each of the two), both
  wait for the disk before the rename (the output policy fsyncs a replaced file, then its folder).

Before every run the previous outputs are removed, everything is flushed (``sync``) and the disk gets a
second to settle (untimed), so no run pays for the previous one's writeback or freed blocks, and the page
cache holds the input for every method alike (the first, untimed runs warm it). The tool and its
baseline alternate within each round, so load from other processes hits both alike; the medians and the
ratio of medians are printed, with every run. ``ddpdoctor`` runs as installed: the console script, with
its bytecode cached (the script unsets ``PYTHONDONTWRITEBYTECODE``; see ``benchmarks/common.py``).

Where strip's time goes: each strip run writes ``--json``, whose ``phases_s`` gives the seconds spent in
``open`` (the zip directory and the pickle), ``plan``, ``prepare`` (the temp file), ``pickle`` (the
renamed pickle written and checked), ``copy`` (the kernel copy), ``flush`` (fsync, replaced files only)
and ``rename`` (the rename, which frees the replaced file, and the folder's fsync); ``start-up`` is the
rest of the wall time (the interpreter, imports, the CLI, exit).

Targets (issue 36): ``strip -o`` <= 1.5x ``cp`` at 1 GiB; ``strip -o`` and ``--in-place`` <= 1.3x their
durable copies at 4 and 8 GiB; strip's peak RSS < 256 MB whatever the size. Every stripped output is
checked (untimed) to load with ``torch.load(weights_only=True, mmap=True)`` (and without ``mmap`` up to
2 GiB), equal tensor for tensor.
Building and checking run in child processes, so this process stays small: a child's peak RSS starts
from its parent's RSS at fork time on Linux, which would otherwise pollute the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.common import cli_command, user_env

SETTLE_S = 1.0
RUN_TIMEOUT_S = 600
PHASES = ("open", "plan", "prepare", "pickle", "copy", "flush", "rename")

PLAIN_WAY = """
import sys, torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
ckpt = torch.load(sys.argv[1], weights_only=True)
consume_prefix_in_state_dict_if_present(ckpt["model"], "module.")
torch.save(ckpt, sys.argv[2])
"""


def build(path: Path, size_mib: int, tensors: int) -> None:
    """A DDP-style checkpoint of about ``size_mib`` MiB in ``tensors`` float32 tensors, saved by torch.

    The tensors are memory-mapped from a scratch file (removed after), so the page cache, not this
    process's memory, holds them while ``torch.save`` writes them.
    """
    import numpy as np
    import torch

    per = max(1, size_mib * (1 << 20) // 4 // tensors)
    scratch = path.with_name(path.name + ".raw")
    block = np.random.default_rng(0).random(per, dtype=np.float32)
    with scratch.open("wb") as fh:
        for i in range(tensors):
            block[0] = i  # every tensor differs
            fh.write(block.tobytes())
    model = OrderedDict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # from_numpy of a read-only map: torch.save only reads it
        for i in range(tensors):
            mapped = np.memmap(scratch, dtype=np.float32, mode="r", offset=i * per * 4, shape=(per,))
            model[f"module.layers.{i}.weight"] = torch.from_numpy(mapped)
        torch.save({"epoch": 7, "model": model, "config": {"lr": 3e-4}}, path)
    scratch.unlink()


def run(cmd: list[str], remove: Path | None = None, env: dict[str, str] | None = None,
        restore: tuple[Path, Path] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process, after removing ``remove`` and copying
    ``restore[0]`` to ``restore[1]`` (both untimed).

    Dirty pages of the previous runs are flushed first and the disk gets a second to settle (untimed):
    otherwise each method also pays for writing, freeing and discarding the blocks of whatever ran
    before it, which on a VM disk makes even a page-cache copy vary 5x.
    """
    if remove is not None:
        remove.unlink(missing_ok=True)
    if restore is not None:
        shutil.copyfile(*restore)
    os.sync()
    time.sleep(SETTLE_S)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    while True:  # wait4 (for the child's peak RSS) has no timeout: poll it against a deadline
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - start > RUN_TIMEOUT_S:
            proc.kill()
            proc.wait(timeout=10)
            raise SystemExit(f"no result within {RUN_TIMEOUT_S} s: {' '.join(cmd)}")
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return elapsed, usage.ru_maxrss * 1024


def verify(src: Path, outs: list[Path]) -> None:
    """Each stripped file loads both ways and every tensor equals the original's."""
    import torch

    orig = torch.load(src, weights_only=True, mmap=True)
    # Loading into memory too, where it fits easily (an 8 GiB checkpoint is checked through mmap only).
    ways = (False, True) if src.stat().st_size <= 2 << 30 else (True,)
    for out in outs:
        for mmap in ways:
            new = torch.load(out, weights_only=True, mmap=mmap)
            assert new["epoch"] == 7 and new["config"] == {"lr": 3e-4}, out
            assert list(new["model"]) == [k[len("module."):] for k in orig["model"]], out
            for key, value in new["model"].items():
                assert torch.equal(value, orig["model"]["module." + key]), (out, key)
            del new


class Method:
    """One timed command, what is removed or restored before it, and its runs."""

    def __init__(self, name: str, cmd: list[str], remove: Path | None = None,
                 restore: tuple[Path, Path] | None = None, report: Path | None = None) -> None:
        self.name, self.cmd, self.remove, self.restore, self.report = name, cmd, remove, restore, report
        self.times: list[float] = []
        self.rss: list[int] = []
        self.phases: list[dict[str, float]] = []

    def once(self, env: dict[str, str]) -> None:
        if self.report is not None:
            self.report.unlink(missing_ok=True)
        t, r = run(self.cmd, self.remove, env, self.restore)
        self.times.append(t)
        self.rss.append(r)
        if self.report is not None:
            phases = json.loads(self.report.read_text())["phases_s"]
            phases["start-up"] = max(0.0, t - sum(phases.values()))
            self.phases.append(phases)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def phase_medians(self) -> dict[str, float]:
        names = ["start-up", *PHASES]
        return {n: statistics.median(p.get(n, 0.0) for p in self.phases) for n in names}


def measure(work: Path, size_mib: int, tensors: int, repeat: int, plain: bool) -> dict[str, Method]:
    """Build one checkpoint, time every method ``repeat`` rounds, verify, and return the methods."""
    me = [sys.executable, __file__, "--dir", str(work), "--tensors", str(tensors)]
    src = work / "ddp.pt"
    subprocess.run([*me, "--phase", "build", "--size-mib", str(size_mib)], check=True, timeout=RUN_TIMEOUT_S)
    strip = [*cli_command(), "ckpt", "strip"]
    replaced, tmp = work / "replaced.pt", work / "replaced.pt.tmp"
    out, out_sync, strip_out = work / "cp.pt", work / "cps.pt", work / "strip.pt"
    # Tool and baseline alternate; the in-place pair both start from the same restored file.
    methods = [
        Method("cp", ["cp", str(src), str(out)], remove=out),
        Method("strip -o", [*strip, str(src), "-o", str(strip_out), "--json", str(work / "o.json")],
               remove=strip_out, report=work / "o.json"),
        Method("cp + sync", ["sh", "-c", f"cp '{src}' '{out_sync}' && sync '{out_sync}'"], remove=out_sync),
        Method("cp tmp + sync + mv", ["sh", "-c", f"cp '{src}' '{tmp}' && sync '{tmp}' && mv '{tmp}' '{replaced}'"],
               restore=(src, replaced)),
        Method("strip --in-place", [*strip, str(replaced), "--in-place", "--json", str(work / "i.json")],
               restore=(src, replaced), report=work / "i.json"),
    ]
    if plain:
        plain_out = work / "plain.pt"
        methods.append(Method("plain torch", [sys.executable, "-c", PLAIN_WAY, str(src), str(plain_out)],
                              remove=plain_out))
    env = user_env()
    run(["cat", str(src)], env=env)  # untimed: the input in the page cache, as every later run finds it
    run([*strip, str(src), "-o", str(strip_out)], strip_out, env)  # untimed: caches ddpdoctor's bytecode
    for _ in range(repeat):
        for method in methods:
            method.once(env)
            if method.remove is not None and method.remove != strip_out:
                # Untimed (the next run starts with a sync): an 8 GiB run would otherwise hold 6 copies.
                method.remove.unlink()
    subprocess.run([*me, "--phase", "verify"], check=True, timeout=RUN_TIMEOUT_S)
    for path in (strip_out, replaced, src):
        path.unlink(missing_ok=True)
    return {m.name: m for m in methods}


def report(size_mib: int, methods: dict[str, Method]) -> None:
    print(f"\n{size_mib / 1024:g} GiB checkpoint, {len(methods['cp'].times)} rounds (medians; every run in s)")
    print(f"{'method':<20} {'time_s':>7} {'peak_rss_MB':>11}  every run")
    for m in methods.values():
        runs = " ".join(f"{x:.2f}" for x in m.times)
        print(f"{m.name:<20} {m.median:7.2f} {max(m.rss) / 1e6:11.0f}  {runs}")
    for name in ("strip -o", "strip --in-place"):
        phases = methods[name].phase_medians()
        print(f"{name} where the time goes (medians, s): "
              + ", ".join(f"{k} {v:.3f}" for k, v in phases.items() if k in ("start-up", "copy", "flush", "rename")
                          or v >= 0.0005))
    o, ip = methods["strip -o"].median, methods["strip --in-place"].median
    ratios = {"strip -o / cp": o / methods["cp"].median,
              "strip -o / (cp + sync)": o / methods["cp + sync"].median,
              "strip --in-place / (cp tmp + sync + mv)": ip / methods["cp tmp + sync + mv"].median}
    print("ratios of medians: " + "; ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    if size_mib <= 1024:
        print(f"  target at 1 GiB: strip -o / cp <= 1.5: {ratios['strip -o / cp']:.2f}")
    else:
        print(f"  target at 4-8 GiB: <= 1.3: -o {ratios['strip -o / (cp + sync)']:.2f}, "
              f"--in-place {ratios['strip --in-place / (cp tmp + sync + mv)']:.2f}")
    rss = max(max(methods[n].rss) for n in ("strip -o", "strip --in-place"))
    print(f"strip peak RSS: {rss / 1e6:.0f} MB (target < 256 MB)"
          + (f"; plain torch: {max(methods['plain torch'].rss) / 1e6:.0f} MB" if "plain torch" in methods else ""))
    print("outputs verified: torch.load(weights_only=True) and mmap=True, tensors equal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-gib", default="1,4", help="checkpoint sizes in GiB (default 1,4; 0.25 works)")
    parser.add_argument("--tensors", type=int, default=64, help="number of tensors (default 64)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; medians are reported (default 5)")
    parser.add_argument("--plain", action="store_true", help="also time torch.load + rename + torch.save")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed after)")
    parser.add_argument("--size-mib", type=int, default=1024, help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=["build", "verify"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "build":
        build(Path(args.dir) / "ddp.pt", args.size_mib, args.tensors)
        return
    if args.phase == "verify":
        verify(Path(args.dir) / "ddp.pt", [Path(args.dir) / "strip.pt", Path(args.dir) / "replaced.pt"])
        return
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ddpdoctor-perf-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder {work}; load average at start {os.getloadavg()[0]:.1f}")
    try:
        for size in (round(float(s) * 1024) for s in args.sizes_gib.split(",")):
            report(size, measure(work, size, args.tensors, args.repeat, args.plain))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
