"""A nccl-tests command line pasted into `ddpdoctor bench` (issue 28): the same flags, the same table, the same JSON.

The layout and flags are nccl-tests' own, read from NVIDIA/nccl-tests v2.19.6: the column formats of
``src/util.cu`` (writeResultHeader, writeBenchmarkLinePreamble, writeBenchmarkLineBody, getFloatStr), the
flags of ``src/common.cu`` (its getopt_long table), the ``-J`` document of ``util.cu`` (jsonOutputInit,
writeDeviceReport, writeResultFooter) and ``NCCL_TESTS_MIN_BW`` (common.cu: fail below 90 % of it).
The runs are real gloo ranks started by the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddpdoctor.bench.analysis import combine_timing, parse_dtypes, parse_redops, size_sweep
from ddpdoctor.bench.nccl_tests import FOREIGN_FLAGS, foreign_notes, op_from_binary
from ddpdoctor.bench.ops import OpRunner, timed_loop
from ddpdoctor.bench.render import nccl_float
from ddpdoctor.errors import DoctorError
from tests.support import clean_env, run_cli

# util.cu writeResultHeader, without -I and -S: the three lines nccl-tests prints above its rows, from its
# own printf formats (kept as printf formats on purpose: they are the source).
NCCL_TESTS_HEADER = [
    "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "  # noqa: UP031
    % ("", "", "", "", ""),
    "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s" % (  # noqa: UP031
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
        "#wrong"),
    "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s" % (  # noqa: UP031
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
]
PREAMBLE = 12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6  # "%12li  %12li  %8s  %6s  %6s"
LAYOUT = 2 + 7 + 2 + 6 + 2 + 6 + 2 + 6  # "  %7s  %6s  %6s  %6g"


def _table(stdout: str) -> tuple[list[str], list[str]]:
    """The three header lines and the rows of the (first) table."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("in-place"))
    rows = []
    for line in lines[start + 3:]:
        if line.startswith("#"):
            break
        rows.append(line)
    return lines[start:start + 3], rows


def _layout(row: str, which: int) -> list[str]:
    """The four columns of one layout (0 out-of-place, 1 in-place) of a row, [] when blank."""
    part = row[PREAMBLE + which * LAYOUT:PREAMBLE + (which + 1) * LAYOUT]
    return part.split()


# -- a pasted command line, the table -----------------------------------------------------------------


def test_a_pasted_all_reduce_perf_line_gives_nccl_tests_table() -> None:
    proc = run_cli(["bench", "all_reduce_perf", "-b", "8", "-e", "128", "-f", "2", "-g", "1", "-n", "2", "-w", "1",
                    "--nproc", "2"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header, rows = _table(proc.stdout)
    for ours, theirs in zip(header, NCCL_TESTS_HEADER, strict=True):
        assert ours.startswith(theirs.rstrip()), (ours, theirs)
    assert [int(r.split()[0]) for r in rows] == [8, 16, 32, 64, 128]
    for row in rows:
        assert row[:PREAMBLE].split()[2:] == ["float", "sum", "-1"]
        assert _layout(row, 0) == []  # torch.distributed has no out-of-place all_reduce: blank, as nccl-tests
        time_us, algbw, busbw, wrong = _layout(row, 1)
        assert float(time_us) > 0 and wrong == "0"
        assert float(algbw) >= 0 and float(busbw) == pytest.approx(float(algbw), abs=0.011)  # 2 ranks: factor 1
    assert "# out-of-place: torch.distributed has no out-of-place all_reduce" in proc.stdout
    # -g 1 is how ddpdoctor runs anyway: accepted, and said so once, not silently dropped.
    assert proc.stderr.count("ddpdoctor bench: note: -g 1: one GPU per rank") == 1
    assert "# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor)" in proc.stdout
    assert proc.stdout.count("#  Rank ") == 2


def test_numbers_are_formatted_as_nccl_tests_prints_them() -> None:
    # util.cu getFloatStr: two decimals when they fit the width, then one, then none, then an exponent.
    assert nccl_float(12.345, 7) == "  12.35"
    assert nccl_float(123456.78, 7) == " 123457"
    assert nccl_float(1234.567, 6) == "1234.6"
    assert nccl_float(123456.7, 6) == "123457"
    assert nccl_float(12345678.0, 7) == "1.2e+07"


def test_split_ops_show_both_layouts_each_checked(tmp_path: Path) -> None:
    """all_gather and reduce_scatter exist in place and out of place: both timed, both verified; broadcast
    from -r 1 in place; -c 3 checks three times, -a 3 shows the slowest rank's time, -z 1 blocks, -C 1
    reports host time, -S 1 stamps rows, -N 2 runs the sweep twice, -J writes nccl-tests' JSON."""
    ours, theirs = tmp_path / "ours.json", tmp_path / "nccl.json"
    proc = run_cli(["bench", "--nproc", "2", "--op", "all_gather,reduce_scatter,broadcast", "-r", "1", "-b", "1K",
                    "-e", "4K", "-f", "4", "-n", "2", "-w", "1", "-c", "3", "-a", "3", "-z", "1", "-C", "1", "-S", "1",
                    "-N", "2", "--json", str(ours), "-J", str(theirs)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(ours.read_text())
    rows = doc["rows"]
    assert len(rows) == 2 * 3 * 2  # 2 cycles x 3 ops x 2 sizes
    for row in rows:
        layouts = {k: row[k] for k in ("out_of_place", "in_place") if row[k] is not None}
        expected = {"broadcast": {"in_place"}}.get(row["op"], {"out_of_place", "in_place"})
        assert set(layouts) == expected, row
        for t in layouts.values():
            assert t["wrong"] == 0 and t["time_us"] == t["max_time_us"]  # -a 3: the slowest rank's time
        assert row["timestamp"] and row["root"] == (1 if row["op"] == "broadcast" else -1)
    assert doc["check_iters"] == 3 and doc["average"] == 3 and doc["blocking"] == 1 and doc["cputime"] is True
    assert "# Blocking Enabled: wait and barrier after each call" in proc.stdout
    assert "cputime" in proc.stdout
    _, table_rows = _table(proc.stdout)
    assert all(len(_layout(r, 0)) == 4 and len(_layout(r, 1)) == 4 for r in table_rows)  # all_gather: both
    # nccl-tests' count column is what it passes to NCCL: each rank's share for all_gather (paramcount).
    assert table_rows[0].split()[:2] == ["1024", "128"]

    nccl = json.loads(theirs.read_text())
    assert set(nccl) >= {"version", "start_time", "args", "env", "nccl_version", "config", "devices", "results",
                         "out_of_bounds", "average_bus_bandwidth", "errors", "end_time"}
    assert nccl["config"]["validation"] == 3 and nccl["config"]["nthreads"] == 1
    assert len(nccl["devices"]) == 2 and nccl["out_of_bounds"] == {"count": 0, "okay": "true"}
    first = nccl["results"][0]
    assert first["size"] == 1024 and first["count"] == 128
    assert first["type"] == "float" and first["root"] == "    -1"  # "%6i", a string, as nccl-tests writes it
    assert set(first["out_of_place"]) == {"cpu_time", "alg_bw", "bus_bw", "nwrong"}  # -C 1: cpu_time
    assert nccl["average_bus_bandwidth"]["okay"] == "unchecked"


def test_reductions_other_than_sum_are_verified_and_what_gloo_cannot_do_is_said() -> None:
    """-o all on three ranks: sum, prod, max and min are exact; gloo averages floats but not integers, so
    avg on int32 is left out with a note naming gloo's own error, never silently."""
    proc = run_cli(["bench", "--nproc", "3", "--op", "all_reduce,reduce_scatter", "-o", "all", "-d", "int32,float",
                    "-b", "3K", "-e", "3K", "-n", "1", "-w", "1", "--json", "-"], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    done = {(r["op"], r["dtype"], r["redop"]) for r in doc["rows"]}
    for op in ("all_reduce", "reduce_scatter"):
        assert {(op, "float", redop) for redop in ("sum", "prod", "max", "min", "avg")} <= done
        assert {(op, "int32", redop) for redop in ("sum", "prod", "max", "min")} <= done
        assert (op, "int32", "avg") not in done
        assert f"gloo cannot run {op} with -d int32 -o avg" in proc.stderr
    assert all(t["wrong"] == 0 for r in doc["rows"] for t in (r["out_of_place"], r["in_place"]) if t)


@pytest.fixture
def one_rank_group(tmp_path: Path):
    """A real one-rank gloo process group in this process."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_check_iterations_catch_a_fault_the_first_check_misses(one_rank_group: None) -> None:
    """-c 3: three checked calls on fresh, different inputs. A collective that goes wrong only on its
    second call (a deliberately faulty one) passes -c 1 and is caught by -c 3, which stops there."""
    runner = OpRunner("all_reduce", 64, "float", 0, 1, torch.device("cpu"))
    assert runner.wrong(3) == 0
    real, calls = runner.call, []

    def faulty_second_call() -> object:
        calls.append(1)
        result = real()
        if len(calls) == 2:
            runner.output[5] += 1
        return result

    runner.call = faulty_second_call
    assert runner.wrong(1) == 0
    calls.clear()
    assert runner.wrong(3) == 1 and len(calls) == 2


def test_average_modes_pick_the_time_as_nccl_tests_a_says() -> None:
    times = [30.0, 10.0, 20.0]
    picked = {a: combine_timing("all_reduce", 1 << 20, times, [0, 0, 0], a).time_us for a in range(4)}
    assert picked == {0: 30.0, 1: 20.0, 2: 10.0, 3: 30.0}
    assert combine_timing("all_reduce", 1 << 20, times, [0, 0, 0], 2).slowest_rank == 0


def test_blocking_modes_put_the_barrier_in_or_out_of_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """-z 1 waits and holds a barrier after every call, inside the time; -z 3 holds it outside. The loop's
    clock is a counter that only the call (1 us) and the barrier (0.2 s) move, so what is inside the
    timed region is read exactly, whatever the machine's load."""
    from types import SimpleNamespace

    from ddpdoctor.bench import ops

    now = [0.0]
    barriers: list[float] = []
    monkeypatch.setattr(ops, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def call() -> None:
        now[0] += 1e-6

    def barrier() -> None:
        barriers.append(now[0])
        now[0] += 0.2

    z1 = timed_loop(call, 3, 0, torch.device("cpu"), barrier, blocking=1)
    assert len(barriers) == 2 + 3 and z1 == pytest.approx(0.2e6 + 1)  # each call's time holds its barrier
    barriers.clear()
    z3 = timed_loop(call, 3, 0, torch.device("cpu"), barrier, blocking=3)
    assert len(barriers) == 2 + 3 and z3 == pytest.approx(1)  # the barriers are outside the time
    barriers.clear()
    z0 = timed_loop(call, 3, 0, torch.device("cpu"), barrier, blocking=0)
    assert len(barriers) == 2 and z0 == pytest.approx(1)  # -z 0: only nccl-tests' two barriers, before


# -- flags: implemented, accepted with a note, refused with the reason ---------------------------------


def test_every_nccl_tests_flag_is_implemented_noted_or_refused() -> None:
    """nccl-tests' getopt string (common.cu): every letter is a flag of `ddpdoctor bench`."""
    from typer.main import get_command

    from ddpdoctor.cli import build_app

    getopt = "t:g:b:e:i:f:n:m:w:N:p:I:K:c:o:d:r:z:y:T:hG:C:a:R:x:D:V:J:S:M:u:"
    letters = {f"-{c}" for c in getopt if c != ":"}
    bench = get_command(build_app("bench")).commands["bench"]  # type: ignore[attr-defined]
    ours = {opt for p in bench.params for opt in p.opts} | {"-h"}  # -h: the help option, as there
    assert letters - ours == set()
    assert {f.short for f in FOREIGN_FLAGS} <= letters


@pytest.mark.parametrize("args, needle", [
    (["-g", "2"], "-g/--ngpus 2: nccl-tests' GPUs per thread: ddpdoctor drives one GPU per rank; use --nproc"),
    (["-t", "4"], "ddpdoctor runs one rank per process (no threads)"),
    (["-m", "8"], "no public call that groups several collectives"),
    (["-G", "10"], "CUDA graphs are not measured"),
    (["-I", "1"], "per-iteration timing is not implemented"),
    (["-N", "0"], "-N/--run_cycles takes 1-1000 sweeps (nccl-tests' 0, forever, would never end)"),
    (["-d", "uint32"], "PyTorch's process groups have no uint32 collectives"),
    (["-d", "f8e4m3"], "float8 is not measured"),
    (["-o", "mulsum"], "ncclRedOpCreatePreMulSum"),
    (["-J", "out.txt"], "-J/--output_file takes a file name ending in .json"),
    (["-i", "1K", "-f", "2"], "-i/--stepbytes and -f/--step-factor both set the size steps"),
    (["-a", "5"], "-a/--average takes 0, 1, 2, 3"),
    (["-z", "4"], "-z/--blocking takes 0, 1, 2, 3"),
    (["reduce_perf"], "does not measure ncclReduce"),
    (["gather_perf", "-b", "8"], "does not measure gather"),
    (["sendrecv_perf", "--op", "all_reduce"], "sendrecv_perf picks sendrecv and --op all_reduce picks another"),
    (["-r", "5", "--op", "broadcast", "--nproc", "2"], "-r/--root 5: there are 2 ranks (0-1)"),
])
def test_refusals_are_one_line_exit_2_with_the_reason(args: list[str], needle: str, tmp_path: Path) -> None:
    proc = run_cli(["bench", *args], timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out.txt").exists()


def test_foreign_flags_at_ddpdoctors_own_values_are_notes() -> None:
    notes = foreign_notes({"--ngpus": "1", "--nthreads": "1", "--cudagraph": "0", "--agg_iters": "1",
                           "--memory": "1", "--stream_null": None})
    assert [n.split(":")[0] for n in notes] == ["-t 1", "-g 1", "-m 1", "-G 0", "-M 1"]
    with pytest.raises(DoctorError, match="takes a number"):
        foreign_notes({"--ngpus": "two"})


def test_nccl_tests_names_parse() -> None:
    assert parse_dtypes("all") == ["float", "half", "bfloat16", "double", "int8", "uint8", "int32", "int64"]
    assert parse_dtypes("half,bf16") == ["half", "bfloat16"]
    assert parse_redops("all") == ["sum", "prod", "max", "min", "avg"]
    assert op_from_binary("./build/all_gather_perf") == "all_gather"
    assert op_from_binary("alltoall_perf_mpi") == "all_to_all"
    assert size_sweep(1024, 4096, 2, step_bytes=1024) == [1024, 2048, 3072, 4096]  # -i: fixed increment
    with pytest.raises(DoctorError, match="at most 10000"):
        size_sweep(1, 1 << 30, 2, step_bytes=1)


def test_nccl_tests_min_bw_is_read_as_nccl_tests_reads_it(tmp_path: Path) -> None:
    """NCCL_TESTS_MIN_BW=X fails the run below 90 % of X, as common.cu does; --min-busbw wins when given.
    The footer and the --json document carry that verdict too."""
    env = clean_env({"NCCL_TESTS_MIN_BW": "1000000"})
    out = tmp_path / "r.json"
    proc = run_cli(["bench", "--nproc", "2", "-b", "4K", "-e", "4K", "-n", "1", "-w", "1", "--json", str(out)],
                   timeout=240, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "is below 900000 GB/s (90 % of NCCL_TESTS_MIN_BW=1000000, as nccl-tests)" in proc.stdout
    assert ("(over all sizes: none >= 1 MiB) against 900000 GB/s (90 % of NCCL_TESTS_MIN_BW=1000000, "
            "as nccl-tests): FAILED") in proc.stdout
    data = json.loads(out.read_text())
    assert data["status"] == "fail" and "NCCL_TESTS_MIN_BW=1000000" in data["failures"][0]
    assert data["min_busbw"] == {"threshold_gbps": 900000.0, "source": "90 % of NCCL_TESTS_MIN_BW=1000000, as nccl-tests"}
    # Which threshold wins is settled before any rank starts (one real run above proves the rest).
    from ddpdoctor.commands.bench import build_config

    def threshold(min_busbw: float | None) -> tuple[float | None, str]:
        config = build_config("all_reduce", "4K", "4K", None, 1, 1, "float", 1, False, min_busbw, None, None,
                              "gloo", 30.0, environ=env)
        return config.min_busbw_gbps, config.min_busbw_label

    assert threshold(None) == (900000.0, "90 % of NCCL_TESTS_MIN_BW=1000000, as nccl-tests")
    assert threshold(0.0) == (0.0, "--min-busbw")
