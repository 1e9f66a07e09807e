"""Benchmark `ddpdoctor ckpt strip` of a shard set and of a DCP directory against the plain PyTorch way.

    python benchmarks/ckpt_sharded_dcp.py                      # 256 MiB and 1 GiB (the issue's setting)
    python benchmarks/ckpt_sharded_dcp.py --sizes 128 --repeat 1   # quick

For each size, builds (in a child process, in a temp dir removed afterwards) a DDP-style state_dict
(``module.layers.<i>.weight``) saved two ways:

- a Hugging Face style shard set: 4 ``model-0000N-of-00004.safetensors`` (``safetensors.torch.save_file``)
  + ``model.safetensors.index.json``;
- a ``torch.distributed.checkpoint`` directory (``dcp.save``, one process: ``.metadata`` + ``__0_0.distcp``).

Then times, each in its own process with its peak RSS (``os.wait4``), interleaved over ``--repeat`` rounds:

- shard set: ``cp -r`` (the floor); the plain way, per shard ``safetensors.torch.load_file`` + rename +
  ``save_file`` and a new index; ``ddpdoctor ckpt strip SET -o DIR``;
- DCP: ``cp -r``; the plain way, ``dcp_to_torch_save`` + ``torch.load`` + rename + ``torch.save`` (the
  usual recipe for one loadable file); ``ddpdoctor ckpt strip DIR -o out.pt`` and ``-o DIR2``.

Each strip alternates with its baselines within a round (the same page cache and load for both), and
every output is removed and the disk flushed before each run (untimed), as in ``benchmarks/ckpt_strip.py``.
Prints medians, ratios of medians against ``cp -r`` and the plain way, peak RSS per size (so "flat in the
size" is visible from two sizes), and where each strip's time goes: its ``--json`` ``phases_s`` (``open``,
``plan``, ``copy``: the whole write, kernel copies and rename included) and ``start-up``, the rest of the
wall time. Outputs are verified (untimed) to load and equal the input tensor for tensor. Asserts nothing
about speed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.ckpt_strip import RUN_TIMEOUT_S, Method
from benchmarks.common import cli_command, user_env

SHARDS = 4

PLAIN_SHARDS = """
import json, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir()
index = json.loads((src / "model.safetensors.index.json").read_text())
for name in sorted(set(index["weight_map"].values())):
    sd = load_file(src / name)
    save_file({k.removeprefix("module."): v for k, v in sd.items()}, str(out / name), metadata={"format": "pt"})
    del sd
index["weight_map"] = {k.removeprefix("module."): v for k, v in index["weight_map"].items()}
(out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
"""

PLAIN_DCP = """
import sys, warnings, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
warnings.simplefilter("ignore")
dcp_to_torch_save(sys.argv[1], sys.argv[2] + ".tmp")
ckpt = torch.load(sys.argv[2] + ".tmp", weights_only=True)
ckpt["model"] = {k.removeprefix("module."): v for k, v in ckpt["model"].items()}
torch.save(ckpt, sys.argv[2])
"""


def build(work: Path, size_mib: int, tensors: int) -> None:
    """The same state_dict as a shard set (``work/shards``) and a DCP directory (``work/dcp``)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    per = max(1, size_mib * (1 << 20) // 4 // tensors)
    gen = torch.Generator().manual_seed(0)
    model = {f"module.layers.{i}.weight": torch.rand(per, generator=gen) for i in range(tensors)}
    shards = work / "shards"
    shards.mkdir()
    keys = list(model)
    step = -(-len(keys) // SHARDS)
    weight_map = {}
    for n in range(SHARDS):
        name = f"model-{n + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = {k: model[k] for k in keys[n * step:(n + 1) * step]}
        save_file(part, str(shards / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(v.numel() * 4 for v in model.values())
    (shards / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: a single-process save
        dcp.save({"model": model, "epoch": 7}, checkpoint_id=work / "dcp")


def verify(work: Path) -> None:
    """Every output loads the way its users load it, equal tensor for tensor to the input."""
    import torch
    from safetensors.torch import load_file

    ref: dict[str, torch.Tensor] = {}
    for p in sorted((work / "shards").glob("*.safetensors")):
        ref.update({k.removeprefix("module."): v for k, v in load_file(p).items()})
    for out in ("strip_shards", "plain_shards"):
        got: dict[str, torch.Tensor] = {}
        for p in sorted((work / out).glob("*.safetensors")):
            got.update(load_file(p))
        assert list(got) == list(ref) and all(torch.equal(got[k], ref[k]) for k in ref), out
    for out in ("strip_dcp.pt", "plain_dcp.pt"):
        ckpt = torch.load(work / out, weights_only=True, mmap=True)
        assert ckpt["epoch"] == 7 and all(torch.equal(ckpt["model"][k], ref[k]) for k in ref), out


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    for extra in path.parent.glob(path.name + ".tmp"):
        extra.unlink()


def measure(size_mib: int, tensors: int, repeat: int) -> dict[str, Method]:
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-perf-"))
    me = [sys.executable, __file__, "--dir", str(work), "--sizes", str(size_mib), "--tensors", str(tensors)]
    try:
        subprocess.run([*me, "--phase", "build"], check=True, timeout=RUN_TIMEOUT_S)
        strip = [*cli_command(), "ckpt", "strip"]

        def strip_to(src: str, out: str, report: str) -> Method:
            return Method(f"{src}: strip -> {out.split('_', 1)[-1]}",
                          [*strip, str(work / src), "-o", str(work / out), "--json", str(work / report)],
                          remove=work / out, report=work / report)

        methods = [
            Method("shards: cp -r", ["cp", "-r", str(work / "shards"), str(work / "cp_shards")], work / "cp_shards"),
            strip_to("shards", "strip_shards", "s.json"),
            Method("shards: plain", [sys.executable, "-c", PLAIN_SHARDS, str(work / "shards"),
                                     str(work / "plain_shards")], work / "plain_shards"),
            Method("dcp: cp -r", ["cp", "-r", str(work / "dcp"), str(work / "cp_dcp")], work / "cp_dcp"),
            strip_to("dcp", "strip_dcp_dir", "d.json"),
            strip_to("dcp", "strip_dcp.pt", "p.json"),
            Method("dcp: plain", [sys.executable, "-c", PLAIN_DCP, str(work / "dcp"), str(work / "plain_dcp.pt")],
                   work / "plain_dcp.pt"),
        ]
        env = user_env()
        for method in methods[:2]:  # untimed: bytecode and page cache warm
            method.once(env)
            method.times.clear()
            method.rss.clear()
            method.phases.clear()
        for _ in range(repeat):
            for method in methods:
                if method.remove is not None:
                    _remove(method.remove)
                method.once(env)
        subprocess.run([*me, "--phase", "verify"], check=True, timeout=RUN_TIMEOUT_S)
        return {m.name: m for m in methods}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256,1024", help="checkpoint sizes in MiB (default 256,1024)")
    parser.add_argument("--tensors", type=int, default=64, help="number of tensors (default 64)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the median is reported")
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=["build", "verify"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.phase == "build":
        build(Path(args.dir), sizes[0], args.tensors)
        return
    if args.phase == "verify":
        verify(Path(args.dir))
        return
    results = {size: measure(size, args.tensors, args.repeat) for size in sizes}
    print(f"{'method':<26} " + " ".join(f"{f'{s} MiB: s':>11} {'RSS MB':>7}" for s in sizes))
    for name in results[sizes[0]]:
        print(f"{name:<26} " + " ".join(f"{results[s][name].median:11.2f} {max(results[s][name].rss) / 1e6:7.0f}"
                                         for s in sizes))
    for s in sizes:
        r = {name: m.median for name, m in results[s].items()}
        print(f"{s} MiB, ratios of medians: strip/cp -r: shards {r['shards: strip -> shards'] / r['shards: cp -r']:.2f}, "
              f"dcp -> dir {r['dcp: strip -> dcp_dir'] / r['dcp: cp -r']:.2f}, "
              f"dcp -> .pt {r['dcp: strip -> dcp.pt'] / r['dcp: cp -r']:.2f}; plain/strip: "
              f"shards {r['shards: plain'] / r['shards: strip -> shards']:.2f}x, "
              f"dcp -> .pt {r['dcp: plain'] / r['dcp: strip -> dcp.pt']:.2f}x")
        for m in results[s].values():
            if m.phases:
                print(f"  {m.name} where the time goes (medians, s): "
                      + ", ".join(f"{k} {v:.3f}" for k, v in m.phase_medians().items() if v >= 0.0005))
    print("outputs verified: every tensor equal to the input, loaded with safetensors / torch.load(weights_only=True)")


if __name__ == "__main__":
    main()
