"""How many of the inventory's c10d C++ messages an installed torch really contains, by reading its binaries.

The inventory's c10d ``.cpp`` messages come from a PyTorch 2.7.0a0 copy (docs/internals/explain-kb.md says
why); an installed torch's ``libtorch_*.so`` hold the message texts it was built with as string constants
(format strings, the literal pieces of ``c10::str``). A message is *present* when every literal piece of its
template (at least 8 characters) occurs in those strings: then the installed version still prints that text.
Messages of code a build leaves out (ProcessGroupNCCL in a CPU wheel, libuv-less paths, UCC/MPI) are absent
for that reason, so the figures are per file and the absent messages are listed for a reader to judge.

Usage: ``python scripts/check_inventory_in_binaries.py [LIBDIR] [--out REPORT.json]`` (default: the
``lib/`` of the torch this Python imports). Read-only; prints a summary, writes the details with ``--out``.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "tests" / "data" / "explain_inventory" / "torch-cpp.jsonl"
PRINTABLE = re.compile(rb"[\x20-\x7e\t]{6,}")
MIN_PIECE = 8


def binary_strings(lib: Path) -> str:
    """The printable runs of every ``libtorch*.so`` / ``libc10*.so`` in ``lib``, one per line."""
    out: list[str] = []
    for so in sorted(lib.glob("lib*.so*")):
        if not so.name.startswith(("libtorch", "libc10")):
            continue
        with so.open("rb") as fh:
            tail = b""
            while chunk := fh.read(64 << 20):
                data = tail + chunk
                runs = PRINTABLE.findall(data)
                # A run cut by the chunk boundary is completed with the next chunk.
                tail = runs.pop()[-4096:] if runs and data.endswith(runs[-1]) else b""
                out.extend(r.decode("ascii") for r in runs)
            if tail:
                out.append(tail.decode("ascii"))
    return "\n".join(out)


def pieces(template: str) -> list[str]:
    return [p.strip() for p in template.replace("\n", "{}").split("{}") if len(p.strip()) >= MIN_PIECE]


def main(argv: list[str]) -> int:
    out_path = None
    if "--out" in argv:
        i = argv.index("--out")
        out_path = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if argv:
        lib = Path(argv[0])
    else:
        import torch

        lib = Path(torch.__file__).parent / "lib"
    if not lib.is_dir():
        print(f"no such directory: {lib}", file=sys.stderr)
        return 2
    text = binary_strings(lib)
    per_file: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    absent: list[dict[str, object]] = []
    for line in INVENTORY.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        ps = pieces(entry["template"])
        if not entry["literal"] or not ps:
            continue
        present = all(p in text for p in ps)
        counts = per_file[entry["file"]]
        counts[0] += present
        counts[1] += 1
        if not present:
            absent.append({"file": entry["file"], "line": entry["line"], "version": entry["version"],
                           "template": entry["template"]})
    total = [sum(c[0] for c in per_file.values()), sum(c[1] for c in per_file.values())]
    print(f"{lib}: {total[0]} of {total[1]} c10d messages of the inventory are in these binaries")
    for name, (have, n) in sorted(per_file.items(), key=lambda kv: kv[1][1] - kv[1][0], reverse=True)[:25]:
        if have < n:
            print(f"  {name}: {have}/{n}")
    if out_path is not None:
        out_path.write_text(json.dumps({"lib": str(lib), "present": total[0], "messages": total[1],
                                        "absent": absent}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
