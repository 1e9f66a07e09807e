"""`ddpdoctor bench`: nccl-tests-style bandwidth sweep on every rank; rank 0 prints the table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from ddpdoctor.bench import (
    BenchConfig,
    bytes_per_rank,
    check_plot_available,
    human_bytes,
    min_row_bytes,
    parse_dtype,
    parse_ops,
    parse_size,
    size_sweep,
)
from ddpdoctor.commands.options import (
    BackendOption,
    JsonOption,
    MasterPortOption,
    NprocOption,
    TimeoutOption,
    validate_min_busbw,
)
from ddpdoctor.errors import DoctorError
from ddpdoctor.outputs import PLOT, Plan, json_to_stdout

if TYPE_CHECKING:
    from ddpdoctor.runtime.launcher import LaunchInfo


# Iterations per size: nccl-tests runs 20; a million already takes hours at 1 GiB, more never ends.
MAX_ITERS = 1_000_000


def build_config(op: str, min_bytes: str, max_bytes: str, step_factor: float, iters: int, warmup: int,
                 dtype: str, check: int, pairs: bool, min_busbw: float | None, json_path: str | None,
                 plot_path: str | None, backend: str, timeout: float) -> BenchConfig:
    """Options -> BenchConfig; DoctorError (exit 2, one line) for anything malformed."""

    ops = parse_ops(op)
    sizes = size_sweep(parse_size(min_bytes, "-b/--min-bytes"), parse_size(max_bytes, "-e/--max-bytes"),
                       step_factor)
    smallest, why = min_row_bytes(ops, parse_dtype(dtype), 1)
    if sizes[0] < smallest:
        raise DoctorError(f"-b/--min-bytes {human_bytes(sizes[0])} measures nothing: {why}; give -b {smallest} "
                          "or more")
    if not 1 <= iters <= MAX_ITERS:
        raise DoctorError(f"-n/--iters must be in 1-{MAX_ITERS}, got: {iters}")
    if not 0 <= warmup <= MAX_ITERS:
        raise DoctorError(f"-w/--warmup must be in 0-{MAX_ITERS}, got: {warmup}")
    if check not in (0, 1):
        raise DoctorError(f"-c/--check takes 0 (off) or 1 (on), got: {check}")
    validate_min_busbw(min_busbw)
    if json_to_stdout(plot_path):
        raise DoctorError("--plot takes a file name (.png, .svg or .pdf); - (stdout) is for --json")
    plan = Plan("bench")
    plan.json("--json", json_path)
    plan.file("--plot", plot_path, PLOT)
    if plot_path is not None:
        check_plot_available()
    return BenchConfig(ops=tuple(ops), sizes=tuple(sizes), iters=iters, warmup=warmup, dtype=parse_dtype(dtype),
                       check=bool(check), pairs=pairs, min_busbw_gbps=min_busbw, json_path=json_path,
                       plot_path=plot_path, backend=backend, timeout_s=timeout,
                       op_label="all" if len(ops) > 1 and op.strip().lower() == "all" else ",".join(ops))


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
    smallest, why = min_row_bytes(config.ops, config.dtype, world)
    if config.sizes[0] < smallest:
        raise DoctorError(f"-b/--min-bytes {human_bytes(config.sizes[0])} measures nothing: {why}; give "
                          f"-b {smallest} or more")
    need = bytes_per_rank(config.ops, max(config.sizes[-1], config.pair_bytes if config.pairs else 0),
                          config.dtype, config.check)
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


def bench(
    op: str = typer.Option("all_reduce", "--op", help="all_reduce, all_gather, reduce_scatter, broadcast, "
                           "all_to_all, sendrecv (comma-separated), or all."),
    min_bytes: str = typer.Option("1K", "-b", "--min-bytes", help="Smallest size, e.g. 8, 1K, 64M."),
    max_bytes: str = typer.Option("64M", "-e", "--max-bytes", help="Largest size, e.g. 256M, 1G."),
    step_factor: float = typer.Option(2.0, "-f", "--step-factor", help="Multiply the size by this each step."),
    iters: int = typer.Option(20, "-n", "--iters", help="Timed iterations per size."),
    warmup: int = typer.Option(5, "-w", "--warmup", help="Untimed warmup iterations per size."),
    dtype: str = typer.Option("float", "-d", "--dtype", help="float, half, bfloat16, double, int8, uint8, "
                              "int32, int64."),
    check: int = typer.Option(1, "-c", "--check", help="1: verify every result exactly (#wrong); 0: skip."),
    pairs: bool = typer.Option(False, "--pairs", help="Also measure sendrecv between every pair of hosts "
                               "(and ranks within a host) at the largest size; name slow hosts and links."),
    min_busbw: Optional[float] = typer.Option(None, "--min-busbw", help="Exit 1 when an op's average busbw "
                                              "(sizes >= 1 MiB, else all sizes) is below this many GB/s."),
    json_path: JsonOption = None,
    plot_path: Optional[str] = typer.Option(None, "--plot", help="Also plot busbw vs size to this .png, .svg "
                                            "or .pdf file (needs matplotlib: pip install 'ddpdoctor[plot]')."),
    nproc: NprocOption = None,
    backend: BackendOption = "auto",
    timeout: TimeoutOption = 60.0,
    master_port: MasterPortOption = None,
) -> None:
    """Bandwidth sweep like nccl-tests (algbw, busbw, #wrong) across ranks and nodes; --pairs finds slow links."""
    from ddpdoctor.cli import invocation_args
    from ddpdoctor.runtime.entry import run_here_or_self_launch, validate_launch_options

    validate_launch_options(nproc, backend, master_port, timeout)
    config = build_config(op, min_bytes, max_bytes, step_factor, iters, warmup, dtype, check, pairs,
                          min_busbw, json_path, plot_path, backend, timeout)

    refuse_sizes_beyond_this_machine(config, nproc)

    def run_here(info: LaunchInfo) -> int:
        from ddpdoctor.bench import run_bench

        return run_bench(info, config)

    raise typer.Exit(run_here_or_self_launch(run_here, argv=invocation_args(), nproc=nproc, backend=backend,
                                             master_port=master_port, timeout=timeout))


def register(app: typer.Typer) -> None:
    """Add ``bench``."""
    app.command("bench")(bench)
