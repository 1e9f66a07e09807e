"""Throughput and memory of `ddpdoctor explain` on a large generated log (target: >= 150 MB/s, flat RSS;
>= 250 MB/s on a single family of lines, issue 33).

Usage: python benchmarks/explain_throughput.py [SIZE_MB] [--realistic] (default 1024 MB), or
``--families [SIZE_MB]`` (each common line family alone and a mix, see ``families``; default 25 MB a family,
4 x that for the mix), or ``--pathological`` (hostile long lines against a plain log, see ``pathological``).

* default: a multi-rank log of training step lines, NCCL INFO chatter, Python traceback frames and a few
  real error lines spread through it;
* ``--realistic``: what a healthy-but-noisy multi-node job really prints (``realistic_lines``): glog-style
  PyTorch warnings and infos (``[W1122 ...`` / ``I1122 ...``, torchrun's agent lines), ``NCCL_DEBUG=INFO``
  start-up lines, c10d's retried connect warnings, tqdm progress bars (``\\r``-separated updates), Python
  ``UserWarning``s, wandb/urllib3 HTTP retries, ``[rankN]:``-prefixed training output, and every ~100 MB one
  real error block (``ERROR_BLOCKS``). The old keyword prefilter let most glog lines through on such logs.

Writes the log into a temporary directory, scans it with the same engine the CLI uses, and prints MB/s,
peak RSS before and after, and what was found. It prints numbers; it does not assert timings (machines
differ). ``tests/explain/test_explain.py`` reuses ``realistic_lines`` / ``ERROR_BLOCKS`` for correctness.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from ddpdoctor.explain import Scanner
from ddpdoctor.explain.prefilter import build_prefilter
from ddpdoctor.explain.templates import TemplateMatcher

# Real texts (see tests/explain/test_explain.py for where each comes from), sprinkled so the matcher does real work.
_ERRORS = [
    "[rank3]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) "
    "ran for 600081 milliseconds before timing out.",
    "[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
    "closed by peer [127.0.0.1]:36999. This is typically caused by a remote worker crashing.",
    "[rank2]: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your module has parameters that were not used in producing loss.",
    "[rank2]: Parameter indices which did not receive grad for rank 2: 362 363 364 365",
]

# One real error block per kind, as it appears inside a noisy log (texts from PyTorch/NCCL sources and the
# issue threads cited in tests/explain/test_explain.py). Each block alone yields exactly its one diagnosis.
ERROR_BLOCKS: dict[str, str] = {
    "cuda-oom": """\
[rank5]: Traceback (most recent call last):
[rank5]:   File "/workspace/train.py", line 212, in <module>
[rank5]:     loss = model(batch).loss
[rank5]:   File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1553, in _wrapped_call_impl
[rank5]:     return self._call_impl(*args, **kwargs)
[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use.
""",
    "unused-parameters": """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/workspace/train.py", line 230, in <module>
[rank2]:     out = ddp_model(batch)
[rank2]: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss. You can enable unused parameter detection by passing the keyword argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by
[rank2]: making sure all `forward` function outputs participate in calculating loss.
[rank2]: Parameter indices which did not receive grad for rank 2: 362 363 364 365
""",
    "nccl-timeout": """\
[rank1]:[E1122 03:37:01.832146912 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.
[rank1]:[E1122 03:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.
[rank1]:[E1122 03:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.
""",
    "port-in-use": """\
[W1122 03:40:12.105000000 socket.cpp:462] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).
[W1122 03:40:12.105000000 socket.cpp:462] [c10d] The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).
[E1122 03:40:12.105000000 socket.cpp:500] [c10d] The server socket has failed to listen on any local network address.
""",
    "duplicate-gpu": """\
node-b:20312:20390 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 3 and rank 2 both on CUDA device 1b000
node-b:20312:20390 [0] NCCL INFO init.cc:1247 -> 5
""",
}

_HOSTS = ("node-a", "node-b")
_OPS = ("ALLREDUCE", "BROADCAST", "ALLGATHER", "REDUCE_SCATTER")


def _glog(rng: random.Random, level: str, where: str, text: str, rank_prefix: bool) -> str:
    t = f"{level}1122 {rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**9):09d}"
    if rank_prefix:  # a worker's c10d line under torchrun: "[rank3]:[W1122 ... file.cpp:123] text"
        return f"[rank{rng.randrange(8)}]:[{t} {where}] {text}"
    return f"{t} {rng.randrange(1000, 99999)} {where}] {text}"  # torchrun agent's Python logging, glog format


def _healthy_line(i: int, rng: random.Random) -> str:
    """One line (without newline) of the kind a healthy multi-node job prints, chosen by weight."""
    r = rng.randrange(100)
    rank = rng.randrange(8)
    host = _HOSTS[rank // 4]
    pid = 4000 + rank
    if r < 30:  # training output under torchrun
        return (f"[rank{rank}]: epoch {i // 50000} step {i % 50000}/50000 | loss {rng.random() * 3:.4f} | lr "
                f"{rng.random() * 1e-3:.2e} | grad_norm {rng.random() * 2:.3f} | tokens/s {rng.randrange(40000, 60000)}")
    if r < 52:  # NCCL_DEBUG=INFO
        kind = rng.randrange(10)
        head = f"{host}:{pid}:{pid + 70} [{rank % 4}] NCCL INFO "
        if kind < 4:
            return (head + f"Channel {rng.randrange(32):02d}/0 : {rank}[{rank % 4}] -> {(rank + 1) % 8}"
                    f"[{(rank + 1) % 4}] via P2P/CUMEM/read")
        if kind < 6:
            return head + (f"comm 0x55d1c7f0{rng.randrange(1000):03d} rank {rank} nranks 8 cudaDev {rank % 4} "
                           f"nvmlDev {rank % 4} busId {rank % 4 + 1}b000 commId 0x8e3c1a2b - Init COMPLETE")
        return head + rng.choice((
            "NCCL_SOCKET_IFNAME set by environment to eth0",
            "Bootstrap : Using eth0:10.0.0.11<0>",
            "NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory "
            "No plugin found (libnccl-net.so), using internal implementation",
            "Failed to open libibverbs.so[.1]",
            "NET/IB : No device found.",
            "NET/Socket : Using [0]eth0:10.0.0.11<0>",
            "Using network Socket",
            "cudaDriverVersion 12040",
            "Setting affinity for GPU 3 to ffff,ffffffff",
            "Trees [0] 4/-1/-1->3->2 [1] 4/-1/-1->3->2",
            "P2P Chunksize set to 524288",
            "Connected all rings",
            "Connected all trees",
            "threadThresholds 8/8/64 | 64/8/64 | 512 | 512",
            "Allocated 4194656 bytes of shared memory in /dev/shm/nccl-8rVB6h",
            "TUNER/Plugin: Failed to find ncclTunerPlugin_v2, using internal tuner instead.",
            "[Service thread] Connection closed by localRank 1",
            f"comm 0x55d1c7f0 rank {rank} nranks 8 cudaDev {rank % 4} busId 11000 - Destroy COMPLETE",
        ))
    if r < 70:  # glog-style lines from c10d / ProcessGroupNCCL / reducer / torchrun's agent
        kind = rng.randrange(9)
        if kind == 0:
            return _glog(rng, "W", "ProcessGroupNCCL.cpp:4115", "Warning: Guessing device ID based on global rank. "
                         "This can cause a hang if rank to GPU mapping is heterogeneous. You can specify "
                         "device_id in init_process_group() (function operator())", True)
        if kind == 1:
            return _glog(rng, "I", "ProcessGroupNCCL.cpp:913", f"[PG ID 0 PG GUID 0 Rank {rank}] ProcessGroupNCCL "
                         f"initialization options: size: 8, global rank: {rank}, TIMEOUT(ms): 600000, "
                         "USE_HIGH_PRIORITY_STREAM: 0, SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: 0", True)
        if kind == 2:
            return _glog(rng, "I", "ProcessGroupNCCL.cpp:922", f"[PG ID 0 PG GUID 0 Rank {rank}] ProcessGroupNCCL "
                         "environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 3, "
                         "TORCH_NCCL_DUMP_ON_TIMEOUT: 0, TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC: 60000, "
                         "TORCH_NCCL_DESYNC_DEBUG: 0, TORCH_NCCL_ENABLE_TIMING: 0, TORCH_NCCL_BLOCKING_WAIT: 0", True)
        if kind == 3:
            return _glog(rng, "W", "reducer.cpp:1400", "Warning: Grad strides do not match bucket view strides. "
                         "This may indicate grad was not created according to the gradient layout contract, or "
                         "that the param's strides changed since DDP was constructed.  This is not an error, "
                         "but may impair performance. (function operator())", True)
        if kind == 4:
            return _glog(rng, "W", "torch/distributed/run.py:793", "Setting OMP_NUM_THREADS environment variable "
                         "for each process to be 1 in default, to avoid your system being overloaded, please "
                         "further tune the variable for optimal performance in your application as needed.", False)
        if kind == 5:
            return _glog(rng, "I", "torch/distributed/elastic/agent/server/api.py:525", "[default] Rendezvous "
                         f"complete for workers. Result:\n  restart_count=0\n  master_addr={host}\n  "
                         "master_port=29500\n  group_rank=0\n  group_world_size=2".replace("\n", " "), False)
        if kind == 6:
            return _glog(rng, "I", "torch/distributed/elastic/agent/server/local_elastic_agent.py:301",
                         "[default] Starting worker group", False)
        if kind == 7:
            return _glog(rng, "W", "CUDAAllocatorConfig.h:28", "Warning: expandable_segments not supported on "
                         "this platform (function operator())", True)
        return _glog(rng, "W", "ProcessGroupNCCL.cpp:1250", "Warning: WARNING: process group has NOT been "
                     "destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application "
                     "should call destroy_process_group to ensure that any pending NCCL operations have finished "
                     "in this process. (function operator())", True)
    if r < 71:  # c10d retrying the store while rank 0 starts: warnings, not failures (1% of lines is a lot)
        if rng.randrange(2):
            return _glog(rng, "W", "socket.cpp:663", f"[c10d] The client socket has failed to connect to "
                         f"[{_HOSTS[0]}]:29500 (errno: 111 - Connection refused).", False)
        return _glog(rng, "W", "TCPStore.cpp:343", f"[c10d] TCP client failed to connect/validate to host "
                     f"{_HOSTS[0]}:29500 - retrying (try={rng.randrange(5)}, timeout=1800000ms, delay=496ms): "
                     f"The client socket has failed to connect to [{_HOSTS[0]}]:29500 (errno: 111 - Connection "
                     "refused).", False)
    if r < 79:  # tqdm progress: many \r-separated updates, one newline at the end
        n = rng.randrange(2, 6)
        return "\r".join(f"Epoch 1:  {k * 100 // 5000:3d}%|{'█' * (k * 10 // 5000):<10}| {k}/5000 "
                         f"[{k // 60:02d}:{k % 60:02d}<12:00,  {rng.random() * 4:.2f}it/s, loss={rng.random():.3f}]"
                         for k in range(i % 4000, i % 4000 + n))
    if r < 85:  # wandb / urllib3 retrying an HTTP upload
        return rng.choice((
            "WARNING:urllib3.connectionpool:Retrying (Retry(total=4, connect=None, read=None, redirect=None, "
            "status=None)) after connection broken by 'ProtocolError('Connection aborted.', ConnectionResetError("
            "104, 'Connection reset by peer'))': /api/v1/runs",
            "wandb: Network error (ConnectionError), entering retry loop.",
            "wandb: WARNING Serializing object of type dict that is 2361912 bytes",
            f"wandb: 429 encountered (Filestream rate limit exceeded, retrying in {rng.randrange(2, 60)} seconds.)",
        ))
    if r < 91:  # Python warnings, as warnings.showwarning prints them
        return rng.choice((
            "/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py:558: UserWarning: This "
            "DataLoader will create 16 worker processes in total. Our suggested max number of worker in current "
            "system is 8, which is smaller than what this DataLoader is going to create.",
            "  warnings.warn(_create_warning_msg(",
            "/workspace/train.py:88: FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
            "`torch.amp.GradScaler('cuda', args...)` instead.",
            "/opt/conda/lib/python3.10/site-packages/torch/_dynamo/eval_frame.py:600: UserWarning: "
            "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.",
        ))
    if r < 97:  # evaluation and mixed-precision chatter
        return rng.choice((
            f"[rank0]: val | epoch {i // 50000} | loss {rng.random():.4f} | error rate {rng.random() / 10:.3f} "
            f"| accuracy {0.9 + rng.random() / 10:.4f}",
            "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
            f"[rank0]: saved checkpoint to /ckpt/step_{i}.pt in 4.2 s",
        ))
    if rng.randrange(20):  # torchrun's banner
        return "*****************************************"
    return rng.choice((  # a healthy exit
        "I1122 01:39:40.561000 1000 torch/distributed/elastic/agent/server/api.py:932] Local worker group "
        "finished (WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish",
        "[rank3]: Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3b2c1d5e50>",
    ))


def realistic_lines(count: int, seed: int = 0) -> Iterator[str]:
    """``count`` healthy-but-noisy lines (each ending in a newline); deterministic for a seed."""
    rng = random.Random(seed)
    for i in range(count):
        yield _healthy_line(i, rng) + "\n"


def _noise_line(i: int, rng: random.Random) -> str:
    k = i % 10
    if k < 6:
        return (f"[rank{i % 8}]:[2026-11-22 01:39:{i % 60:02d}] step {i} loss {rng.random():.5f} lr 3.0e-4 "
                f"grad_norm {rng.random():.3f} throughput 1234.5 tokens/s\n")
    if k < 9:
        return (f"node-a:{1000 + i % 8}:{2000 + i % 8} [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : "
                f"{i % 8}[{i % 8}] -> {(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read\n")
    return f'  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line {i % 2000}, in _call_impl\n'


def generate(path: str, size_bytes: int, realistic: bool = False) -> int:
    """Write about ``size_bytes`` of log to ``path`` in ~4 MB pieces (flat memory here too)."""
    if realistic:
        # 8 different pieces, cycled: enough variety that nothing depends on one repeated piece.
        pieces = ["".join(realistic_lines(25000, seed)).encode() for seed in range(8)]
        errors = [block.encode() for block in ERROR_BLOCKS.values()]
    else:
        rng = random.Random(0)
        pieces = ["".join(_noise_line(i, rng) for i in range(40000)).encode()]
        errors = [("\n".join(_ERRORS) + "\n").encode()]
    written = 0
    n = 0
    with open(path, "wb") as fh:
        while written < size_bytes:
            piece = pieces[n % len(pieces)]
            fh.write(piece)
            written += len(piece)
            n += 1
            if written // 100_000_000 != (written - len(piece)) // 100_000_000:  # a real error every ~100 MB
                block = errors[(written // 100_000_000) % len(errors)]
                fh.write(block)
                written += len(block)
    return written


def plain_ways(path: str) -> list[tuple[str, float]]:
    """Seconds the plain ways take over the same file, measured in the same run (the page cache is warm for all).

    * ``grep -c`` with the error words a user would grep for (GNU grep, a C scanner with Boyer-Moore);
    * a plain Python loop over the file's lines testing the same words (what a script would do).
    """
    out: list[tuple[str, float]] = []
    words = (b"Error", b"NCCL WARN", b"Watchdog", b"exitcode")
    if shutil.which("grep"):
        t0 = time.perf_counter()
        grep = ["grep", "-c", "-F", *(a for w in words for a in ("-e", w.decode())), path]
        # Output to a pipe, not /dev/null: GNU grep stops at the first match when it sees /dev/null.
        subprocess.run(grep, capture_output=True, check=False, timeout=600, env={**os.environ, "LC_ALL": "C"})
        out.append(("grep -c -F -e Error -e 'NCCL WARN' -e Watchdog -e exitcode", time.perf_counter() - t0))
    t0 = time.perf_counter()
    hits = 0
    with open(path, "rb") as fh:
        for line in fh:
            if any(w in line for w in words):
                hits += 1
    out.append(("python `for line in f: if any(word in line ...)`", time.perf_counter() - t0))
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    realistic = "--realistic" in sys.argv[1:]
    size_mb = int(args[0]) if args else 1024
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-explain-perf-") as tmp:
        path = os.path.join(tmp, "train.log")
        t0 = time.perf_counter()
        size = generate(path, size_mb * 1_000_000, realistic)
        kind = "realistic (noisy, healthy + a few real errors)" if realistic else "synthetic"
        print(f"generated {size / 1e6:,.0f} MB {kind} log in {time.perf_counter() - t0:.1f} s: {path}")
        scanner = Scanner()
        rss_before = peak_rss_mb()
        t0 = time.perf_counter()
        with open(path, "rb") as fh:
            scanner.scan(path, fh)
        elapsed = time.perf_counter() - t0
        result = scanner.result()
        rss_after = peak_rss_mb()
        plain = plain_ways(path)
    rate = scanner.bytes_scanned / 1e6 / elapsed
    print(f"scanned {scanner.bytes_scanned / 1e6:,.0f} MB, {scanner.lines_scanned:,} lines in {elapsed:.2f} s: "
          f"{rate:,.0f} MB/s (target >= 150 MB/s)")
    for name, seconds in plain:
        plain_rate = size / 1e6 / seconds
        print(f"  plain way, same file: {name}: {plain_rate:,.0f} MB/s; explain runs at {rate / plain_rate:.2f}x that")
    print(f"peak RSS: {rss_before:,.0f} MB before the scan, {rss_after:,.0f} MB after "
          f"(growth {rss_after - rss_before:,.0f} MB for a {size / 1e6:,.0f} MB file)")
    for d in result.diagnoses:
        print(f"  found {d.id}: {d.count} lines, ranks {sorted(d.ranks)}")


def pathological(size_mb: int = 8) -> None:
    """``--pathological``: lines built to make backtracking regexes quadratic, against a plain log of the same size.

    Issue 20: one 512 KB line of ``NCCL error `` took 22 s (``NCCL error.*internal error`` tried every start
    and scanned to the end). Each case is a file of ``size_mb`` MB made of one repeated piece, as 1 MB lines
    (every one of them a keyword line, so each is matched on its head and tail windows); the scan rate is
    printed next to a plain noisy log's, and the ratio should stay near 1 (not fall with the line length).
    """
    cases = {"plain noisy log": None, "NCCL error ": b"NCCL error ", "TensorShape=[": b"TensorShape=[",
             "DistributedDataParallel device_ids and output_device arguments only work with ":
             b"DistributedDataParallel device_ids and output_device arguments only work with ",
             "[rank1]: RuntimeError: ": b"[rank1]: RuntimeError: ", "spaces": b" ", "digits": b"7", "colons": b":"}
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-explain-patho-") as tmp:
        for name, piece in cases.items():
            path = os.path.join(tmp, "case.log")
            if piece is None:
                generate(path, size_mb * 1_000_000)
            else:
                line = (piece * ((1 << 20) // len(piece) + 1))[:1 << 20] + b"\n"
                with open(path, "wb") as fh:
                    for _ in range(size_mb):
                        fh.write(line)
            scanner = Scanner()
            t0 = time.perf_counter()
            with open(path, "rb") as fh:
                scanner.scan(path, fh)
            rates[name] = scanner.bytes_scanned / 1e6 / (time.perf_counter() - t0)
    plain = rates["plain noisy log"]
    for name, rate in rates.items():
        print(f"  {name[:40]!r:44} {rate:8,.0f} MB/s  ({rate / plain:.2f}x the plain log)")


# --- one family of healthy lines at a time (issue 26) ------------------------------------------------------
# Issue 26 measured these alone, before its prefilter work: 25 MB of heartbeat lines at 14 MB/s, trainer lines
# at 101, NCCL INFO at 103, HF-Trainer dicts at 75, a 100 MB mix of the four at 37 MB/s, where `grep -E` read
# the mix at 1.8 GB/s. A log of one family is the worst case for that family: every line pays for whatever the
# prefilter does with its bytes.

def heartbeat(i: int) -> str:
    """ProcessGroupNCCL's glog line under torchrun, as issue 26 quotes it."""
    r = i % 8
    return (f"[rank{r}]:[I501 10:00:00.{i % 1000000:06d}659 ProcessGroupNCCL.cpp:1538] [PG ID 0 PG GUID "
            f"0(default_pg) Rank {r}] ProcessGroupNCCL heart beat monitor thread joined.\n")


def trainer(i: int) -> str:
    """A training script's logging line (Python logging's default-ish format)."""
    return (f"2024-05-01 10:00:{i % 60:02d},{i % 1000:03d} - INFO - train.py:212 - epoch 3 step {i} loss "
            f"2.{i % 9999:04d} lr 3.0e-4 grad_norm 0.8{i % 10} tokens/s 123456\n")


def nccl_info(i: int) -> str:
    """NCCL_DEBUG=INFO's channel set-up line."""
    return (f"node-a:{1000 + i % 8}:{2000 + i % 8} [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : {i % 8}[{i % 8}] -> "
            f"{(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read\n")


def hf_dict(i: int) -> str:
    """The HF Trainer's metrics, as its log() prints them."""
    return f"{{'loss': 1.{i % 9999:04d}, 'grad_norm': 0.5{i % 10}, 'learning_rate': 1.9e-05, 'epoch': 0.{i % 100:02d}}}\n"


FAMILIES: dict[str, Callable[[int], str]] = {"heartbeat": heartbeat, "trainer": trainer, "nccl-info": nccl_info,
                                             "hf-dict": hf_dict}


def mixed(i: int) -> str:
    """The four families, line by line in turn."""
    return list(FAMILIES.values())[i % 4](i)


def write_family(path: str, line: Callable[[int], str], size: int) -> int:
    written, i = 0, 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < size:
            chunk = "".join(line(i + k) for k in range(10000))
            fh.write(chunk)
            written += len(chunk)
            i += 10000
    return written


def without_templates() -> Scanner:
    """The shipped scanner with the message inventory's templates switched off (the knowledge base's own keywords
    only): what the template matcher of issue 26 costs is the ratio of the two, measured, not guessed."""
    scanner = Scanner()
    scanner._templates = TemplateMatcher(())
    scanner._prefilter = build_prefilter(k for s in scanner.kb for k in s.keywords)
    return scanner


def timed_scan(path: str, make: Callable[[], Scanner]) -> tuple[float, float, list[str]]:
    """(MB/s of wall time, MB/s of this process's CPU time, what was found) for one scan of ``path``. The scan
    is single-threaded and CPU-bound (the file is in the page cache); on a machine other jobs share, wall time
    also measures them, CPU time much less so."""
    scanner = make()
    w0, c0 = time.perf_counter(), time.process_time()
    with open(path, "rb") as fh:
        scanner.scan(path, fh)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    mb = scanner.bytes_scanned / 1e6
    return mb / wall, mb / cpu, [d.id for d in scanner.result().diagnoses]


GREP_E = "Error|NCCL WARN|Watchdog|exitcode|Traceback"  # the words a user would grep a failed job's log for


def grep_e_rate(path: str, size: int) -> float | None:
    """MB/s of wall time of GNU ``grep -c -E`` with ``GREP_E`` over the same file (the plain way; output to a
    pipe, not /dev/null: GNU grep stops at the first match when it writes to /dev/null)."""
    if not shutil.which("grep"):
        return None
    t0 = time.perf_counter()
    subprocess.run(["grep", "-c", "-E", GREP_E, path], capture_output=True, check=False, timeout=600,
                   env={**os.environ, "LC_ALL": "C"})
    return size / 1e6 / (time.perf_counter() - t0)


def families(size_mb: int = 25, runs: int = 3) -> None:
    """``--families``: each family alone (``size_mb`` MB) and the mix (4 x that), scanned by the engine the CLI
    uses, best of ``runs`` alternating with the templates switched off and with ``grep -E``; prints MB/s and the
    ratios, asserts nothing."""
    Scanner(), without_templates()  # build (and cache) both prefilters before any timing
    print(f"target: >= 250 MB/s a family (issue 33); best of {runs}; grep -c -E '{GREP_E}' over the same file for scale")
    print(f"{'family':10} {'MB':>4} {'wall MB/s':>10} {'CPU MB/s':>9} {'no-templates CPU':>17} {'ratio':>6} "
          f"{'grep -E MB/s':>13} {'explain/grep':>13}  found")
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-explain-families-") as tmp:
        for name, line in [*FAMILIES.items(), ("mix", mixed)]:
            path = os.path.join(tmp, f"{name}.log")
            size = write_family(path, line, size_mb * 1_000_000 * (4 if name == "mix" else 1))
            wall = cpu = before = 0.0
            grep: float | None = None
            found: list[str] = []
            for _ in range(runs):
                w, c, found = timed_scan(path, Scanner)
                wall, cpu = max(wall, w), max(cpu, c)
                before = max(before, timed_scan(path, without_templates)[1])
                g = grep_e_rate(path, size)
                grep = g if grep is None or (g is not None and g > grep) else grep
            grep_col = f"{grep:13,.0f} {wall / grep:12.2f}x" if grep else f"{'n/a':>13} {'n/a':>13}"
            print(f"{name:10} {size / 1e6:4.0f} {wall:10,.0f} {cpu:9,.0f} {before:17,.0f} {cpu / before:6.2f} "
                  f"{grep_col}  {found or '-'}")
            os.unlink(path)


if __name__ == "__main__":
    if "--pathological" in sys.argv[1:]:
        pathological()
    elif "--families" in sys.argv[1:]:
        sizes = [a for a in sys.argv[1:] if not a.startswith("--")]
        families(int(sizes[0]) if sizes else 25)
    else:
        main()
