"""Benchmark `ddpdoctor ckpt strip` against `cp` and the plain PyTorch way (prints ratios; asserts nothing).

    python benchmarks/ckpt_strip.py                 # ~1 GiB checkpoint (the issue's setting)
    python benchmarks/ckpt_strip.py --size-mib 256  # quicker

Builds a DDP-style checkpoint (``{"epoch", "model": {"module.<layer>.weight": ...}}``), then times, each
in its own process with its peak RSS (``os.wait4``):

- ``cp`` of the file to a new file, and ``cp`` + ``sync FILE`` over an existing file (a durable replace);
- the plain PyTorch way: ``torch.load(weights_only=True)`` + ``consume_prefix_in_state_dict_if_present`` +
  ``torch.save`` (holds the whole checkpoint in memory);
- ``ddpdoctor ckpt strip`` to a new file (renames keys in ``data.pkl``, copies the rest in the kernel);
- ``strip --in-place`` of a copy of the checkpoint (restored, untimed, before each run): it replaces an
  existing file, so it fsyncs before the rename (see ``outputs.atomic_output``); its reference is
  ``cp + sync``. (``-o`` never replaces an existing checkpoint: the output policy, docs/ckpt.md.)

Every output is removed (untimed) before each run, so no method pays for freeing the previous run's blocks.

Targets from the issue: strip <= 1.5x the time of cp, strip peak RSS < 256 MB whatever the size. The
output is checked to load with ``torch.load(weights_only=True)`` and ``mmap=True``, equal tensor for tensor.
Building and checking run in child processes, so this process stays small: a child's peak RSS starts from
its parent's RSS at fork time on Linux, which would otherwise pollute the measurement.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.common import cli_command, user_env

SETTLE_S = 1.0
RUN_TIMEOUT_S = 600

PLAIN_WAY = """
import sys, torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
ckpt = torch.load(sys.argv[1], weights_only=True)
consume_prefix_in_state_dict_if_present(ckpt["model"], "module.")
torch.save(ckpt, sys.argv[2])
"""


def build(path: Path, size_mib: int, tensors: int) -> None:
    """A DDP-style checkpoint of about ``size_mib`` MiB in ``tensors`` float32 tensors."""
    import torch

    per = max(1, size_mib * (1 << 20) // 4 // tensors)
    gen = torch.Generator().manual_seed(0)
    model = OrderedDict((f"module.layers.{i}.weight", torch.rand(per, generator=gen)) for i in range(tensors))
    torch.save({"epoch": 7, "model": model, "config": {"lr": 3e-4}}, path)


def run(cmd: list[str], remove: Path | None = None, env: dict[str, str] | None = None,
        restore: tuple[Path, Path] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process, after removing ``remove`` and copying
    ``restore[0]`` to ``restore[1]`` (both untimed).

    Dirty pages of the previous method's 1 GiB output are flushed first and the disk gets a second to
    settle (untimed): otherwise each method also pays for writing, freeing and discarding the blocks of
    whatever ran before it, which on a VM disk makes even a page-cache copy vary 5x.
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


def verify(src: Path, out: Path) -> None:
    """The stripped file loads both ways and every tensor equals the original's."""
    import torch

    orig = torch.load(src, weights_only=True, mmap=True)
    for mmap in (False, True):
        new = torch.load(out, weights_only=True, mmap=mmap)
        assert new["epoch"] == 7 and new["config"] == {"lr": 3e-4}
        assert list(new["model"]) == [k[len("module."):] for k in orig["model"]]
        for key, value in new["model"].items():
            assert torch.equal(value, orig["model"]["module." + key]), key
        del new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024, help="checkpoint size (default 1024 MiB)")
    parser.add_argument("--tensors", type=int, default=64, help="number of tensors (default 64)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the median is reported")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed after)")
    parser.add_argument("--phase", choices=["build", "verify"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "build":
        build(Path(args.dir) / "ddp.pt", args.size_mib, args.tensors)
        return
    if args.phase == "verify":
        verify(Path(args.dir) / "ddp.pt", Path(args.dir) / "strip.pt")
        return

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ddpdoctor-perf-"))
    work.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, __file__, "--dir", str(work), "--size-mib", str(args.size_mib),
          "--tensors", str(args.tensors)]
    try:
        src = work / "ddp.pt"
        subprocess.run([*me, "--phase", "build"], check=True, timeout=RUN_TIMEOUT_S)
        size = src.stat().st_size
        print(f"checkpoint: {size / 2**20:.0f} MiB, {args.tensors} tensors, in {work}")
        strip = [*cli_command(), "ckpt", "strip", str(src), "-o"]
        replaced = work / "replaced.pt"
        # name: (command, output removed before each run, (source, copy) restored before each run)
        methods: dict[str, tuple[list[str], Path | None, tuple[Path, Path] | None]] = {
            "cp": (["cp", str(src), str(work / "cp.pt")], work / "cp.pt", None),
            # Over an existing file, and waits for the disk: the reference for "strip, replacing".
            "cp + sync": (["sh", "-c", f"cp {src} {work / 'cps.pt'} && sync {work / 'cps.pt'}"], None, None),
            "plain torch": ([sys.executable, "-c", PLAIN_WAY, str(src), str(work / "plain.pt")],
                            work / "plain.pt", None),
            "ddpdoctor strip": ([*strip, str(work / "strip.pt")], work / "strip.pt", None),
            "strip, replacing": ([*cli_command(), "ckpt", "strip", str(replaced), "--in-place"], None,
                                 (src, replaced)),
        }
        run(["cp", str(src), str(replaced)])  # also warms the page cache for every method
        run(["cp", str(src), str(work / "cps.pt")])
        env = user_env()
        run([*strip, str(work / "strip.pt")], env=env)  # untimed: caches ddpdoctor's bytecode
        times: dict[str, list[float]] = {name: [] for name in methods}
        rss: dict[str, list[int]] = {name: [] for name in methods}
        for _ in range(args.repeat):  # interleaved, so load from other processes hits every method alike
            for name, (cmd, output, restore) in methods.items():
                t, r = run(cmd, output, env, restore)
                times[name].append(t)
                rss[name].append(r)
        results = {name: (statistics.median(times[name]), max(rss[name])) for name in methods}
        subprocess.run([*me, "--phase", "verify"], check=True, timeout=RUN_TIMEOUT_S)
        base = results["cp"][0]
        print(f"{'method':<16} {'time_s':>8} {'x cp':>6} {'peak_rss_MB':>12}  every run (s)")
        for name, (t, r) in results.items():
            runs = " ".join(f"{x:.2f}" for x in times[name])
            print(f"{name:<16} {t:8.2f} {t / base:6.2f} {r / 1e6:12.0f}  {runs}")
        strip_t, strip_rss = results["ddpdoctor strip"]
        plain_t, plain_rss = results["plain torch"]
        synced_t = results["cp + sync"][0]
        print(f"strip/cp time ratio: {strip_t / base:.2f} (target <= 1.5); plain/cp: {plain_t / base:.2f}; "
              f"plain/strip: {plain_t / strip_t:.2f}")
        print(f"strip replacing (fsynced) / (cp + sync): {results['strip, replacing'][0] / synced_t:.2f}")
        print(f"strip peak RSS: {strip_rss / 1e6:.0f} MB (target < 256 MB); plain: {plain_rss / 1e6:.0f} MB")
        print("output verified: torch.load(weights_only=True) and mmap=True, tensors equal")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
