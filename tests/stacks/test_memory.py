"""`ddpdoctor.stacks.memory` against real CPython processes (3.11 shared and static, 3.12, 3.13), real py-spy.

Every target is started in its own session and SIGKILLed (with its whole group) in a ``finally``; every
wait has a deadline. The blocked target (tests/targets/blocked_stacks.py) is read only once all its
threads sleep with no CPU progress, so the reader and py-spy see the same, settled stacks. Expected line
numbers come from the target's text, not from constants.
"""

from __future__ import annotations

import ast
import dis
import glob
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpdoctor.stacks.engine import _threads_from_py_spy, find_py_spy
from ddpdoctor.stacks.memory import Unreadable, line_of, read_stacks
from ddpdoctor.stacks.report import Frame, ThreadStack
from tests.support import BLOCKED_TARGET, REPO, kill_session, started, wait_ready

TARGET = BLOCKED_TARGET
DEADLINE_S = 60.0


# ---------------------------------------------------------------------------------------------------------
# Interpreters and processes


def _newest(pattern: str) -> str | None:
    found = sorted(p for p in glob.glob(pattern) if os.access(p, os.X_OK))
    return found[-1] if found else None


INTERPRETERS: dict[str, Callable[[], str | None]] = {
    "venv": lambda: sys.executable,
    "debian-static-3.11": lambda: _newest("/usr/bin/python3.11"),
    "pyenv-3.12": lambda: _newest("/root/.pyenv/versions/3.12.*/bin/python3.12"),
    "pyenv-3.13": lambda: _newest("/root/.pyenv/versions/3.13.*/bin/python3.13"),
}


def _interpreter(name: str) -> str:
    exe = INTERPRETERS[name]()
    if exe is None:
        pytest.skip(f"no {name} interpreter on this machine")
    return exe


def _version(exe: str) -> tuple[int, int]:
    out = subprocess.run([exe, "-I", "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                         text=True, timeout=DEADLINE_S, check=True).stdout.split()
    return int(out[0]), int(out[1])


def _tasks(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread's state letter and utime+stime, from /proc."""
    tasks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(OSError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            tasks[int(task.name)] = (fields[0], int(fields[11]) + int(fields[12]))
    return tasks


def _wait_settled(pid: int, threads: int = 2) -> None:
    """Until every thread sleeps with no CPU progress in two looks 0.1 s apart ("ready" is printed just
    before the main thread goes to sleep in Event.wait: reading at once races with those last steps)."""
    deadline = time.monotonic() + DEADLINE_S
    last: dict[int, tuple[str, int]] = {}
    while True:
        now = _tasks(pid)
        if now == last and len(now) >= threads and all(state == "S" for state, _ in now.values()):
            return
        assert time.monotonic() < deadline, f"pid {pid} never settled: {now}"
        last = now
        time.sleep(0.1)


def _py_spy_threads(pid: int) -> list[ThreadStack]:
    exe = find_py_spy()
    if exe is None:
        pytest.skip("py-spy is not installed")
    res = subprocess.run([exe, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True,
                         timeout=DEADLINE_S)
    assert res.returncode == 0, res.stderr
    return _threads_from_py_spy(json.loads(res.stdout), pid)


def _comparable(threads: list[ThreadStack]) -> list[tuple[int, bool, list[Frame]]]:
    return sorted((t.thread_id, t.main, t.frames) for t in threads)


# ---------------------------------------------------------------------------------------------------------
# The blocked target: what its stacks must be


def target_line(function: str, code: str) -> int:
    """The line of ``code`` in the target, first after ``def function(`` (``released.wait()`` is twice)."""
    lines = TARGET.read_text(encoding="utf-8").splitlines()
    start = next(i for i, text in enumerate(lines) if text.strip().startswith(f"def {function}("))
    for number, text in enumerate(lines[start:], start=start + 1):
        if text.strip() == code:
            return number
    raise AssertionError(f"{code!r} not in {function} of {TARGET}")


def _module_line(code: str) -> int:
    lines = TARGET.read_text(encoding="utf-8").splitlines()
    return next(n for n, text in enumerate(lines, start=1) if text.strip() == code)


EXPECTED_MAIN = [  # the main thread's frames in the target file, innermost first
    ("größe", target_line("größe", "released.wait()")),
    *[("größe", target_line("größe", "größe(depth - 1)"))] * 3,
    ("関数", target_line("関数", "größe(3)")),
    ("Trainer.batches.<locals>.<lambda>", target_line("batches", "(lambda: 関数())()")),
    ("Trainer.batches", target_line("batches", "(lambda: 関数())()")),
    ("Trainer.step", target_line("step", "for _ in self.batches():")),
    ("<module>", _module_line("Trainer().step()")),
]
WORKER_LINE = target_line("worker_waits", "released.wait()")


@dataclass
class Blocked:
    exe: str
    pid: int
    stacks: list[ThreadStack]


@pytest.fixture(scope="module", params=sorted(INTERPRETERS))
def blocked(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Blocked]:
    """The target under one interpreter, settled, and what ``read_stacks`` says about it."""
    exe = _interpreter(request.param)
    if not (3, 11) <= _version(exe) <= (3, 13):
        pytest.skip(f"{exe} is not CPython 3.11-3.13")
    log = tmp_path_factory.mktemp("blocked") / "stderr.log"
    with started([exe, str(TARGET)], log) as proc:
        _wait_settled(proc.pid)
        yield Blocked(exe, proc.pid, read_stacks(proc.pid))


def test_stacks_equal_py_spy(blocked: Blocked) -> None:
    spy = _py_spy_threads(blocked.pid)
    assert _comparable(blocked.stacks) == _comparable(spy)
    # The process has not moved: a second read gives the same answer (the stacks above were settled).
    assert _comparable(read_stacks(blocked.pid)) == _comparable(blocked.stacks)


def test_stacks_show_what_the_user_expects(blocked: Blocked) -> None:
    mains = [t for t in blocked.stacks if t.main]
    assert len(mains) == 1, blocked.stacks
    main = mains[0]
    assert main.name == "MainThread"
    mine = [(f.function, f.line) for f in main.frames if f.file == str(TARGET)]
    assert mine == EXPECTED_MAIN, main.frames
    # Above the user's innermost frame: threading's Event.wait (the frames are innermost first).
    first_user = next(i for i, f in enumerate(main.frames) if f.file == str(TARGET))
    assert [f.function for f in main.frames[:first_user]] == ["Condition.wait", "Event.wait"]
    assert all(f.file.endswith("threading.py") and f.line > 0 for f in main.frames[:first_user])

    workers = [t for t in blocked.stacks if not t.main]
    assert len(workers) == 1, blocked.stacks
    worker = workers[0]
    assert worker.thread_id != main.thread_id and worker.thread_id > 0
    assert ("worker_waits", WORKER_LINE) in [(f.function, f.line) for f in worker.frames]
    assert worker.frames[-1].function == "Thread._bootstrap"


# ---------------------------------------------------------------------------------------------------------
# What the reader must refuse


def test_python_3_10_is_refused_as_before_3_11(tmp_path: Path) -> None:
    exe = _newest("/root/.pyenv/versions/3.10.*/bin/python3.10")
    if exe is None:
        pytest.skip("no CPython 3.10 on this machine")
    with started([exe, str(TARGET)], tmp_path / "stderr.log") as proc, \
            pytest.raises(Unreadable, match=r"before 3\.11"):
        read_stacks(proc.pid)


def test_not_python_and_missing_pids_are_refused(tmp_path: Path) -> None:
    with started(["sleep", "600"], tmp_path / "stderr.log", ready=False) as proc:
        deadline = time.monotonic() + DEADLINE_S
        while Path(f"/proc/{proc.pid}/exe").resolve().name != "sleep":  # exec'd
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(Unreadable):
            read_stacks(proc.pid)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    with pytest.raises(Unreadable):
        read_stacks(pid_max)  # pids are below pid_max: this one never exists
    with pytest.raises(Unreadable):
        read_stacks(proc.pid)  # reaped above


def test_killed_process_is_unreadable(tmp_path: Path) -> None:
    """SIGKILLed and not reaped (a zombie, as a dying rank looks), then reaped."""
    with started([sys.executable, str(TARGET)], tmp_path / "stderr.log") as proc:
        _wait_settled(proc.pid)
        read_stacks(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE_S
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(Unreadable):
            read_stacks(proc.pid)
    with pytest.raises(Unreadable):
        read_stacks(proc.pid)


# ---------------------------------------------------------------------------------------------------------
# A running target: torn reads are Unreadable or sane stacks, never another exception, never a hang

BUSY = textwrap.dedent("""
    import threading

    def leaf(n):
        return n + 1

    def gen(n):
        for i in range(n):
            yield leaf(i)

    def rec(depth):
        if depth == 0:
            return sum(gen(3)) + (lambda: leaf(2))()
        return rec(depth - 1)

    def churn(k):  # a fresh code object, strings and line table every call, freed soon after
        ns = {}
        exec(compile(f"def f_{k}(x):\\n" + "\\n" * (k % 50) + f"    return x + {k}\\n", f"<gen {k}>", "exec"), ns)
        return ns[f"f_{k}"](k)

    def threads_come_and_go():
        while True:
            batch = [threading.Thread(target=rec, args=(i,)) for i in range(3)]
            for t in batch:
                t.start()
            for t in batch:
                t.join()

    threading.Thread(target=threads_come_and_go, daemon=True).start()
    print("ready", flush=True)
    k = 0
    while True:
        k += 1
        rec(k % 20)
        if k % 7 == 0:
            churn(k)
""")


@pytest.mark.parametrize("name", sorted(INTERPRETERS))
def test_reads_of_a_busy_process_are_sane_or_unreadable(name: str, tmp_path: Path) -> None:
    exe = _interpreter(name)
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    outcomes: list[str] = []
    problems: list[str] = []

    def hammer(pid: int) -> None:
        for _ in range(200):
            try:
                threads = read_stacks(pid)
            except Unreadable:
                outcomes.append("unreadable")
                continue
            except Exception as exc:
                problems.append(f"{type(exc).__name__}: {exc}")
                continue
            outcomes.append("read")
            for t in threads:
                for f in t.frames:
                    if not (isinstance(f.function, str) and f.function and isinstance(f.file, str) and f.file
                            and isinstance(f.line, int) and f.line >= 0):
                        problems.append(f"bad frame {f} in thread {t.thread_id}")

    with started([exe, str(script)], tmp_path / "stderr.log") as proc:
        worker = threading.Thread(target=hammer, args=(proc.pid,), daemon=True)
        worker.start()
        worker.join(timeout=120)
        assert not worker.is_alive(), f"read_stacks hung ({len(outcomes)} reads done)"
        assert proc.poll() is None, "the reads disturbed the target"
    assert problems == []
    # A busy process's stack rarely holds still for two reads: those are Unreadable, for py-spy to pause.
    assert len(outcomes) == 200, outcomes


def test_process_killed_while_being_read(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    errors: list[str] = []
    with started([sys.executable, str(script)], tmp_path / "stderr.log") as proc:
        killer = threading.Timer(0.3, os.kill, (proc.pid, signal.SIGKILL))
        killer.start()
        try:
            stop = time.monotonic() + 1.5
            while time.monotonic() < stop:
                try:
                    read_stacks(proc.pid)
                except Unreadable:
                    pass
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            killer.cancel()
            killer.join(timeout=DEADLINE_S)
        with pytest.raises(Unreadable):
            read_stacks(proc.pid)
    assert errors == []


# ---------------------------------------------------------------------------------------------------------
# line_of against CPython's own decoding of co_linetable


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _entry_kinds(table: bytes) -> set[int]:
    """The location-entry codes (Objects/locations.md) a line table uses: 0-9 short, 10-12 one-line,
    13 no column, 14 long, 15 none."""
    kinds, i = set(), 0
    while i < len(table):
        kinds.add((table[i] >> 3) & 15)
        i += 1
        while i < len(table) and not table[i] & 128:
            i += 1
    return kinds


def _line_of_mismatches(code: types.CodeType) -> list[tuple[str, int, int | None, int]]:
    wrong = []
    for unit, (line, *_) in enumerate(code.co_positions()):
        got = line_of(code.co_linetable, code.co_firstlineno, unit)
        if got != (line or 0):
            wrong.append((code.co_qualname, unit, line, got))
    for ins in dis.get_instructions(code, show_caches=True):
        got = line_of(code.co_linetable, code.co_firstlineno, ins.offset // 2)
        if ins.positions is not None and got != (ins.positions.lineno or 0):
            wrong.append((code.co_qualname, ins.offset // 2, ins.positions.lineno, got))
    return wrong


def _sample_function(a: list[int], b: int) -> int:
    total = 0
    for x in a:  # a loop: a backward jump, and the line table goes back to this line
        if x > b:
            total += (
                x
                *
                b
            )  # the multiply's location starts two lines above its operand: a negative line delta
    try:
        with open(os.devnull) as fh:  # exception-table cleanup code: entries without a location
            fh.read()
    except OSError:
        return -1
    return total


async def _sample_coroutine(n: int) -> list[int]:
    return [i async for i in _sample_agen(n)]


async def _sample_agen(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


GAPPY = (
    "def gappy(a, b):\n"
    + "\n" * 1500
    + "    total = 0\n"  # 1500 lines below the def: a multi-byte line delta
    + "\n" * 3000
    + "    for i in range(a):\n"
    + "        total += (\n"
    + "\n" * 1200
    + "            i)\n"  # the += starts 1200 lines above `i`: a multi-byte negative delta
    + "    return " + " " * 300 + "total + b\n"  # columns past 255: long-form entries, multi-byte varints
)


def _gappy() -> types.CodeType:
    return compile(GAPPY, "<gappy>", "exec")


def _no_columns() -> types.CodeType:
    """Code whose entries carry no columns (entry code 13), as compiled from an AST without them."""
    tree = ast.parse("def g(a):\n    x = a + 1\n\n\n    return x * a\n")
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            node.col_offset = node.end_col_offset = -1
    return compile(tree, "<no-columns>", "exec")


def test_line_of_matches_co_positions() -> None:
    tops = [_sample_function.__code__, _sample_coroutine.__code__, _sample_agen.__code__, _gappy(),
            _no_columns(), line_of.__code__, read_stacks.__code__, threading.Condition.wait.__code__]
    codes = [code for top in tops for code in _codes(top)]
    assert [w for code in codes for w in _line_of_mismatches(code)] == []

    kinds = set().union(*(_entry_kinds(code.co_linetable) for code in codes))
    assert {13, 14, 15} <= kinds and kinds & set(range(10)) and kinds & {10, 11, 12}, kinds
    gappy = next(code for code in codes if code.co_name == "gappy")
    lines = [line for line, *_ in gappy.co_positions() if line is not None]
    assert max(lines) - min(lines) > 5000
    steps = [b - a for a, b in itertools.pairwise(lines)]
    assert min(steps) < -1000 and max(steps) > 1000, (min(steps), max(steps))
    # Before the first instruction (a frame that has not started): the def line.
    assert line_of(gappy.co_linetable, gappy.co_firstlineno, -1) == gappy.co_firstlineno


LINE_OF_CHECK = """
import sys, types
from ddpdoctor.stacks.memory import line_of
def codes(c):
    yield c
    for k in c.co_consts:
        if isinstance(k, types.CodeType):
            yield from codes(k)
n = bad = 0
for source, name in [(open(m.__file__).read(), m.__file__) for m in (__import__("threading"),
                     __import__("json.decoder").decoder, __import__("dataclasses"))] + [(sys.argv[1], "<gappy>")]:
    for c in codes(compile(source, name, "exec")):
        for i, (line, *_) in enumerate(c.co_positions()):
            n += 1
            bad += line_of(c.co_linetable, c.co_firstlineno, i) != (line or 0)
print(n, bad)
"""


@pytest.mark.parametrize("name", sorted(INTERPRETERS))
def test_line_of_matches_each_interpreters_own_tables(name: str) -> None:
    """Each version's compiler writes its own tables: decode them with that version's co_positions."""
    exe = _interpreter(name)
    res = subprocess.run([exe, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + LINE_OF_CHECK,
                          GAPPY], capture_output=True, text=True, timeout=DEADLINE_S)
    assert res.returncode == 0, res.stderr
    units, bad = map(int, res.stdout.split())
    assert units > 10_000 and bad == 0


# ---------------------------------------------------------------------------------------------------------
# Binaries deleted after start: the reader may fall back (Unreadable) but must never read another file


@pytest.mark.parametrize("deleted", ["executable", "libpython"])
def test_deleted_binary_is_read_through_map_files(deleted: str, tmp_path: Path) -> None:
    """An interpreter file deleted or replaced on disk after start (an environment upgraded under a running
    job): root reads it through /proc/PID/map_files; anyone else gets a reason that says so."""
    import shutil
    import sysconfig

    env = dict(os.environ)
    if deleted == "executable":
        if _newest("/usr/bin/python3.11") is None:
            pytest.skip("no static /usr/bin/python3.11")
        exe = gone = str(tmp_path / "python3.11")
        shutil.copy2("/usr/bin/python3.11", exe)
    else:
        lib = Path(str(sysconfig.get_config_var("LIBDIR"))) / str(sysconfig.get_config_var("INSTSONAME"))
        if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not lib.exists():
            pytest.skip("this interpreter has no shared libpython")
        exe, gone = sys.executable, str(tmp_path / lib.name)
        shutil.copy2(lib, gone)
        env["LD_LIBRARY_PATH"] = str(tmp_path)
    with open(tmp_path / "stderr.log", "wb") as err:
        proc = subprocess.Popen([exe, str(TARGET)], stdout=subprocess.PIPE, stderr=err, env=env,
                                start_new_session=True)
    try:
        wait_ready(proc, tmp_path / "stderr.log")
        assert any(gone in line for line in Path(f"/proc/{proc.pid}/maps").read_text().splitlines())
        os.unlink(gone)
        _wait_settled(proc.pid)
        try:
            threads = read_stacks(proc.pid)
        except Unreadable as exc:
            assert os.geteuid() != 0, exc
            assert "was replaced on disk after the process started" in str(exc) and "needs root" in str(exc)
            return
        main = next(t for t in threads if t.main)
        assert [(f.function, f.line) for f in main.frames if f.file == str(TARGET)] == EXPECTED_MAIN
    finally:
        kill_session(proc)
        if proc.stdout is not None:
            proc.stdout.close()


# ---------------------------------------------------------------------------------------------------------
# Processes a user can have that an earlier reader got wrong (a wrong answer rather than Unreadable, or an
# exception that is not Unreadable).


def test_file_name_with_undecodable_bytes(tmp_path: Path) -> None:
    """A lone surrogate (non-UTF-8 bytes through surrogateescape) is shown as U+FFFD, not a crash."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    folder.mkdir()
    script = folder / TARGET.name
    script.write_bytes(TARGET.read_bytes())
    with started([sys.executable, str(script)], tmp_path / "stderr.log") as proc:
        _wait_settled(proc.pid)
        main = next(t for t in read_stacks(proc.pid) if t.main)
        shown = os.fsdecode(bytes(tmp_path)) + "/caf\ufffd/" + TARGET.name
        assert [(f.function, f.line) for f in main.frames if f.file == shown] == EXPECTED_MAIN


def _can_unshare_pid() -> bool:
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=DEADLINE_S)
    return probe.returncode == 0


def test_process_in_its_own_pid_namespace(tmp_path: Path) -> None:
    """The main thread's native id is the pid inside the container's namespace (NSpid), not ours."""
    if not _can_unshare_pid():
        pytest.skip("needs root and unshare --pid")
    import psutil

    with started(["unshare", "--pid", "--fork", "--kill-child", sys.executable, str(TARGET)],
                 tmp_path / "stderr.log") as proc:
        python = psutil.Process(proc.pid).children()[0].pid
        _wait_settled(python)
        mains = [t for t in read_stacks(python) if t.main]
        assert len(mains) == 1
        assert [(f.function, f.line) for f in mains[0].frames if f.file == str(TARGET)] == EXPECTED_MAIN


SUBINTERPRETER = textwrap.dedent("""
    import sys, time
    interpreters = __import__("_interpreters" if sys.version_info >= (3, 13) else "_xxsubinterpreters")
    kept = interpreters.create()  # created and kept idle, as a library might (3.12 frees it with its id)

    def main_waits():
        print("ready", flush=True)
        time.sleep(600)

    main_waits()
""")


@pytest.mark.parametrize("name", ["pyenv-3.12", "pyenv-3.13"])
def test_idle_subinterpreter_does_not_hide_the_main_thread(name: str, tmp_path: Path) -> None:
    """3.12 keeps a frameless thread state of the idle subinterpreter on the main OS thread (py-spy shows
    it as a second, empty main thread); 3.13 keeps the interpreters' `next` far from offset 0."""
    exe = _interpreter(name)
    script = tmp_path / "subinterpreter.py"
    script.write_text(SUBINTERPRETER)
    with started([exe, str(script)], tmp_path / "stderr.log") as proc:
        _wait_settled(proc.pid, threads=1)
        threads = read_stacks(proc.pid)
        mains = [t for t in threads if t.main]
        assert len(mains) == 1, threads
        assert [f.function for f in mains[0].frames] == ["main_waits", "<module>"], threads


def test_second_libpython_in_the_process(tmp_path: Path) -> None:
    """A second, never initialised libpython (a plugin bundling its own) is passed over."""
    other = _newest("/root/.pyenv/versions/3.12.*/lib/libpython3.12.so.1.0")
    if other is None:
        pytest.skip("no second libpython to load")
    script = tmp_path / "two_pythons.py"
    script.write_text(textwrap.dedent(f"""
        import ctypes, time
        ctypes.CDLL({other!r})  # a plugin that bundles its own libpython

        def main_waits():
            print("ready", flush=True)
            time.sleep(600)

        main_waits()
    """))
    with started([sys.executable, str(script)], tmp_path / "stderr.log") as proc:
        _wait_settled(proc.pid, threads=1)
        threads = read_stacks(proc.pid)
        assert [f.function for t in threads if t.main for f in t.frames] == ["main_waits", "<module>"], threads


def test_init_shim_frame_is_not_reported(tmp_path: Path) -> None:
    """3.13's `__init__` cleanup shim under a specialised class call is an incomplete frame, hidden as
    CPython's own tracebacks hide it."""
    exe = _interpreter("pyenv-3.13")
    script = tmp_path / "init_shim.py"
    script.write_text(textwrap.dedent("""
        import time

        class Box:
            def __init__(self, block):
                if block:
                    print("ready", flush=True)
                    time.sleep(600)

        def make():
            for k in range(100):  # warm up: the call specialises to CALL_ALLOC_AND_ENTER_INIT
                Box(k == 99)

        make()
    """))
    with started([exe, str(script)], tmp_path / "stderr.log") as proc:
        _wait_settled(proc.pid, threads=1)
        main = next(t for t in read_stacks(proc.pid) if t.main)
        assert [f.function for f in main.frames] == ["Box.__init__", "make", "<module>"], main.frames
