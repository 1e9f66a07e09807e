"""`stacks merge`, `fr` and `explain` on generated documents: real ones (py-spy's stacks through
`ddpdoctor stacks --json`, PyTorch's Flight Recorder dumps, real crash logs from tests/data/real_logs)
mutated structure-aware, and pathological text. Every promise on every input (tests/fuzz/harness.py)."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import pickles
from tests.fuzz.conftest import fuzz_settings
from tests.fuzz.harness import check_command, strict_json, workdir

REAL_LOGS = Path(__file__).resolve().parent.parent / "data" / "real_logs"

# Raw JSON text json.dumps never writes (and that Python's json module still accepts, which is the danger).
NASTY = ["Infinity", "-Infinity", "NaN", "1e400", "-1e400", "9" * 5000, "1" + "0" * 40, "10000000",
         "1e7", "-1", "0", "2147483648", "18446744073709551617", "1.5", "-0.0", '"x"', '""', "null", "true",
         "[]", "{}", '"\\u0000"', '"\\ud800"', '"' + "a" * 100_000 + '"', "[" * 300 + "]" * 300,
         '{"a":' * 300 + "1" + "}" * 300, '[1,2,3]', '{"processes": []}']


def _paths(doc: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*here, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:20]):
            out += _paths(v, (*here, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return doc


def mutate_document(draw: st.DrawFn, doc: Any, *, nasty: bool = True) -> tuple[Any, dict[str, str]]:
    """Edits at random places of a real document: a value replaced (other type, huge list, nasty raw
    number), a key dropped, a list entry repeated. Nasty raw texts stand in as placeholder strings,
    substituted after json.dumps (returned as placeholder -> raw text)."""
    raw: dict[str, str] = {}
    for i in range(draw(st.integers(1, 5))):
        places = _paths(doc)
        path = draw(st.sampled_from(places))
        how = draw(st.sampled_from(["nasty", "type", "drop", "repeat", "int"] if nasty else ["type", "drop", "repeat", "int"]))
        if how == "nasty":
            token = f"@@NASTY{i}@@"
            raw[token] = draw(st.sampled_from(NASTY))
            doc = _set(doc, path, token)
        elif how == "type":
            doc = _set(doc, path, draw(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False,
                       allow_infinity=False), st.text(max_size=8), st.just([]), st.just({}))))
        elif how == "int":
            doc = _set(doc, path, draw(st.sampled_from([0, -1, 10**7, 2**31, 2**63, 10**30, 10**4000])))
        elif how == "drop" and path:
            parent = doc
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, list) and parent:
                parent.pop(path[-1])
        elif how == "repeat" and path:
            parent = doc
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, list) and parent:
                parent.extend([parent[path[-1]]] * draw(st.sampled_from([1, 10, 2000])))
    return doc, raw


def dumps_with(doc: Any, raw: dict[str, str]) -> bytes:
    import sys

    # 10**4000 as an integer literal of a document; the limit is the worker's, restored for the next tests
    # (a CLI test in the same worker relies on it to refuse a 5000-digit --pid).
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        text = json.dumps(doc)
    finally:
        sys.set_int_max_str_digits(limit)
    for token, value in raw.items():
        text = text.replace(json.dumps(token), value)
    return text.encode("utf-8", "surrogatepass")


# --- stacks merge


@given(data=st.data())
@fuzz_settings(weight=1.5)
def test_stacks_merge_files(data: st.DataObject, stacks_seed: Path, tmp_path: Path) -> None:
    doc = json.loads(stacks_seed.read_text(encoding="utf-8"))
    n = data.draw(st.integers(1, 3), label="files")
    with workdir(tmp_path) as folder:
        paths = []
        for i in range(n):
            mutated, raw = mutate_document(data.draw, json.loads(json.dumps(doc)))
            p = folder / f"node{i}.json"
            p.write_bytes(dumps_with(mutated, raw))
            paths.append(p)
        js = folder / "merged.json"
        res = check_command(["stacks", "merge", *map(str, paths), "--json",
                             data.draw(st.sampled_from([str(js), "-"]), label="json")],
                            inputs=paths, folder=folder, json_out=js)
        if res.code in (0, 1) and not js.exists():
            strict_json(res.out)


# --- fr: JSON dumps (`_dump_fr_trace_json`) and pickle dumps (`_dump_fr_trace`)


@given(data=st.data())
@fuzz_settings(weight=1.5)
def test_fr_dumps(data: st.DataObject, seeds: Path, tmp_path: Path) -> None:
    fmt = data.draw(st.sampled_from(["json", "pickle", "pickle-opcodes"]), label="format")
    real_json = json.loads((seeds / "fr_json" / "nccl_trace_rank_0.json").read_text(encoding="utf-8"))
    # The seed is our own fixture's dump (PyTorch wrote it moments ago in make_seeds.py): plain dicts,
    # lists and strings, safe to load here to mutate it.
    real_pickle = pickle.loads((seeds / "fr" / "nccl_trace_rank_0").read_bytes())
    ranks = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), label="ranks")
    with workdir(tmp_path) as work:
        folder = work / "dumps"
        folder.mkdir()
        paths = []
        for rank in ranks:
            if fmt == "json":
                doc, raw = mutate_document(data.draw, json.loads(json.dumps(real_json)))
                p = folder / f"nccl_trace_rank_{rank}.json"
                p.write_bytes(dumps_with(doc, raw))
            elif fmt == "pickle":
                doc, _ = mutate_document(data.draw, pickle.loads(pickle.dumps(real_pickle)), nasty=False)
                p = folder / f"nccl_trace_rank_{rank}"
                p.write_bytes(pickles.mutate(data.draw, pickle.dumps(doc, protocol=2)))
            else:
                asm = pickles.Asm()
                data.draw(pickles.value(asm, data.draw(st.integers(0, 4))))
                p = folder / f"nccl_trace_rank_{rank}"
                p.write_bytes(pickles.mutate(data.draw, asm.stop()))
            paths.append(p)
        args = [str(folder)] if data.draw(st.booleans(), label="as folder") else list(map(str, paths))
        extra = data.draw(st.sampled_from([[], ["--world-size", "4"], ["--world-size", "99999999999"],
                                           ["--prefix", "nccl_trace_rank_"]]), label="options")
        js = work / "fr.json"
        check_command(["fr", *args, *extra, "--json", str(js)], inputs=[*paths, folder], folder=work,
                      json_out=js)


# --- explain: logs


def _real_lines() -> list[bytes]:
    lines: list[bytes] = []
    for p in sorted(REAL_LOGS.glob("*.log")):
        lines += p.read_bytes().splitlines(keepends=True)
    return lines


REAL_LINES = _real_lines()
FRAGMENTS = [b"NCCL error ", b"[rank", b"]:", b"Traceback (most recent call last):\n", b"RuntimeError: ",
             b"ncclInternalError", b"Watchdog caught collective operation timeout", b"torch.distributed.elastic",
             b"\x00", b"\r", b"\xff\xfe", b"ChildFailedError", b"exitcode  : -9", b"CUDA error: ", b"9" * 50,
             "ü".encode(), b"\x1b[31m", b" " * 100]


@st.composite
def log_bytes(draw: st.DrawFn) -> bytes:
    """Real crash-log lines, shuffled and spliced with signature fragments, repeated into long lines, in
    other encodings, with NUL bytes, or plain random bytes."""
    kind = draw(st.sampled_from(["real", "real", "fragments", "long", "bytes", "encoded"]))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    if kind == "real":
        lines = [rnd.choice(REAL_LINES) for _ in range(draw(st.integers(1, 60)))]
        for _ in range(draw(st.integers(0, 5))):
            at = rnd.randrange(len(lines))
            lines[at] = lines[at][: rnd.randrange(len(lines[at]) + 1)] + rnd.choice(FRAGMENTS) + lines[at]
        return b"".join(lines)
    if kind == "fragments":
        return b"".join(rnd.choice(FRAGMENTS) for _ in range(draw(st.integers(1, 400))))
    if kind == "long":
        piece = rnd.choice(FRAGMENTS + REAL_LINES[:50]).rstrip(b"\n") or b"x"
        return piece * draw(st.sampled_from([10, 1000, 5000, 20_000])) + b"\n"
    if kind == "bytes":
        return draw(st.binary(max_size=4000))
    text = b"".join(rnd.choice(REAL_LINES) for _ in range(20)).decode("utf-8", "replace")
    return text.encode(draw(st.sampled_from(["utf-16", "utf-16-le", "latin-1", "utf-32", "cp1252"])), "replace")


@given(data=st.data())
@fuzz_settings(weight=2.0)
def test_explain_logs(data: st.DataObject, tmp_path: Path) -> None:
    logs = data.draw(st.lists(log_bytes(), min_size=1, max_size=3), label="logs")
    with workdir(tmp_path) as folder:
        paths = []
        for i, raw in enumerate(logs):
            p = folder / data.draw(st.sampled_from([f"rank{i}.log", f"{i}.log", "train.log", f"x{i}"]),
                                   label="name")
            p.write_bytes(raw)
            paths.append(p)
        js = folder / "explain.json"
        if data.draw(st.booleans(), label="stdin"):
            check_command(["explain", "--json", str(js)], inputs=paths, folder=folder, json_out=js,
                          stdin=logs[0])
        else:
            check_command(["explain", *map(str, sorted(set(paths))), "--json", str(js)], inputs=paths,
                          folder=folder, json_out=js)
