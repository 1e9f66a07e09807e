"""What the pickle reader's limits (issue 20) cost: reading a many-tensor checkpoint's ``data.pkl``.

    python benchmarks/ckpt_reader.py                   # 20,000 tensors, best of 5
    python benchmarks/ckpt_reader.py --tensors 2000 --repeat 3

Builds (in a temp dir) a DDP-style checkpoint with many small tensors, where the pickle, not the tensor
data, is the work, and times in this process, interleaved:

- ``torch.load(weights_only=True, mmap=True)``, the plain way (PyTorch's own weights-only unpickler);
- ``pickle.loads`` of ``data.pkl`` with torch's persistent ids stubbed: the C unpickler, the floor;
- ddpdoctor's bounded shadow reader (``ddpdoctor.ckpt.unpickler.loads``), which ``ckpt inspect``,
  ``strip`` and ``diff`` use: no code run, every object, depth, integer and shared reference counted.

Prints best-of-N times and the ratios. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import io
import pickle
import sys
import tempfile
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere


class _StubUnpickler(pickle.Unpickler):
    """The C unpickler with torch's storages stubbed: the least any reader of data.pkl can do."""

    def persistent_load(self, pid: Any) -> Any:
        return None

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return lambda *args: None
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        return lambda *args: None


def _best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import torch

    from ddpdoctor.ckpt import unpickler

    with tempfile.TemporaryDirectory(prefix="ddpdoctor-reader-") as tmp:
        path = Path(tmp) / "many.pt"
        state = OrderedDict((f"module.layers.{i}.weight", torch.zeros(2)) for i in range(args.tensors))
        torch.save({"model": state, "epoch": 3}, path)
        with zipfile.ZipFile(path) as zf:
            data_pkl = zf.read(next(n for n in zf.namelist() if n.endswith("/data.pkl")))
        print(f"checkpoint: {args.tensors:,} tensors, data.pkl {len(data_pkl) / 1e6:.1f} MB, best of {args.repeat}")

        runs = {
            "torch.load(weights_only, mmap)": lambda: torch.load(path, weights_only=True, mmap=True),
            "pickle (C, storages stubbed)": lambda: _StubUnpickler(io.BytesIO(data_pkl)).load(),
            "ddpdoctor bounded reader": lambda: unpickler.loads(data_pkl, trust=False),
        }
        best: dict[str, float] = {name: float("inf") for name in runs}
        for _ in range(args.repeat):  # interleaved, so a load spike hits every method alike
            for name, fn in runs.items():
                best[name] = min(best[name], _best(fn, 1))
        for name, seconds in best.items():
            print(f"  {name:32s} {seconds:7.3f} s")
        ours = best["ddpdoctor bounded reader"]
        print(f"ddpdoctor / torch.load: {ours / best['torch.load(weights_only, mmap)']:.2f}x; "
              f"ddpdoctor / C pickle floor: {ours / best['pickle (C, storages stubbed)']:.2f}x")


if __name__ == "__main__":
    main()
