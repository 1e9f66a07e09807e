"""Random flags and values for every command through ``ddpdoctor.cli.main(argv)``, and the watch channel's
reader on random bytes.

Nothing here may start a rank: ``check``, ``bench`` and ``watch`` always get at least one value that must
be refused before anything starts (an absurd --nproc, --timeout or --master-port), and a guard turns
"would have self-launched" into a test failure instead of a launch. ``stacks`` (which attaches py-spy to
processes) only gets values that must be refused; ``unused``/``ckpt diff`` import only the suite's own
model file or names that cannot be imported; ``ras`` only talks to closed local ports.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.conftest import fuzz_settings
from tests.fuzz.harness import check_command, time_bound, workdir

MODEL = str(Path(__file__).with_name("fuzz_model.py")) + ":build"

NUMBERS = ["0", "-1", "1", "2", "nan", "inf", "-inf", "1e400", "99999999999999999999999", "9" * 400, "0x10",
           "1_000", " 3", "", "1.5", "65536", "70000", "-0", "1e-300", "100000", "2147483648"]
SIZES = ["1", "8", "1K", "64M", "1T", "0", "-1", "9" * 400, "1e3", "K", "1.5M", "999999999999999P", ""]
WORDS = ["auto", "gloo", "nccl", "mpi", "all", "all_reduce", "bogus", "", "-", "--", "\x00", "ü", "a" * 5000]

# The values that must stop check/bench/watch before anything starts.
REFUSED_LAUNCH = [["--nproc", "0"], ["--nproc", "-3"], ["--nproc", "99999999999999999999999"],
                  ["--nproc", "100000"], ["--timeout", "nan"], ["--timeout", "-1"], ["--timeout", "inf"],
                  ["--timeout", "1e400"], ["--master-port", "70000"], ["--master-port", "-1"],
                  ["--master-port", "99999999999999999999"], ["--backend", "bogus"]]
# Each refusal must hold whatever random flags come before it (its own values come last and win): -e 1T
# alone is not refused when -f inf stops the sweep at -b, nor -b 1 -e 1 with -d int8 (one whole element).
REFUSED_BENCH = [["-b", "9" * 400], ["-b", "1", "-e", "1", "-d", "float"], ["-b", "0"], ["-b", "1T", "-e", "1T"],
                 ["-n", "0"], ["-w", "-1"], ["-c", "-1"], ["-f", "nan", "-b", "1M", "-e", "2M"],
                 ["-d", "complex999"], ["--op", "bogus"]]

OPTIONS: dict[str, list[str]] = {
    "check": ["--nproc", "--backend", "--timeout", "--only", "--skip", "--master-port", "--checkpoint", "--model",
              "--batch", "--input-shape", "--min-busbw", "--json", "-v"],
    "bench": ["--op", "-b", "-e", "-f", "-n", "-w", "-d", "-c", "--pairs", "--min-busbw", "--json", "--plot",
              "--nproc", "--backend", "--timeout", "--master-port"],
    "watch": ["--nproc", "--master-port", "--hang-timeout", "--json", "--evidence", "--launch"],
    "ckpt inspect": ["--json", "--trust"],
    "ckpt strip": ["-o", "--prefix", "--key", "--json"],
    "ckpt diff": ["--model", "--key", "--trust", "--json"],
    "explain": ["--json"],
    "fr": ["--prefix", "--world-size", "--json"],
    "stacks merge": ["--all-threads", "--json"],
    "env": ["--json", "--no-torch"],
    "unused": ["--batch", "--input-shape", "--loss", "--steps", "--ddp-find-unused", "--json"],
    "ras": ["--addr", "--timeout", "--text", "--verbose", "--json"],
}
FLAGS = {"-v", "--pairs", "--trust", "--all-threads", "--no-torch", "--ddp-find-unused", "--text", "--verbose"}


@pytest.fixture(autouse=True)
def _never_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard, not a mock of behaviour: if a fuzzed argv got past validation, fail instead of starting
    ranks (the suite must never launch processes from its loop)."""
    import ddpdoctor.runtime.entry as entry
    import ddpdoctor.watch as watch

    def refuse(*_a: Any, **_k: Any) -> int:
        raise AssertionError("this argv would have started ranks: it should have been refused (exit 2) first")

    monkeypatch.setattr(entry, "run_here_or_self_launch", refuse)
    monkeypatch.setattr(watch, "supervise", refuse)
    monkeypatch.setattr(watch, "run_under_launcher", refuse)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                "PMI_RANK", "TORCHELASTIC_RUN_ID", "NCCL_RAS_ADDR"):
        monkeypatch.delenv(var, raising=False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def value_for(draw: st.DrawFn, command: str, option: str, folder: Path, inputs: dict[str, Path]) -> str:
    if option in ("--json", "--plot", "-o", "--evidence"):
        return draw(st.sampled_from([str(folder / "out.json"), "-", str(folder), "/dev/null",
                                     str(folder / "no" / "such" / "x.json"), str(folder / "out.png"), ""]))
    if option in ("--model", "--batch", "--loss"):
        return draw(st.sampled_from([MODEL, "no_such_module_xyz:build", "x", ":", "a:", ":b",
                                     str(folder / "missing.py") + ":f", MODEL.replace(":build", ":nothing")]))
    if option in ("--checkpoint",):
        return draw(st.sampled_from([str(inputs["ckpt"]), str(folder / "missing.pt"), str(folder)]))
    if option in ("-b", "-e"):
        return draw(st.sampled_from(SIZES))
    if option == "--addr":
        return draw(st.sampled_from([f"127.0.0.1:{_closed_port()}", "localhost:0", "x", ":", "[::1]:99999",
                                     "127.0.0.1:" + "9" * 30, "127.0.0.1:-1", ""]))
    if option == "--input-shape":
        return draw(st.sampled_from(["4,16", "0", "-1", "9" * 30 + ",2", ",", "a,b", "", "1," * 200]))
    if option in ("--prefix", "--key", "--only", "--skip", "--op", "-d", "--launch", "--backend"):
        return draw(st.one_of(st.sampled_from([*WORDS, "module.", "env,port", "a/b"]), st.text(max_size=10)))
    return draw(st.one_of(st.sampled_from(NUMBERS), st.text(max_size=6)))


@st.composite
def argv_for(draw: st.DrawFn, folder: Path, inputs: dict[str, Path]) -> list[str]:
    command = draw(st.sampled_from(sorted(OPTIONS)))
    argv = command.split()
    if command in ("ckpt inspect", "ckpt strip", "ckpt diff"):
        argv.append(draw(st.sampled_from([str(inputs["ckpt"]), str(inputs["ckpt"]), str(folder / "missing"),
                                          str(folder), "-", ""])))
    elif command in ("explain", "stacks merge", "fr"):
        argv += draw(st.lists(st.sampled_from([str(inputs["log"]), str(inputs["stacks"]), str(folder),
                                               str(folder / "missing"), "/dev/null"]), max_size=3))
    elif command == "watch":
        argv_tail = [draw(st.sampled_from([str(inputs["script"]), str(folder / "missing.py"), "-", ""]))]
    elif command == "unused":
        argv.append(draw(st.sampled_from([MODEL, "no_such_module_xyz:f", "x"])))
    for _ in range(draw(st.integers(0, 5))):
        option = draw(st.sampled_from(OPTIONS[command] + ["--no-such-flag", "-Z", "--help"]))
        argv.append(option)
        if option not in FLAGS and option not in ("--no-such-flag", "-Z", "--help"):
            argv.append(value_for(draw, command, option, folder, inputs))
    if command in ("check", "bench", "watch"):
        refusals = REFUSED_LAUNCH + (REFUSED_BENCH if command == "bench" else [])
        argv += draw(st.sampled_from(refusals))
    if command == "watch":
        argv += argv_tail
    if command == "unused" and "--steps" not in argv:
        argv += ["--steps", "1"]
    return argv


@given(data=st.data())
@fuzz_settings(weight=3.0)
def test_random_arguments_for_every_command(data: st.DataObject, seeds: Path, stacks_seed: Path,
                                            tmp_path: Path) -> None:
    with workdir(tmp_path) as folder:
        inputs = {"ckpt": folder / "model.pt", "log": folder / "train.log", "stacks": folder / "node.json",
                  "script": folder / "train.py"}
        inputs["ckpt"].write_bytes((seeds / "model.pt").read_bytes())
        inputs["log"].write_bytes(b"[rank1]: RuntimeError: NCCL error in: x, unhandled system error\n")
        inputs["stacks"].write_bytes(stacks_seed.read_bytes())
        inputs["script"].write_text("print('hello')\n")
        argv = data.draw(argv_for(folder, inputs), label="argv")
        out = folder / "out.json"
        check_command(argv, inputs=list(inputs.values()), folder=folder,
                      json_out=out if "--json" in argv and str(out) in argv else None)


# --- the watch channel: the supervisor's reader (Server.poll) on what a rank's connection may carry.
# A rank is the user's script with our recorder inside; a broken or hostile one must not take the
# supervisor down: poll returns events (or a disconnect), never raises, never blocks past its timeout.


@st.composite
def channel_bytes(draw: st.DrawFn) -> bytes:
    from ddpdoctor.watch.channel import encode

    good = [{"t": "hello", "rank": 0, "pid": 1}, {"t": "init", "bind": True, "rank": 1},
            {"t": "call", "op": "all_reduce", "seq": 1}, {"t": "hello", "rank": 3}]
    kind = draw(st.sampled_from(["mutated", "random", "nasty"]))
    if kind == "random":
        return draw(st.binary(max_size=2000))
    lines = [encode(m) for m in draw(st.lists(st.sampled_from(good), max_size=5))]
    if kind == "nasty":
        lines.append(draw(st.sampled_from([
            b'{"t":"hello","rank":"x"}\n', b'{"t":"hello"}\n', b'{"t":"hello","rank":1e400}\n',
            b'{"t":"hello","rank":' + b"9" * 5000 + b"}\n", b"[1,2]\n", b'"str"\n', b"{\n", b"\xff\xfe\n",
            b'{"t":"init","bind":true,"rank":' + b"9" * 50 + b"}\n", b"[" * 100_000 + b"\n", b"NaN\n",
            b'{"t":"hello","rank":-1}\n', b'{"t":"hello","rank":null}\n', b"x" * 2_000_000,
        ])))
    raw = b"".join(lines)
    if raw and draw(st.booleans()):
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
    return raw


@given(data=st.data())
@fuzz_settings(weight=2.0)
def test_watch_channel_reader(data: st.DataObject) -> None:
    from ddpdoctor.watch.channel import Server
    from tests.fuzz.harness import BUDGET

    raw = data.draw(channel_bytes(), label="bytes")
    close = True  # the rank's end closes after sending: the reader must report the disconnect
    server = Server()
    client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    BUDGET.inputs += 1
    try:
        with time_bound():
            client.sendall(raw)
            if close:
                client.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + 0.3  # enough for loopback; a rank that never said hello has no event
            while time.monotonic() < deadline:
                start = time.monotonic()
                events = server.poll(0.05)
                assert time.monotonic() - start < 5, "poll blocked past its timeout"
                assert isinstance(events, list)
                for rank, message in events:
                    assert isinstance(rank, int) and (message is None or isinstance(message, dict))
                if close and any(m is None for _, m in events):
                    break
    finally:
        client.close()
        server.close()
