"""`ddpdoctor bench`: nccl-tests-style bandwidth sweep on every rank; rank 0 prints the table."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ddpdoctor.bench import (
    AVERAGES,
    BLOCKING,
    DTYPE_BYTES,
    FOREIGN_FLAGS,
    BenchConfig,
    bytes_per_rank,
    check_plot_available,
    foreign_notes,
    human_bytes,
    min_busbw_from_env,
    min_row_bytes,
    op_from_binary,
    parse_dtypes,
    parse_ops,
    parse_redops,
    parse_size,
    size_sweep,
)
from ddpdoctor.commands.options import (
    BackendOption,
    JsonOption,
    LocalRanksFilterOption,
    LogDirOption,
    MasterPortOption,
    NprocOption,
    RedirectsOption,
    TeeOption,
    launch_logs,
    validate_min_busbw,
)
from ddpdoctor.errors import DoctorError
from ddpdoctor.outputs import LOG_FOLDER, NCCL_TESTS_JSON, PLOT, Plan, json_to_stdout

if TYPE_CHECKING:
    from ddpdoctor.runtime.launcher import LaunchInfo


# Iterations per size: nccl-tests runs 20; a million already takes hours at 1 GiB, more never ends.
MAX_ITERS = 1_000_000
# Checked calls per size and layout (nccl-tests' -c) and whole sweeps (-N): bounded like -n.
MAX_CHECK_ITERS = 1_000
MAX_CYCLES = 1_000


def build_config(op: str, min_bytes: str, max_bytes: str, step_factor: float | None, iters: int, warmup: int,
                 dtype: str, check: int, pairs: bool, min_busbw: float | None, json_path: str | None,
                 plot_path: str | None, backend: str, timeout: float, *, redop: str = "sum", root: int = 0,
                 average: int = 1, blocking: int = 0, cputime: int = 0, timestamps: int = 0, run_cycles: int = 1,
                 step_bytes: str | None = None, nccl_json_path: str | None = None, argv: tuple[str, ...] = (),
                 environ: Mapping[str, str] | None = None, log_dir: str | None = None,
                 min_busbw_pct: float | None = None, warn_busbw_pct: float | None = None) -> BenchConfig:
    """Options -> BenchConfig; DoctorError (exit 2, one line) for anything malformed."""

    ops = parse_ops(op)
    if step_bytes is not None and step_factor is not None:
        raise DoctorError("-i/--stepbytes and -f/--step-factor both set the size steps; give one of them "
                          "(nccl-tests: \"only one of those should be used\")")
    step = parse_size(step_bytes, "-i/--stepbytes") if step_bytes is not None else None
    factor = 2.0 if step_factor is None else step_factor
    sizes = size_sweep(parse_size(min_bytes, "-b/--min-bytes"), parse_size(max_bytes, "-e/--max-bytes"), factor,
                       step)
    dtypes = parse_dtypes(dtype)
    redops = parse_redops(redop)
    smallest, why = max(min_row_bytes(ops, d, 1) for d in dtypes)
    if sizes[0] < smallest:
        raise DoctorError(f"-b/--min-bytes {human_bytes(sizes[0])} measures nothing: {why}; give -b {smallest} "
                          "or more")
    if not 1 <= iters <= MAX_ITERS:
        raise DoctorError(f"-n/--iters must be in 1-{MAX_ITERS}, got: {iters}")
    if not 0 <= warmup <= MAX_ITERS:
        raise DoctorError(f"-w/--warmup must be in 0-{MAX_ITERS}, got: {warmup}")
    if not 0 <= check <= MAX_CHECK_ITERS:
        raise DoctorError(f"-c/--check takes how many checked calls to make per size and layout, 0 (off) to "
                          f"{MAX_CHECK_ITERS} (nccl-tests' check iterations), got: {check}")
    for flag, value, allowed in (("-a/--average", average, AVERAGES), ("-z/--blocking", blocking, BLOCKING),
                                 ("-C/--report_cputime", cputime, (0, 1)), ("-S/--report_timestamps", timestamps, (0, 1))):
        if value not in allowed:
            raise DoctorError(f"{flag} takes {', '.join(str(k) for k in allowed)} (as nccl-tests), got: {value}")
    if not 1 <= run_cycles <= MAX_CYCLES:
        raise DoctorError(f"-N/--run_cycles takes 1-{MAX_CYCLES} sweeps (nccl-tests' 0, forever, would never end), "
                          f"got: {run_cycles}")
    if root < 0:
        raise DoctorError(f"-r/--root takes a rank >= 0, got: {root}")
    validate_min_busbw(min_busbw)
    from ddpdoctor.bench import thresholds_from_options

    thresholds = thresholds_from_options(min_busbw_pct, warn_busbw_pct)
    label = "--min-busbw"
    if min_busbw is None:
        from_env = min_busbw_from_env(os.environ if environ is None else environ)
        if from_env is not None:
            min_busbw, label = from_env
    if json_to_stdout(plot_path):
        raise DoctorError("--plot takes a file name (.png, .svg or .pdf); - (stdout) is for --json")
    if nccl_json_path is not None and (json_to_stdout(nccl_json_path)
                                       or not nccl_json_path.lower().endswith(".json")):
        raise DoctorError(f"-J/--output_file takes a file name ending in .json (nccl-tests writes JSON only for "
                          f"that suffix; --json - prints ddpdoctor's JSON on stdout), got: {nccl_json_path!r}")
    plan = Plan("bench")
    plan.json("--json", json_path)
    plan.file("--plot", plot_path, PLOT)
    plan.file("-J/--output_file", nccl_json_path, NCCL_TESTS_JSON)
    plan.folder("--log-dir", log_dir, LOG_FOLDER)
    if plot_path is not None:
        check_plot_available()
    return BenchConfig(ops=tuple(ops), sizes=tuple(sizes), iters=iters, warmup=warmup, dtypes=tuple(dtypes),
                       check_iters=check, pairs=pairs, min_busbw_gbps=min_busbw, json_path=json_path,
                       plot_path=plot_path, backend=backend, timeout_s=timeout,
                       op_label="all" if len(ops) > 1 and op.strip().lower() == "all" else ",".join(ops),
                       redops=tuple(redops), root=root, average=average, blocking=blocking, cputime=bool(cputime),
                       timestamps=bool(timestamps), run_cycles=run_cycles, nccl_json_path=nccl_json_path,
                       min_busbw_label=label, argv=argv, step_bytes=step, step_factor=factor,
                       fail_pct=thresholds.fail_pct, warn_pct=thresholds.warn_pct)


def refuse_sizes_beyond_this_machine(config: BenchConfig, nproc: int | None) -> None:
    """Before any rank starts: -b too small for the split ops, -e too large for memory (exit 2, one line).

    Past the memory, an allocation fails mid-sweep on some rank and its peers wait for it until the
    deadline; on CPU the ranks of this host share its available RAM, on GPU each has one device.
    """
    from ddpdoctor.runtime import launcher
    from ddpdoctor.runtime.capacity import available_memory
    from ddpdoctor.runtime.selflaunch import default_nproc

    info = launcher.detect()
    world = info.world_size if info.is_launched else (nproc or default_nproc())
    local = info.local_world_size if info.is_launched else world
    smallest, why = max(min_row_bytes(config.ops, d, world) for d in config.dtypes)
    if config.sizes[0] < smallest:
        raise DoctorError(f"-b/--min-bytes {human_bytes(config.sizes[0])} measures nothing: {why}; give "
                          f"-b {smallest} or more")
    if "broadcast" in config.ops and config.root >= world:
        raise DoctorError(f"-r/--root {config.root}: there are {world} ranks (0-{world - 1})")
    widest = max(config.dtypes, key=lambda d: DTYPE_BYTES[d])
    need = bytes_per_rank(config.ops, max(config.sizes[-1], config.pair_bytes if config.pairs else 0),
                          widest, config.check)
    gpu_bytes = _smallest_gpu_bytes(config.backend)
    if gpu_bytes is not None:
        if need > gpu_bytes:
            raise DoctorError(f"-e/--max-bytes {human_bytes(config.sizes[-1])}: bench needs about "
                              f"{_gib(need)} per rank on its GPU and the smallest GPU here has {_gib(gpu_bytes)}; "
                              "give a smaller -e")
        return
    have = available_memory()
    if need * local > have:
        raise DoctorError(f"-e/--max-bytes {human_bytes(config.sizes[-1])}: bench needs about {_gib(need)} per "
                          f"rank ({local} rank{'s' if local != 1 else ''} on this host: {_gib(need * local)}) and "
                          f"this host has {_gib(have)} of memory available; give a smaller -e (or -c 0)")


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"


def _smallest_gpu_bytes(backend: str) -> int | None:
    """Memory of the smallest visible GPU when the ranks will run on GPUs (NCCL), else None."""
    if backend == "gloo":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def _foreign(long: str) -> Any:
    """A hidden option for one of nccl-tests' flags that ddpdoctor does not implement (bench.nccl_tests)."""
    flag = next(f for f in FOREIGN_FLAGS if f.long == long)
    return typer.Option(None, flag.short, flag.long, hidden=True, help=f"nccl-tests' {flag.meaning} (docs/bench.md).")


def bench(
    test: Optional[str] = typer.Argument(None, metavar="[BINARY]", help="An nccl-tests binary name "
                                         "(all_reduce_perf, all_gather_perf, ...; a path works): pick the op as "
                                         "that binary would, so a pasted nccl-tests command line runs as is."),
    op: Optional[str] = typer.Option(None, "--op", help="all_reduce (default), all_gather, reduce_scatter, "
                                     "broadcast, all_to_all, sendrecv (comma-separated), or all. (nccl-tests' --op "
                                     "is -o/--redop here.)"),
    min_bytes: str = typer.Option("1K", "-b", "--min-bytes", "--minbytes", help="Smallest size, e.g. 8, 1K, 64M."),
    max_bytes: str = typer.Option("64M", "-e", "--max-bytes", "--maxbytes", help="Largest size, e.g. 256M, 1G."),
    step_factor: Optional[float] = typer.Option(None, "-f", "--step-factor", "--stepfactor",
                                                help="Multiply the size by this each step (default 2)."),
    step_bytes: Optional[str] = typer.Option(None, "-i", "--stepbytes", help="Add this many bytes each step "
                                             "instead (nccl-tests' fixed increment, e.g. 1M)."),
    iters: int = typer.Option(20, "-n", "--iters", help="Timed iterations per size."),
    warmup: int = typer.Option(5, "-w", "--warmup", "--warmup_iters", help="Untimed warmup iterations per size."),
    dtype: str = typer.Option("float", "-d", "--dtype", "--datatype", help="float, half, bfloat16, double, int8, "
                              "uint8, int32, int64 (nccl-tests' names), a comma list, or all."),
    redop: str = typer.Option("sum", "-o", "--redop", help="Reduction of all_reduce and reduce_scatter: sum, "
                              "prod, max, min, avg, or all (nccl-tests' -o)."),
    root: int = typer.Option(0, "-r", "--root", help="Root rank of broadcast (nccl-tests' -r)."),
    check: int = typer.Option(1, "-c", "--check", help="Checked calls per size and layout, each on fresh inputs "
                              "and verified exactly (#wrong); 0: no check."),
    average: int = typer.Option(1, "-a", "--average", help="The time a row shows: 0 rank 0's, 1 the ranks' "
                                "average, 2 the fastest rank's, 3 the slowest rank's (nccl-tests' -a)."),
    blocking: int = typer.Option(0, "-z", "--blocking", help="0 non-blocking; 1 wait and barrier after each call; "
                                 "2 wait after each call; 3 as 1 with the barrier left out of the time (nccl-tests' -z)."),
    cputime: int = typer.Option(0, "-C", "--report_cputime", help="1: report the host's time to issue the calls "
                                "instead of their latency (nccl-tests' -C)."),
    timestamps: int = typer.Option(0, "-S", "--report_timestamps", help="1: add a timestamp to every row."),
    run_cycles: int = typer.Option(1, "-N", "--run_cycles", help="Run the whole sweep this many times, printing "
                                   "each (nccl-tests' -N; its 0, forever, is refused)."),
    nccl_json: Optional[str] = typer.Option(None, "-J", "--output_file", metavar="FILE.json", help="Also write "
                                            "nccl-tests' JSON document (its -J format) to FILE.json."),
    pairs: bool = typer.Option(False, "--pairs", help="Also measure sendrecv between every pair of hosts "
                               "(and ranks within a host) at the largest size; name slow hosts and links."),
    min_busbw: Optional[float] = typer.Option(None, "--min-busbw", help="Exit 1 when an op's average busbw "
                                              "(sizes >= 1 MiB, else all sizes) is below this many GB/s "
                                              "(default: 90 % of $NCCL_TESTS_MIN_BW when set, as nccl-tests)."),
    min_busbw_pct: Optional[float] = typer.Option(None, "--min-busbw-pct", help="Exit 1 when a figure (an op's "
                                                  "peak busbw, a pair's busbw) is below this % of what its path "
                                                  "should give (NIC, IB port, PCIe, NVLink; docs/bench.md). "
                                                  "Default 50."),
    warn_busbw_pct: Optional[float] = typer.Option(None, "--warn-busbw-pct", help="Warn when a figure is below "
                                                   "this % of its expected busbw (default 80)."),
    json_path: JsonOption = None,
    plot_path: Optional[str] = typer.Option(None, "--plot", help="Also plot busbw vs size to this .png, .svg "
                                            "or .pdf file (needs matplotlib: pip install 'ddpdoctor[plot]')."),
    nproc: NprocOption = None,
    backend: BackendOption = "auto",
    timeout: Annotated[float, typer.Option("--timeout", "-T", help="Seconds allowed for the rendezvous and for "
                                           "each collective call (nccl-tests' -T).")] = 60.0,
    master_port: MasterPortOption = None,
    log_dir: LogDirOption = None,
    redirects: RedirectsOption = "0",
    tee: TeeOption = "0",
    local_ranks_filter: LocalRanksFilterOption = "",
    nthreads: Optional[str] = _foreign("--nthreads"),
    ngpus: Optional[str] = _foreign("--ngpus"),
    agg_iters: Optional[str] = _foreign("--agg_iters"),
    parallel_init: Optional[str] = _foreign("--parallel_init"),
    stream_null: Optional[str] = _foreign("--stream_null"),
    cudagraph: Optional[str] = _foreign("--cudagraph"),
    local_register: Optional[str] = _foreign("--local_register"),
    cta_policy: Optional[str] = _foreign("--cta_policy"),
    device_implementation: Optional[str] = _foreign("--device_implementation"),
    device_cta_count: Optional[str] = _foreign("--device_cta_count"),
    memory: Optional[str] = _foreign("--memory"),
    unalign: Optional[str] = _foreign("--unalign"),
    per_iter_timing: Optional[str] = _foreign("--per_iter_timing"),
    per_iter_skip: Optional[str] = _foreign("--per_iter_skip"),
) -> None:
    """Bandwidth sweep like nccl-tests (algbw, busbw, #wrong; out-of-place and in-place) across ranks and nodes;
    --pairs finds slow links.

    Takes nccl-tests' flags (paste `all_reduce_perf -b 8 -e 128M -f 2 -g 1` after `ddpdoctor bench`); its
    flags for what ddpdoctor does not do (-t -g -m -p -y -G -R -x -D -V -M -u -I -K) are accepted with a
    note where the value matches how ddpdoctor runs, else refused with the reason (docs/bench.md).
    """
    from ddpdoctor.cli import invocation_args
    from ddpdoctor.runtime.entry import run_here_or_self_launch, validate_launch_options

    validate_launch_options(nproc, backend, master_port, timeout)
    notes = foreign_notes({"--nthreads": nthreads, "--ngpus": ngpus, "--agg_iters": agg_iters,
                           "--parallel_init": parallel_init, "--stream_null": stream_null, "--cudagraph": cudagraph,
                           "--local_register": local_register, "--cta_policy": cta_policy,
                           "--device_implementation": device_implementation, "--device_cta_count": device_cta_count,
                           "--memory": memory, "--unalign": unalign, "--per_iter_timing": per_iter_timing,
                           "--per_iter_skip": per_iter_skip})
    if test is not None:
        from_binary = op_from_binary(test)
        if op is not None and parse_ops(op) != [from_binary]:
            raise DoctorError(f"{test} picks {from_binary} and --op {op} picks another; give one of them")
        op = from_binary
    op = "all_reduce" if op is None else op  # `--op ''` (an unset shell variable) is refused by parse_ops, not all_reduce
    config = build_config(op, min_bytes, max_bytes, step_factor, iters, warmup, dtype, check, pairs,
                          min_busbw, json_path, plot_path, backend, timeout, redop=redop, root=root, average=average,
                          blocking=blocking, cputime=cputime, timestamps=timestamps, run_cycles=run_cycles,
                          step_bytes=step_bytes, nccl_json_path=nccl_json, argv=tuple(invocation_args()),
                          log_dir=log_dir, min_busbw_pct=min_busbw_pct, warn_busbw_pct=warn_busbw_pct)
    logs = launch_logs(log_dir, redirects, tee, local_ranks_filter, nproc)

    refuse_sizes_beyond_this_machine(config, nproc)
    _say_once(notes)

    def run_here(info: LaunchInfo) -> int:
        from ddpdoctor.bench import run_bench

        return run_bench(info, config)

    raise typer.Exit(run_here_or_self_launch(run_here, argv=invocation_args(), nproc=nproc, backend=backend,
                                             master_port=master_port, timeout=timeout, logs=logs))


def _say_once(notes: list[str]) -> None:
    """The notes on stderr, once per run: by the process the user started (not again by a self-launched rank),
    or by rank 0 under a launcher."""
    from ddpdoctor.runtime import launcher
    from ddpdoctor.runtime.selflaunch import SELF_LAUNCHED_ENV

    if not notes or os.environ.get(SELF_LAUNCHED_ENV):
        return
    info = launcher.detect()
    if info.is_launched and info.rank != 0:
        return
    for note in notes:
        typer.echo(f"ddpdoctor bench: note: {note}", err=True)


def register(app: typer.Typer) -> None:
    """Add ``bench``."""
    app.command("bench")(bench)
