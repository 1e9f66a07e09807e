"""How much `ddpdoctor watch` slows a small DDP training loop, and what one recorded collective costs.

    python benchmarks/watch_overhead.py [--rounds 3] [--steps 150]
    python benchmarks/watch_overhead.py --gpu [--rounds 2] [--steps 200]     # on a machine with a GPU
    python benchmarks/watch_overhead.py --cpu-standin [--rounds 1] [--steps 20]   # --gpu's harness, on CPU

1. A small DDP training loop (gloo, 2 ranks, one explicit all_reduce per step plus DDP's own) runs bare under
   torchrun and under `ddpdoctor watch`, alternating, ``--rounds`` times each; rank 0 prints its mean step
   time and its CPU time per step; the best and the median runs are compared (target: <= 3 % slower per
   step). The watched run has
   everything watch does: the recorder, the straggler accounting (a step boundary per optimizer step, the
   time inside collectives, medians shipped once a beat) and PyTorch's Flight Recorder, which watch turns
   on (TORCH_FR_BUFFER_SIZE=2000); the bare run has none of them.
2. One process, a 1-rank gloo group: the time of ``dist.all_reduce`` on a 1-element tensor before and after
   the recorder is installed; the difference is the recording cost per collective in microseconds; and
   the cost of one step boundary (the optimizer post-hook's bookkeeping) and of the per-step medians.

3. ``--gpu``: a small transformer (6 encoder layers, d_model 512, batch 16 x 256 tokens) trained with DDP on
   NCCL, one rank, bare under torchrun against ``watch --quiet``, alternating, with a second bare run per
   round as the noise floor; the ratio watched/bare and bare/bare, best and median. Watched, every step's
   collectives are tracked to completion with CUDA events (issue 25; target: <= 1 %). ``--cpu-standin``
   runs the same harness on gloo with a small model, to check the script on a machine without a GPU.

Every job records its own step time: rank 0 writes it to a file the harness names (watch's console, or
``--quiet``, never decides what is measured; issue 35: ``--gpu`` read the job's stdout, which ``--quiet``
keeps to itself).

The completion tracking (issue 25: what each rank issued and what completed) is part of every watched
run above; its own cost per call is printed separately in 2. Prints ratios; asserts nothing (timings on a
shared machine are noisy).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import clean_env, free_port, torchrun_cmd  # noqa: E402

LOOP = """
import sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

steps = int(sys.argv[1])
dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(16 * (steps + 8), 16), torch.randn(16 * (steps + 8), 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batches = iter(loader)
for _ in range(5):  # warm-up
    x, y = next(batches)
    opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
dist.barrier()
wall, cpu = time.perf_counter(), time.process_time()
for _ in range(steps):
    x, y = next(batches)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    logged = loss.detach().clone()
    dist.all_reduce(logged)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
if dist.get_rank() == 0:
    with open(sys.argv[2], "w") as out:  # the job's own record, whatever the console shows (watch --quiet)
        out.write(f"STEP_US {wall / steps * 1e6:.1f} CPU_US {cpu / steps * 1e6:.1f}\\n")
dist.destroy_process_group()
"""


def job_result(cmd: list[str], result: Path, env: dict[str, str], cwd: str, timeout: float = 600) -> str:
    """Run a job whose rank 0 writes its timing line into ``result`` (the job's own output: a launcher or
    ``watch --quiet`` may keep its stdout from us); that line. Each run says how long it took as it ends
    (a run cut off by the caller's deadline still leaves the earlier ones in the log)."""
    result.unlink(missing_ok=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run([*cmd, str(result)], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"run timed out after {timeout:g} s: {' '.join(cmd)}\n{_tail(exc.stdout)}\n"
                         f"{_tail(exc.stderr)}") from None
    text = result.read_text() if result.exists() else ""
    print(f"  run: {time.perf_counter() - start:.1f} s, {text.strip() or 'no result'}: {' '.join(cmd[:6])} ...",
          flush=True)
    if proc.returncode != 0 or "STEP_US" not in text:
        raise SystemExit(f"run failed ({proc.returncode}, result file {'empty' if result.exists() else 'missing'}): "
                         f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return text


def _tail(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    return (output or "")[-2000:]


def step_times(cmd: list[str], result: Path) -> tuple[float, float]:
    """(wall, CPU) microseconds per step of rank 0, as the loop records them."""
    match = re.search(r"STEP_US ([\d.]+) CPU_US ([\d.]+)", job_result(cmd, result, clean_env(), str(REPO)))
    assert match is not None  # job_result checked for STEP_US
    return float(match.group(1)), float(match.group(2))


def loop_overhead(rounds: int, steps: int, per_call_us: float) -> None:
    """Bare torchrun vs watched runs of the same DDP loop (2 ranks, gloo, a DistributedSampler, a logging
    all_reduce per step), interleaved; a second bare run per round is the noise floor. Wall time per step,
    and rank 0's CPU time per step (all its threads: gloo's, watch's watchdog): on a machine shared with
    other jobs the CPU time says what watch costs, the wall time mostly what the neighbours did."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "ddp_loop.py"
        script.write_text(LOOP)

        result = Path(folder) / "result.txt"

        def bare_run() -> tuple[float, float]:
            return step_times([*torchrun_cmd(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                               "--master-port", str(free_port()), str(script), str(steps)], result)

        def watched_run() -> tuple[float, float]:
            return step_times([sys.executable, "-m", "ddpdoctor", "watch", "--nproc", "2", str(script),
                               str(steps)], result)

        bare, watched, again = [], [], []
        for round_number in range(rounds):
            # Alternate who goes first: a machine that slows down during a round must not favour one side.
            if round_number % 2 == 0:
                bare.append(bare_run())
                watched.append(watched_run())
            else:
                watched.append(watched_run())
                bare.append(bare_run())
            again.append(bare_run())
    for index, what in ((0, "wall"), (1, "CPU")):
        for label, pick in (("best of", min), ("median of", statistics.median)):
            b, w, a = (pick(x[index] for x in runs) for runs in (bare, watched, again))
            print(f"training loop ({steps} steps, 2 ranks, gloo), {what} time, {label} {rounds}: bare {b:.0f} us/step, "
                  f"watched {w:.0f} us/step, overhead {100 * (w - b) / b:+.1f} % (noise: bare vs bare {100 * (a - b) / b:+.1f} %)")
    print(f"  runs (wall, CPU): bare {[tuple(round(v) for v in x) for x in bare]}, watched "
          f"{[tuple(round(v) for v in x) for x in watched]}, bare again {[tuple(round(v) for v in x) for x in again]}")
    # The loop makes two recorded calls per step (its logging all_reduce and DDP's backward()) and one
    # optimizer step (a step boundary).
    best = min(x[0] for x in bare)
    print(f"  expected from the per-call costs: {per_call_us:.1f} us/step = {per_call_us / best * 100:.2f} % of the best bare step")


def recording_cost(calls: int) -> float:
    """Extra microseconds per training step: one recorded all_reduce plus one recorded DDP backward."""
    import torch
    import torch.distributed as dist

    from ddpdoctor.watch import recorder as recording

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    # One intra-op thread, as torchrun gives each rank: on a shared machine torch's default (one per core)
    # spins against the other jobs and one small backward() swings between 0.3 and 30 ms.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(1)

    def per_call(fn: Callable[..., object], *args: object) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        return (time.perf_counter() - start) / calls * 1e6

    recorder = recording.install(0, 1)
    original = dist.all_reduce.__ddpdoctor_original__  # type: ignore[attr-defined]
    # The recorder alone, around a function that does nothing: no gloo noise in the difference; and the
    # same wrapper without the completion tracking (issue 25), to show what that part costs.
    maker = recording._collective_maker(recorder, "all_reduce", original)
    noop = recorder.wrap(lambda *a, **k: None, maker)
    untracked = recorder.wrap(lambda *a, **k: None, maker, lambda rec, args, result: None)
    bare, watched, wrapped, plain, empty = [], [], [], [], []
    for _ in range(7):  # alternate, keep the best of each: the machine is shared
        bare.append(per_call(original, tensor))
        watched.append(per_call(dist.all_reduce, tensor))
        wrapped.append(per_call(noop, tensor))
        plain.append(per_call(untracked, tensor))
        empty.append(per_call(lambda *a: None, tensor))
        recorder.pending.clear()
    print(f"per collective: all_reduce(float32[1]) {min(bare):.1f} us bare, {min(watched):.1f} us recorded; "
          f"the recording itself costs {min(wrapped) - min(empty):.2f} us per call, of which completion "
          f"tracking {min(wrapped) - min(plain):.2f} us")
    # An async collective's Work is tracked until the watchdog sees it complete: the poll, per in-flight Work.
    works = [dist.all_reduce(tensor, async_op=True) for _ in range(64)]
    for work in works:
        work.wait()
    tracking = recorder.completions
    for work in works:
        tracking.issued(recording.Record("all_reduce", "WORLD", None, 1, "", "", "x.py:1"), work)
    start = time.perf_counter()
    tracking.poll()
    print(f"watchdog poll (its own thread, every 100 ms): {(time.perf_counter() - start) / 64 * 1e6:.2f} us per "
          f"completed Work ({len(tracking.inflight)} left in flight)")
    # backward() of a DDP model is recorded too (as the pseudo-op naming DDP's gradient all_reduce);
    # the flag the DDP constructor wrapper sets switches that recording on and off.
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
    x = torch.randn(8, 16)

    def backward_us(record: bool) -> float:
        recorder.uses_ddp = record
        total = 0.0
        for _ in range(calls // 4):
            loss = model(x).sum()
            start = time.perf_counter()
            loss.backward()
            total += time.perf_counter() - start
        recorder.pending.clear()
        return total / (calls // 4) * 1e6

    plain, recorded = [], []
    for _ in range(7):
        plain.append(backward_us(False))
        recorded.append(backward_us(True))
    print(f"per DDP backward(): {min(plain):.1f} us plain, {min(recorded):.1f} us recorded "
          f"(+{min(recorded) - min(plain):.1f} us)")
    # Straggler accounting: one step boundary per optimizer step (the global post-hook), and the medians
    # the watchdog thread computes once per beat (off the training thread, shown for completeness).
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    hooked = []
    for _ in range(7):
        hooked.append(per_call(optimizer.step))
    boundary = per_call(recorder.mark_step, "optimizer")
    stats = per_call(recorder.step_stats)
    print(f"per optimizer step: {min(hooked):.1f} us for SGD.step() with the hook; the step boundary itself "
          f"{boundary:.2f} us; the per-step medians (watchdog thread, once a beat) {stats:.1f} us")
    completion_tracking(recorder, model, x)
    dist.destroy_process_group()
    return max(0.0, min(watched) - min(bare)) + max(0.0, min(recorded) - min(plain)) + boundary


def completion_tracking(recorder: Any, model: Any, x: Any, blocks: int = 20, steps: int = 40) -> None:
    """Issue 25's completion tracking alone, in one process, against the same loop without it: a DDP
    training step (backward, optimizer step, a logging all_reduce, an async all_reduce and its wait), in
    rotating blocks with the tracking on (and a thread polling in-flight Works every 100 ms, as the
    watchdog does), off (every tracking call a no-op), and off again (the noise floor); each block is
    compared with its neighbour, and the median of those ratios is printed."""
    import statistics
    import threading

    import torch
    import torch.distributed as dist

    tracking = recorder.completions
    names = ("issued", "completed", "waited", "backward_done")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    recorder.uses_ddp = True
    stop = threading.Event()

    def poller() -> None:
        while not stop.wait(0.1):
            tracking.poll()

    def block() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            dist.all_reduce(logged, async_op=True).wait()
        recorder.pending.clear()
        return (time.perf_counter() - start) / steps * 1e6

    block()  # warm-up, counted on neither side
    on, off, off_again = [], [], []
    for index in range(3 * blocks):
        tracked = index % 3 == 0
        if index % 3 == 2:  # the noise floor: the same loop without tracking, against itself
            off_again.append(block())
        elif tracked:
            for name in names:
                tracking.__dict__.pop(name, None)
            stop.clear()
            thread = threading.Thread(target=poller, daemon=True)
            thread.start()
            on.append(block())
            stop.set()
            thread.join()
        else:
            for name in names:
                setattr(tracking, name, lambda *args, **kwargs: None)
            off.append(block())
    for name in names:
        tracking.__dict__.pop(name, None)
    # Each block against its neighbour: the machine's load drifts over seconds, a pair shares it.
    paired = statistics.median(w / wo for w, wo in zip(on, off, strict=True))
    noise = statistics.median(a / b for a, b in zip(off_again, off, strict=True))
    print(f"completion tracking, one rank, DDP step with 3 recorded calls ({blocks} blocks of {steps} steps "
          f"each way): overhead {100 * (paired - 1):+.2f} % (median of the block pairs' ratios; target <= 3 %; "
          f"noise: without vs without {100 * (noise - 1):+.2f} %); best {min(off):.0f} us/step without, "
          f"{min(on):.0f} us/step with ({100 * (min(on) / min(off) - 1):+.2f} %)")
    print(f"  blocks: without {[round(v) for v in off]}, with {[round(v) for v in on]}, "
          f"without again {[round(v) for v in off_again]}")


FR_PROBE = """
import sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
t = torch.ones(1)
best = 1e9
for _ in range(7):
    start = time.perf_counter()
    for _ in range(2000):
        dist.all_reduce(t)
    best = min(best, (time.perf_counter() - start) / 2000 * 1e6)
print(best)
"""


def flight_recorder_cost(rounds: int = 3) -> None:
    """watch turns PyTorch's Flight Recorder on (TORCH_FR_BUFFER_SIZE=2000): its cost per collective, from
    two fresh 1-rank processes (torch reads the variable when the group is created), interleaved."""
    off: list[float] = []
    on: list[float] = []
    for _ in range(rounds):
        for size, into in ((None, off), ("2000", on)):
            env = {k: v for k, v in clean_env().items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
            if size:
                env["TORCH_FR_BUFFER_SIZE"] = size
            proc = subprocess.run([sys.executable, "-c", FR_PROBE, str(free_port())], capture_output=True, text=True,
                                  timeout=300, env=env)
            into.append(float(proc.stdout.strip().splitlines()[-1]))
    print(f"per collective with the Flight Recorder on: all_reduce(float32[1]) {min(off):.1f} us off, "
          f"{min(on):.1f} us on (+{min(on) - min(off):.1f} us)")


TRANSFORMER = """
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(sys.argv[1])
if os.environ.get("OVERHEAD_DEVICE", "cuda") == "cuda":
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=device)
    d_model, layers, batch, tokens = 512, 6, 16, 256
else:  # --cpu-standin: the same harness on gloo with a small model, to check the script without a GPU
    device = torch.device("cpu")
    dist.init_process_group("gloo")
    d_model, layers, batch, tokens = 64, 2, 4, 32
layer = torch.nn.TransformerEncoderLayer(d_model=d_model, nhead=8, dim_feedforward=4 * d_model, batch_first=True)
model = DDP(torch.nn.TransformerEncoder(layer, num_layers=layers).to(device),
            device_ids=[device.index] if device.type == "cuda" else None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(batch, tokens, d_model, device=device)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def step():
    opt.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    logged = loss.detach()
    dist.all_reduce(logged)  # the usual logging all_reduce: recorded, tracked to completion


for _ in range(10):
    step()
sync()
start = time.perf_counter()
for _ in range(steps):
    step()
sync()
if dist.get_rank() == 0:
    with open(sys.argv[2], "w") as out:  # the job's own record: `watch --quiet` keeps the job's stdout to itself
        out.write(f"STEP_US {(time.perf_counter() - start) / steps * 1e6:.1f}\\n")
dist.destroy_process_group()
"""


def gpu_overhead(rounds: int, steps: int, device: str = "cuda", run_timeout: float = 600) -> None:
    """A transformer DDP step on one GPU (NCCL): bare torchrun against ``watch --quiet``, alternating who
    goes first, and a second bare run per round as the noise floor (bare against bare). The step time is
    what the job itself records (rank 0 writes it to a file), not what a console shows. ``device="cpu"``
    runs the same harness on gloo with a small model (``--cpu-standin``): the figures then say nothing
    about a GPU step, only that the harness works. Each run is bounded by ``run_timeout`` seconds.

    Most of a run is start-up (torch's import, NCCL's init), the same on both sides; more steps per run
    cost little and steady the mean, so the GPU suite runs one round of 300 steps rather than many short
    rounds (its first H100 run, two rounds of 100, did not finish in 100 s)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "transformer_ddp.py"
        script.write_text(TRANSFORMER)
        result = Path(folder) / "result.txt"
        env = clean_env({"CUDA_VISIBLE_DEVICES": "0", "OVERHEAD_DEVICE": device})

        def run(cmd: list[str]) -> float:
            match = re.search(r"STEP_US ([\d.]+)", job_result([*cmd, str(script), str(steps)], result, env, folder,
                                                              run_timeout))
            assert match is not None  # job_result checked for STEP_US
            return float(match.group(1))

        def bare_cmd() -> list[str]:
            return [*torchrun_cmd(), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                    "--master-port", str(free_port())]

        def watch_cmd() -> list[str]:
            return [sys.executable, "-m", "ddpdoctor", "watch", "--nproc", "1", "--quiet"]

        bare: list[float] = []
        watched: list[float] = []
        again: list[float] = []
        for round_number in range(rounds):
            order = ((bare, bare_cmd), (watched, watch_cmd)) if round_number % 2 == 0 else \
                ((watched, watch_cmd), (bare, bare_cmd))
            for into, make in order:
                into.append(run(make()))
            again.append(run(bare_cmd()))
    what = "GPU transformer DDP step (NCCL" if device == "cuda" else "CPU STAND-IN for the GPU step (gloo, small model"
    for label, pick in (("best", min), ("median", statistics.median)):
        b, w, a = pick(bare), pick(watched), pick(again)
        print(f"{what}, 1 rank, {steps} steps), {label} of {rounds}: bare {b:.0f} us/step, watched {w:.0f} us/step, "
              f"watched/bare {w / b:.4f} ({100 * (w - b) / b:+.2f} %; target <= +1 %); noise floor bare/bare "
              f"{a / b:.4f} ({100 * (a - b) / b:+.2f} %)")
    print(f"  runs (us/step): bare {[round(x) for x in bare]}, watched {[round(x) for x in watched]}, "
          f"bare again {[round(x) for x in again]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--run-timeout", type=float, default=600, help="seconds one job run may take (--gpu)")
    parser.add_argument("--gpu", action="store_true", help="the transformer DDP step on one GPU (NCCL) instead")
    parser.add_argument("--cpu-standin", action="store_true",
                        help="--gpu's harness on gloo with a small model (checks the script; no GPU figures)")
    args = parser.parse_args()
    if args.gpu or args.cpu_standin:
        gpu_overhead(args.rounds or 2, args.steps or 200, "cpu" if args.cpu_standin else "cuda", args.run_timeout)
        return
    args.rounds, args.steps = args.rounds or 3, args.steps or 150
    per_call = recording_cost(args.calls)
    flight_recorder_cost()
    loop_overhead(args.rounds, args.steps, per_call)


if __name__ == "__main__":
    main()
