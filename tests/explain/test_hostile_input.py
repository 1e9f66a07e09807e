"""`ddpdoctor explain` on hostile and absurd input (issue 20): every promise holds, exit 0/1/2, never 3.

Inputs are produced for real: crafted bytes on disk, a real FIFO, a real device node, files in UTF-16 as
Windows PowerShell's ``>`` writes them. Speed is not asserted here (benchmarks/explain_throughput.py
measures the pathological lines against a plain one); what is asserted is the structural bound that makes
the scan linear: no regex is ever handed more than ``MAX_MATCH_CHARS`` characters, and the characters
handed to regexes in all stay proportional to the input.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor import explain
from ddpdoctor.explain import explain_text, load_kb, scanner
from ddpdoctor.explain import lines as explain_lines
from tests.support import clean_env, run_cli

CAP = scanner.MAX_MATCH_CHARS
OOM_LINE = b"[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"


# --- 1. linear time: a structural bound on what any regex sees -------------------------------------------

class _Recording:
    """A compiled regex that records how many characters each call is handed (instrumentation, not a mock:
    it calls the real pattern)."""

    def __init__(self, rx: re.Pattern[Any], log: list[int]) -> None:
        self._rx, self._log = rx, log
        self.pattern, self.groupindex = rx.pattern, rx.groupindex

    def _seen(self, string: Any, pos: int = 0, endpos: int = sys.maxsize) -> None:
        n = max(0, min(len(string), endpos) - pos)
        self._log.append(n)
        if n > CAP:  # fail at once: the unbounded call would take minutes on these lines
            raise AssertionError(f"{self.pattern[:60]!r} was handed {n:,} characters (cap {CAP:,})")

    def search(self, string: Any, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self._seen(string, pos, endpos)
        return self._rx.search(string, pos, endpos)

    def match(self, string: Any, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self._seen(string, pos, endpos)
        return self._rx.match(string, pos, endpos)

    def finditer(self, string: Any, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self._seen(string, pos, endpos)
        return self._rx.finditer(string, pos, endpos)

    def sub(self, repl: Any, string: Any, count: int = 0) -> Any:
        self._seen(string)
        return self._rx.sub(repl, string, count=count)

    def findall(self, string: Any, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self._seen(string, pos, endpos)
        return self._rx.findall(string, pos, endpos)


_META = set(".^$*+?{}[]()|\\")


def _literal_prefixes(pattern: str) -> list[str]:
    """The literal text each pattern starts with, and the literal runs inside it (where a repeat restarts)."""
    runs, cur, i = [], [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            cur.append(pattern[i + 1])
            i += 2
            continue
        if c in _META:
            if len(cur) >= 3:
                runs.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    if len(cur) >= 3:
        runs.append("".join(cur))
    return runs


def _pathological_lines(length: int) -> list[str]:
    """Long repeats of every signature's keywords and literal pieces, and of characters regexes loop on."""
    pieces = {" ", "1", ":", "[1, ", "a", "\t", "[rank1]: ", "> ", "E   ", "{", "("}
    for sig in load_kb():
        pieces.update(k + " " for k in sig.keywords)
        for rx in (*sig.patterns, *sig.extract):
            for run in _literal_prefixes(rx.pattern):
                pieces.update({run, run + " ", run + "1 ", run + "["})
    for value in vars(explain).values():
        if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
            pieces.update(_literal_prefixes(value.pattern))
    return [(p * (length // len(p) + 1))[:length] for p in sorted(pieces)]


def test_no_regex_is_handed_more_than_the_cap_on_any_pathological_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quadratic `NCCL error.*internal error` on 512 KB of `NCCL error ` took 22 s: with every line
    matched in windows of at most MAX_MATCH_CHARS, each regex call is bounded, so the scan is linear."""
    cap = CAP
    log: list[int] = []
    modules = [m for n, m in list(sys.modules.items()) if n.startswith("ddpdoctor.explain")]
    for module in modules:  # every module of the package: each binds the regexes it uses
        for name, value in list(vars(module).items()):
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                monkeypatch.setattr(module, name, _Recording(value, log))
    kb = [dataclasses.replace(s, patterns=tuple(_Recording(p, log) for p in s.patterns),  # type: ignore[misc]
                              extract=tuple(_Recording(p, log) for p in s.extract)) for s in load_kb()]
    lines = _pathological_lines(100_000)
    assert len(lines) > 200  # every signature contributes its own pieces
    # Each line also behind torchrun's prefix, followed by short lines that could be its wrapped remainder.
    data = "".join(f"{ln}\n[rank0]: {ln[:5000]}\n{ln[:150]}\n{ln[:90]}\n" for ln in lines).encode()
    result = explain.explain_streams([("hostile.log", __import__("io").BytesIO(data), None)], kb)
    assert log, "the instrumented regexes were used"
    assert max(log) <= cap, f"a regex was handed {max(log):,} characters (cap {cap:,})"
    # Linear: the characters handed to regexes stay proportional to the input, whatever its shape.
    assert sum(log) <= 200 * len(data), (sum(log), len(data))
    assert result.lines_scanned == 4 * len(lines)


def test_block_wide_regexes_have_no_repetition() -> None:
    """The regexes that run over whole 4 MB blocks (keyword prefilter, distributed-job sign) are literal
    alternations: their work per position is bounded by the longest keyword, whatever the text."""
    scanner = explain.Scanner()
    for rx in (scanner._prefilter.regex, explain_lines.DIST_CONTEXT, explain_lines._WEB_CHAR,
               explain_lines._HTML_ESCAPE):
        source = re.sub(rb"\\.", b"", rx.pattern)  # escaped characters are literals
        # groups, a one-byte lookahead and a refusal of literal sequences (prefilter.HEALTHY_AFTER_LEAD)
        source = source.replace(b"(?:", b"").replace(b"(?=", b"").replace(b"(?!", b"")
        assert not re.search(rb"[*+?{]", source), rx.pattern[:80]


def test_a_one_megabyte_line_of_nccl_error_finishes(tmp_path: Path) -> None:
    """The issue's reproduction: a 1 MB line of `NCCL error ` did not finish in 100 s (here behind a keyword,
    `Error: `, so the line is matched, in windows)."""
    f = tmp_path / "l.log"
    f.write_text("RuntimeError: " + "NCCL error " * 100_000 + "\n" + "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.17.1\n")
    proc = run_cli(["explain", "--json", "-", str(f)], timeout=90)
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    system = [d for d in data["diagnoses"] if d["id"] == "nccl-system-error"]
    assert system and system[0]["evidence"][0]["line"] == 2
    assert data["lines_windowed"] == 1  # the long line was matched on its head and tail only


def test_a_long_line_says_it_was_matched_on_its_ends_and_still_finds_errors_there(tmp_path: Path) -> None:
    """tqdm glues progress updates into one long line; the error at its end is still found, and the report
    says long lines were matched on their first and last few KB only."""
    bar = "".join(f"\r 50%|#####     | {i}/1000 [00:01<00:01, 5.00it/s]" for i in range(3000))
    f = tmp_path / "tqdm.log"
    f.write_text(bar + "\r[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    proc = run_cli(["explain", str(f)])
    assert proc.returncode == 1, proc.stderr
    assert "[cuda-oom]" in proc.stdout and "ranks: 3 " in proc.stdout
    assert "1 line longer than" in proc.stdout and "matched on its first and last" in proc.stdout


# --- 2. absurd numbers where a rank is read ----------------------------------------------------------------

DIGITS = "7" * 5000


@pytest.mark.parametrize("text", [
    f"[rank{DIGITS}]\n",
    f"[rank{DIGITS}]: RuntimeError: boom\n",
    f"[Rank {DIGITS}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE)\n",
    f"NCCL WARN rank {DIGITS} hit unhandled system error\n",
    f"[rank0]: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.\n"
    f"[rank0]: Parameter indices which did not receive grad for rank {DIGITS}: 1 2\n",
    f"torch.distributed\n-- Process {DIGITS} terminated with the following error:\nTraceback (most recent call last):\n"
    f"  File \"x.py\", line 1, in <module>\nRuntimeError: boom\n",
    f"  [0]:\n    time      : 2024\n    rank      : {DIGITS} (local_rank: 0)\n    exitcode  : -{DIGITS} (pid: 1)\n",
    f"torchrun failed (exitcode: -{DIGITS}) local_rank: {DIGITS} (pid: {DIGITS})\n",
    f"{DIGITS}: [rank0]: RuntimeError: boom\n",
], ids=["issue", "prefix", "pg-rank", "nccl-rank", "kb-rank-group", "mp-spawn", "torchrun-summary",
        "signal-number", "srun-label"])
def test_a_rank_of_5000_digits_is_text_not_a_crash(text: str) -> None:
    """CPython refuses int() of over 4,300 digits (ValueError): it was exit 3. No such rank is attributed."""
    result = explain_text(text)
    assert all(r < 10**7 for d in result.diagnoses for r in d.ranks)


def test_the_issue_rank_digits_line_exits_0_via_the_cli(tmp_path: Path) -> None:
    f = tmp_path / "r.log"
    f.write_text(f"[rank{DIGITS}]\n")
    proc = run_cli(["explain", str(f)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no known DDP/NCCL/torchrun error found" in proc.stdout


def test_file_name_with_a_huge_rank_is_no_rank() -> None:
    assert explain.rank_from_path("rank" + "9" * 200 + ".log") is None
    assert explain.rank_from_path("logs/attempt_0/" + "9" * 200 + "/stderr.log") is None
    assert explain.rank_from_path("train_rank_3.log") == 3


# --- 3. torchrun error files go through the untrusted-JSON reader -----------------------------------------

def test_an_error_file_with_non_json_numbers_is_not_taken_for_torchruns(tmp_path: Path) -> None:
    """torchrun writes error files with json.dump of strings and an integer timestamp; a file with NaN or a
    1e400 in it did not come from torchrun and is scanned as plain text (ddpdoctor.safejson's rules). No
    py_callstack here: plain text holding a traceback flattened with "\\n" is read as its lines (lines.unflatten),
    so only the error-file reader tells apart a message the JSON holds on one line."""
    for number in ("NaN", "1e400", "9" * 50):
        f = tmp_path / "error.json"
        f.write_text('{"message": {"message": "ValueError: bad lr", "extraInfo": {"timestamp": ' + number + '}}}')
        result = explain.explain_streams([(str(f), f.open("rb"), 0)])
        assert result.diagnoses == [], number
    f.write_text('{"message": {"message": "ValueError: bad lr", "extraInfo": {"timestamp": "1700000000"}}}')
    assert [d.id for d in explain.explain_streams([(str(f), f.open("rb"), 0)]).diagnoses] == ["python-exception"]


# --- 4. inputs that are not regular files ----------------------------------------------------------------

def _one_line_exit_2(proc: subprocess.CompletedProcess[str], words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    proc = run_cli(["explain", str(fifo)], timeout=60)  # it blocked in open() forever: no writer ever comes
    _one_line_exit_2(proc, "not a regular file")
    assert "| ddpdoctor explain" in proc.stderr  # says how to pipe it in instead
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # the input is untouched


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} missing")
    proc = run_cli(["explain", device], timeout=60)  # /dev/zero was read forever
    _one_line_exit_2(proc, "not a regular file")
    assert proc.stdout == "" and stat.S_ISCHR(os.stat(device).st_mode)  # no diagnosis; the device untouched


def test_stdin_from_a_pipe_still_works() -> None:
    proc = run_cli(["explain", "-"], input_text=OOM_LINE.decode())
    assert proc.returncode == 1 and "[cuda-oom]" in proc.stdout


# --- 5. bytes that are not a UTF-8 text log ----------------------------------------------------------------

@pytest.mark.parametrize("data,code", [
    pytest.param(b"", 2, id="empty"),  # a wrong path or a log that caught nothing, not a clean run
    pytest.param(bytes(range(256)) * 4000, 0, id="every-byte"),
    pytest.param(b"\xff\xfe\xc3\x28 invalid \xe2\x82 utf-8\n" + OOM_LINE + b"\xa0\xa1\n", 1, id="invalid-utf8"),
    pytest.param(b"\0" * 100_000 + b"\n" + OOM_LINE.replace(b" ", b" \0") + OOM_LINE, 1, id="nul-bytes"),
    pytest.param("step 1 ok\n".encode("utf-16-le"), 0, id="utf16-no-bom"),
])
def test_garbage_and_odd_encodings_exit_sensibly(tmp_path: Path, data: bytes, code: int) -> None:
    f = tmp_path / "odd.log"
    f.write_bytes(data)
    proc = run_cli(["explain", str(f)])
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-16-le"])
def test_a_utf16_log_with_a_bom_is_read_as_text(tmp_path: Path, codec: str) -> None:
    """Windows PowerShell 5's `python train.py > log.txt` writes UTF-16LE with a byte-order mark; its
    errors are found like any other log's (they were invisible: every other byte is a NUL)."""
    text = "step 1 ok\r\n" * 3000 + OOM_LINE.decode().replace("\n", "\r\n") + "done\r\n"
    bom = {"utf-16": b"", "utf-16-be": b"\xfe\xff", "utf-16-le": b"\xff\xfe"}[codec]
    f = tmp_path / "ps.log"
    f.write_bytes(bom + text.encode(codec))
    proc = run_cli(["explain", "--json", "-", str(f)])
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    (d,) = data["diagnoses"]
    assert (d["id"], d["ranks"], d["evidence"][0]["line"]) == ("cuda-oom", [2], 3001)
    assert data["lines_scanned"] == 3002


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_a_utf16_log_without_a_bom_is_read_as_text(tmp_path: Path, codec: str) -> None:
    """The same log with no byte-order mark (a tool that strips it, a copy that lost it) was "no error found",
    exit 0 (an explorer's find): read as UTF-16 when NULs fall on one side of every code unit and none on the
    other, which no binary file and no UTF-8 log shows."""
    text = "step 1 ok\r\n" * 300 + OOM_LINE.decode().replace("\n", "\r\n") + "done\r\n"
    f = tmp_path / "nobom.log"
    f.write_bytes(text.encode(codec))
    proc = run_cli(["explain", "--json", "-", str(f)])
    assert proc.returncode == 1, proc.stderr[-2000:]
    (d,) = json.loads(proc.stdout)["diagnoses"]
    assert (d["id"], d["ranks"], d["evidence"][0]["line"]) == ("cuda-oom", [2], 301)


def test_a_gzipped_log_is_read_decompressed_and_a_cut_one_is_one_line(tmp_path: Path) -> None:
    """`explain train.log.gz` scanned the compressed bytes: "no known error found", exit 0, for a log never read
    (an explorer's find). Decompressed as it streams (also from stdin); a gzip file cut short is bad input."""
    import gzip

    log = b"step 1 ok\n" * 1000 + OOM_LINE + b"done\n"
    f = tmp_path / "train.log.gz"
    f.write_bytes(gzip.compress(log))
    for args, stdin in ((["explain", "--json", "-", str(f)], None), (["explain", "--json", "-", "-"], f)):
        proc = subprocess.run([sys.executable, "-m", "ddpdoctor", *args], capture_output=True, timeout=60,
                              stdin=stdin.open("rb") if stdin else subprocess.DEVNULL, env=clean_env())
        assert proc.returncode == 1, proc.stderr[-2000:]
        data = json.loads(proc.stdout)
        assert [(d["id"], d["ranks"]) for d in data["diagnoses"]] == [("cuda-oom", [2])]
        assert data["lines_scanned"] == 1002
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(f.read_bytes()[:60])
    proc = run_cli(["explain", str(cut)])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"ddpdoctor: error: {cut}: a gzip file that cannot be read to its end")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak memory read from Linux /proc")
def test_a_50_mb_single_line_streams_in_flat_memory(tmp_path: Path) -> None:
    """A 50 MB line without a newline (a core dump, a minified JSON blob): read in fixed-size pieces, never
    as one string; an error glued to its start is still found. Peak memory is measured, not timed."""
    f = tmp_path / "big.log"
    with f.open("wb") as out:
        out.write(OOM_LINE.rstrip(b"\n") + b" ")
        block = b"x0:[ " * (1 << 18)
        for _ in range(50 * (1 << 20) // len(block)):
            out.write(block)
    code = textwrap.dedent(f"""
        from ddpdoctor.cli import main
        rc = main(["explain", {str(f)!r}])
        # VmHWM, not ru_maxrss: the latter keeps the forking parent's (pytest's) peak across exec.
        hwm = next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")).split()[1]
        print("RESULT", rc, hwm)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=clean_env())
    result = proc.stdout.strip().splitlines()[-1].split()
    assert result[:2] == ["RESULT", "1"], proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[cuda-oom]" in proc.stdout
    assert int(result[2]) < 150 * 1024, f"peak RSS {int(result[2]) // 1024} MB for a 50 MB line"


def test_the_fast_distributed_sign_agrees_with_the_regex() -> None:
    """`_has_dist_sign` (literal finds, the regex only around them; issue 20's 22 MB/s on a log without any
    sign) must decide exactly as `_DIST_CONTEXT` over the whole block: a missed sign turns a rank's CUDA OOM
    into silence, a false one a plain script's exception into a DDP diagnosis."""
    signs = ["torch/distributed/run.py", "torchrun --nproc", "[rank3]: x", "[RANK 2] y", "ProcessGroupNCCL",
             "NCCL INFO", "Rank 7 z", "rank 0 w", "local_rank=1", "LOCAL_RANK", "DistributedDataParallel(",
             "init_process_group(", "torch/multiprocessing/spawn.py", "WORLD_SIZE=8", "deepspeed.launcher",
             "accelerate launch", "accelerate/commands/launch.py"]
    # Issue 26: the standard library's multiprocessing/spawn.py (DataLoader workers on Windows and macOS) and an
    # accelerate frame (the HF Trainer on one GPU) are in single-process runs too: no sign of a distributed job.
    near_misses = ["torch/nn/modules/module.py", "franks 3", "Ranked", "rankings", "NCC L", "accelerat",
                   "Lib/multiprocessing/spawn.py", "site-packages/accelerate/accelerator.py"]
    for filler in (b"", b"x" * 5000, b"torch/nn/modules/module.py line 3\n" * 400):  # the last: past the cap
        for text in [*signs, *near_misses, " ".join(near_misses)]:
            block = bytearray(filler + text.encode() + b"\n" + filler)
            want = explain_lines.DIST_CONTEXT.search(block) is not None
            assert explain_lines.has_dist_sign(block, len(block)) is want, (text, len(filler))
            assert want is (text in signs), text
