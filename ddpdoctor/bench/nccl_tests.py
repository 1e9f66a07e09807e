"""nccl-tests' command line, as a user pastes it into ``ddpdoctor bench``: what each flag becomes here.

Source: NVIDIA/nccl-tests ``src/common.cu`` (its ``getopt_long`` table and usage text, v2.19.6) and
``README.md`` ("Arguments"). Most flags are implemented with nccl-tests' meaning (``-b -e -i -f -n -w -c -o -d
-r -z -a -C -S -N -J -T``); the others describe things ddpdoctor does not do (threads, several GPUs per
process, CUDA graphs, NCCL's device API...). Those are never silently ignored: a value that matches what
ddpdoctor does anyway is accepted with a one-line note, any other is refused (exit 2) with the reason.
Pure: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ddpdoctor.bench.analysis import NCCL_TESTS_BINARIES, UNMEASURED_BINARIES
from ddpdoctor.errors import DoctorError


@dataclass(frozen=True)
class ForeignFlag:
    """An nccl-tests flag ddpdoctor does not implement: what it means there, which values match what
    ddpdoctor does anyway (accepted with ``note``), and why any other value is refused."""

    short: str
    long: str
    meaning: str
    accepted: tuple[int, ...]
    note: str
    refusal: str


FOREIGN_FLAGS: tuple[ForeignFlag, ...] = (
    ForeignFlag("-t", "--nthreads", "threads per process", (1,),
                "one rank per process, no threads: how ddpdoctor always runs",
                "ddpdoctor runs one rank per process (no threads); use --nproc N for N ranks"),
    ForeignFlag("-g", "--ngpus", "GPUs per thread", (1,),
                "one GPU per rank: how ddpdoctor always runs (ranks come from --nproc or the launcher)",
                "ddpdoctor drives one GPU per rank; use --nproc N (or torchrun --nproc-per-node N) for N GPUs"),
    ForeignFlag("-m", "--agg_iters", "collectives aggregated in one NCCL group per iteration", (1,),
                "each collective is timed on its own",
                "torch.distributed has no public call that groups several collectives into one "
                "ncclGroupStart/End; each call is timed on its own"),
    ForeignFlag("-p", "--parallel_init", "initialise NCCL from several threads", (0, 1),
                "each rank is its own process and initialises its own process group",
                "takes 0 or 1"),
    ForeignFlag("-y", "--stream_null", "run on the default (null) CUDA stream", (0,),
                "torch.distributed runs collectives on its own streams",
                "torch.distributed runs collectives on its own streams; there is no null-stream mode"),
    ForeignFlag("-G", "--cudagraph", "capture the iterations as a CUDA graph and replay it", (0,),
                "no CUDA graph", "collectives captured in CUDA graphs are not measured by ddpdoctor bench"),
    ForeignFlag("-R", "--local_register", "register the buffers with NCCL (ncclCommRegister)", (0,),
                "buffers are not registered",
                "buffer registration is not reachable through torch.distributed's collectives"),
    ForeignFlag("-x", "--cta_policy", "NCCL's CTA policy for the communicator", (),
                "", "the communicator's CTA policy (ncclConfig_t) is not settable from ddpdoctor bench"),
    ForeignFlag("-D", "--device_implementation", "NCCL device-API implementations", (0,),
                "NCCL's host implementation (what torch.distributed calls)",
                "NCCL's device-API implementations are not reachable through torch.distributed"),
    ForeignFlag("-V", "--device_cta_count", "CTAs for the device-API implementation", (),
                "", "applies to -D > 0 only, which is not available here"),
    ForeignFlag("-M", "--memory", "print the GPU memory used", (0, 1),
                "no memory report is printed", "takes 0 or 1"),
    ForeignFlag("-u", "--unalign", "misalign the buffers by this many elements", (0,),
                "buffers are aligned as PyTorch allocates them",
                "misaligned buffers are not measured (PyTorch's allocator aligns every tensor)"),
    ForeignFlag("-I", "--per_iter_timing", "time every iteration with CUDA events", (0,),
                "the loop is timed as a whole, as nccl-tests times it without -I",
                "per-iteration timing is not implemented: the loop is timed as a whole (nccl-tests without -I)"),
    ForeignFlag("-K", "--per_iter_skip", "leading iterations left out of the -I summary", (0,),
                "no per-iteration summary", "needs -I 1, which is not implemented"),
)


def foreign_notes(values: Mapping[str, str | None]) -> list[str]:
    """Notes for the foreign flags given (keyed by long name), or DoctorError for a value refused."""
    notes: list[str] = []
    for flag in FOREIGN_FLAGS:
        text = values.get(flag.long)
        if text is None:
            continue
        shown = f"{flag.short}/{flag.long}"
        try:
            value = int(text.strip(), 0)
        except ValueError:
            raise DoctorError(f"{shown} takes a number (nccl-tests: {flag.meaning}), got: {text!r}") from None
        if value in flag.accepted:
            notes.append(f"{flag.short} {value}: {flag.note}")
        else:
            raise DoctorError(f"{shown} {value}: nccl-tests' {flag.meaning}: {flag.refusal}")
    return notes


def op_from_binary(test: str) -> str:
    """The op of a pasted nccl-tests binary (``./build/all_reduce_perf``, ``all_reduce_perf_mpi``)."""
    name = os.path.basename(test.strip())
    for suffix in ("_mpi",):
        name = name.removesuffix(suffix)
    if name in NCCL_TESTS_BINARIES:
        return NCCL_TESTS_BINARIES[name]
    if name in UNMEASURED_BINARIES:
        raise DoctorError(f"{name}: ddpdoctor bench does not measure {UNMEASURED_BINARIES[name]}; it measures "
                          + ", ".join(NCCL_TESTS_BINARIES))
    raise DoctorError(f"bench takes no argument but an nccl-tests binary name ({', '.join(NCCL_TESTS_BINARIES)}), "
                      f"got: {test!r}")


MIN_BW_ENV = "NCCL_TESTS_MIN_BW"
# nccl-tests fails a run whose average bus bandwidth is below 90 % of NCCL_TESTS_MIN_BW (common.cu).
MIN_BW_FRACTION = 0.9


def min_busbw_from_env(environ: Mapping[str, str]) -> tuple[float, str] | None:
    """``NCCL_TESTS_MIN_BW`` as nccl-tests reads it: the threshold (90 % of it) and how to name it."""
    text = environ.get(MIN_BW_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise DoctorError(f"{MIN_BW_ENV} must be a bandwidth in GB/s, got: {text!r}") from None
    if not (value >= 0 and value < float("inf")):
        raise DoctorError(f"{MIN_BW_ENV} must be a bandwidth in GB/s >= 0, got: {text!r}")
    return value * MIN_BW_FRACTION, f"90 % of {MIN_BW_ENV}={text}, as nccl-tests"
