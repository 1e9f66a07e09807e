"""`ddpdoctor explain` engine: real error texts in, the right diagnosis, ranks and order out.

Every fixture line below is a real message: copied from a log quoted in the issue thread named next to it,
from PyTorch's/NCCL's source format strings (file named), or captured on this machine from a real gloo job
(examples/logs/). Nothing here needs torch.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import ExitStack
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.explain_throughput import ERROR_BLOCKS, realistic_lines
from ddpdoctor import explain
from ddpdoctor.explain import (
    ExplainResult,
    Scanner,
    explain_streams,
    explain_text,
    load_kb,
    model,
    prefilter,
    rank_from_path,
    scanner,
)
from ddpdoctor.explain.templates import load_templates

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs"


def ids(result: ExplainResult) -> list[str]:
    return [d.id for d in result.diagnoses]


def diag(result: ExplainResult, sig_id: str) -> explain.Diagnosis:
    for d in result.diagnoses:
        if d.id == sig_id:
            return d
    raise AssertionError(f"{sig_id} not diagnosed; got {ids(result)}")


# --- one real message per signature ------------------------------------------------------------------

# hkchengrex/Cutie#125 (names + indices, TORCH_DISTRIBUTED_DEBUG=DETAIL)
UNUSED_CUTIE = """\
RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss. You can enable unused parameter detection by passing the keyword argument find_unused_parameters=True to torch.nn.parallel.DistributedDataParallel, and by
making sure all forward function outputs participate in calculating loss.
If you already have done the above, then the distributed data parallel module wasn't able to locate the output tensors in the return value of your module's forward function. Please include the loss function and the structure of the return value of forward of your module when reporting this issue (e.g. list, dict, iterable).
Parameters which did not receive grad for rank 3: mask_encoder.sensory_update.transform.bias, mask_encoder.sensory_update.transform.weight
Parameter indices which did not receive grad for rank 3: 282 283
"""

# MedicalGPT#408 (torchrun prefix, name given)
READY_TWICE = """\
RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following reasons: 1) Use of a module parameter outside the `forward` function. Please make sure model parameters are not shared across multiple concurrent forward-backward passes. or try to use _set_static_graph() as a workaround if this module graph does not change during training loop.2) Reused parameters in multiple reentrant backward passes. For example, if you use multiple `checkpoint` functions to wrap the same part of your model, it would result in the same set of parameters been used by different reentrant backward passes multiple times, and hence marking a variable ready multiple times. DDP does not support such use cases in default. You can try to use _set_static_graph() as a workaround if your module graph does not change over iterations.
[rank0]: Parameter at index 286 with name model.layers.23.mlp.down_proj.weight has been marked as ready twice. This means that multiple autograd engine  hooks have fired for this particular parameter during this iteration.
"""

# reducer.cpp static_graph variant (PyTorch source text)
STATIC_GRAPH = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new "
                "one. This error indicates that your training graph has changed in this iteration, e.g., one "
                "parameter is used in first iteration, but then got unused in the second iteration. this is not "
                "compatible with static_graph set to True.\n")

# NJU-PCALab/STAR#44
MODEL_MISMATCH = ("RuntimeError: DDP expects same model across all ranks, but Rank 3 has 2247 params, while rank 0 "
                  "has inconsistent 0 params.\n")

# modelscope/ms-swift#9443 (TORCH_DISTRIBUTED_DEBUG=DETAIL)
COLLECTIVE_MISMATCH = (
    "[rank1]: RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=3104, OpType=ALLREDUCE, TensorShape=[195812480], TensorDtypes=BFloat16, "
    "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default), "
    "requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 0 is "
    "running collective: CollectiveFingerPrint(SequenceNumber=3104, OpType=ALLREDUCE, TensorShape=[51123456], "
    "TensorDtypes=BFloat16, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided "
    "(default), requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))).Collectives "
    "differ in the following aspects:   Tensor Tensor shapes: 195812480vs 51123456\n")

# NVIDIA/nccl#296
NCCL_MISMATCHED = ("init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective calls at "
                   "and around rank 39. You can use NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL to see the "
                   "collective logs\n")

# showlab/Tune-A-Video#90 (old TCPStore text) and this machine's torch 2.13 text (examples/logs)
PORT_OLD = ("RuntimeError: The server socket has failed to listen on any local network address. The server socket "
            "has failed to bind to [::]:29500 (errno: 98 - Address already in use). The server socket has failed "
            "to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).\n")
PORT_NEW = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            "address. port: 29761, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n")

# lllyasviel/ControlNet#382 and gensyn-ai/rl-swarm#197
CONNECT_TIMEOUT = ("[E socket.cpp:793] [c10d] The client socket has timed out after 1800s while trying to connect "
                   "to (127.0.0.1, 48391).\n"
                   "TimeoutError: The client socket has timed out after 1800s while trying to connect to "
                   "(127.0.0.1, 48391).\n")
CONNECT_ERRNO_110 = ("[W427 01:04:16.149509694 socket.cpp:752] [c10d] The client socket has failed to connect to "
                     "[::ffff:198.18.0.1]:3254 (errno: 110 - Connection timed out).\n")

# sgl-project/sglang#3820
NO_ROUTE = ("node5:240:240 [6] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 10.0.0.4<56849> "
            "returned 113(No route to host) errno 115(Operation now in progress)\n")

# TCPStore.cpp format string "Timed out after {} seconds waiting for clients. {}/{} clients joined."
RENDEZVOUS = ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients "
              "joined.\n")

# verl-project/verl#161
DUPLICATE_GPU = """\
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.20.5
ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
Last error:
Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10
"""

# horovod/horovod#3929: raw NCCL WARN lines under Open MPI's [job,rank]<stdout>: prefix
DUPLICATE_GPU_MPI = """\
[1,2]<stdout>:smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 1000
[1,2]<stdout>:smc-gpu-03:29880:30398 [0] NCCL INFO init.cc:867 -> 5
[1,4]<stdout>:smc-gpu-03:29882:30400 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 4 and rank 0 both on CUDA device 1000
"""

# NVIDIA/nccl#1837 (NCCL_SOCKET_IFNAME=eth2 on a node without eth2)
IFNAME_NCCL = """\
[trainer0|0]:ncclInternalError: Internal check failed.
[trainer0|0]:Last error:
[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor AF_INET6(10)
"""

# pytorch/ci-infra#490 and NVIDIA/nccl#525
SHM = """\
mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow:202016:202235 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE to 9637892 bytes, error: No space left on device (28)
mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow:202016:202235 [0] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-WU88OE (size 9637888), error: No space left on device (28)
"""
SHM_OLD = "[3] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device\n"
# torch/utils/data/_utils/signal_handling (text in libtorch)
SHM_DATALOADER = ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                  "memory (shm).\n")
# The same line from a DataLoader worker of a torchrun rank: torchrun prefixes the worker's stderr, children too.
SHM_DATALOADER_IN_JOB = "[rank1]: " + SHM_DATALOADER

# pytorch/pytorch#16417 comment (torch >= 2.2 wording) and rshaojimmy/MADDoG#11 (older wording)
OOM_NEW = ("[rank2]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a "
           "total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has "
           "23.60 GiB memory in use.\n")
OOM_OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; 14.76 GiB total capacity; 8.77 GiB "
           "already allocated; 19.75 MiB free; 13.71 GiB reserved in total by PyTorch)\n")
# The same message inside a torchrun job (torchrun's rank prefix): a rank's OOM, not a single-GPU script's.
OOM_OLD_IN_JOB = "[rank1]: " + OOM_OLD

# pytorch/pytorch#149984
NCCL_SYSTEM = """\
Collective WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1000000) raised the following async exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.25.1
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
Last error:
"""

# NVIDIA/nccl#2076
NCCL_REMOTE = """\
torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5
ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
Last error:
socketProgressOpt: Call to recv from 172....<33759> failed : Connection reset by peer
"""

# A real NCCL watchdog sequence (torch 2.4, quoted in a public issue thread) ...
NCCL_TIMEOUT_RANK1 = """\
[rank1]:[E1003 18:37:01.832146912 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.
[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.
[rank1]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.
[rank1]:[E1003 18:37:01.833637681 ProcessGroupNCCL.cpp:621] [Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
"""
# ... and the desync report PyTorch appends to it (format strings of torch/csrc/distributed/c10d/TraceUtils.h)
DESYNC = """\
[rank0]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600022 milliseconds before timing out.
\t - [0] Timeout at collective: ALLREDUCE, #6
\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
\t     [2] finished collective #5, but didn't join collective #6 (count from 1)
"""

# a real gloo timeout line (torch 2.x, quoted in a public issue thread)
GLOO_TIMEOUT = ("[rank3]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                "waiting 1800000ms for recv operation to complete\n")

# NVIDIA/Megatron-LM#1880: torchrun's summary for a SIGSEGV
SIGSEGV_SUMMARY = """\
E0101 00:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -11) local_rank: 0 (pid: 6421) of binary: /usr/bin/python
Root Cause (first observed failure):
[0]:
  time      : 2025-01-01_00:00:00
  host      : node-a
  rank      : 0 (local_rank: 0)
  exitcode  : -11 (pid: 6421)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 6421
"""


# captured on this machine (examples/logs/ddp_find_unused_warning.log, gloo_socket_ifname.log)
FIND_UNUSED_WARNING = (
    "[rank1]:[W1122 01:41:35.797436066 reducer.cpp:1529] Warning: find_unused_parameters=True was specified in DDP "
    "constructor, but did not find any unused parameters in the forward pass. This flag results in an extra "
    "traversal of the autograd graph every iteration,  which can adversely affect performance. (function operator())\n")
GLOO_IFNAME = ("RuntimeError: [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] "
               "ifa != nullptr. Unable to find address for: nosuch0\n")


@pytest.mark.parametrize(("text", "expected_id"), [
    (UNUSED_CUTIE, "unused-parameters"),
    (READY_TWICE, "mark-ready-twice"),
    (STATIC_GRAPH, "static-graph-changed"),
    (MODEL_MISMATCH, "model-mismatch"),
    (COLLECTIVE_MISMATCH, "collective-mismatch"),
    (NCCL_MISMATCHED, "collective-mismatch"),
    (PORT_OLD, "port-in-use"),
    (PORT_NEW, "port-in-use"),
    (CONNECT_TIMEOUT, "master-connect-timeout"),
    (CONNECT_ERRNO_110, "master-connect-timeout"),
    (NO_ROUTE, "connect-no-route"),
    (RENDEZVOUS, "rendezvous-incomplete"),
    (DUPLICATE_GPU, "duplicate-gpu"),
    (DUPLICATE_GPU_MPI, "duplicate-gpu"),
    (IFNAME_NCCL, "socket-ifname"),
    (SHM, "shared-memory"),
    (SHM_OLD, "shared-memory"),
    (SHM_DATALOADER_IN_JOB, "shared-memory"),
    (OOM_NEW, "cuda-oom"),
    (OOM_OLD_IN_JOB, "cuda-oom"),
    (NCCL_SYSTEM, "nccl-system-error"),
    (NCCL_REMOTE, "remote-process-exited"),
    (NCCL_TIMEOUT_RANK1, "nccl-timeout"),
    (DESYNC, "desync-report"),
    (GLOO_TIMEOUT, "gloo-timeout"),
    (SIGSEGV_SUMMARY, "worker-killed-by-signal"),
    (FIND_UNUSED_WARNING, "find-unused-parameters-no-unused"),
    (GLOO_IFNAME, "socket-ifname"),
])
def test_real_message_is_recognised(text: str, expected_id: str) -> None:
    result = explain_text(text)
    assert expected_id in ids(result)
    d = diag(result, expected_id)
    assert d.evidence and d.evidence[0].line >= 1
    assert d.signature.cause and d.signature.remedy and d.signature.command.startswith("ddpdoctor ")


def test_unused_parameters_extracts_names_indices_and_rank() -> None:
    d = diag(explain_text(UNUSED_CUTIE), "unused-parameters")
    assert d.details["param_indices"] == ["282 283"]
    assert "mask_encoder.sensory_update.transform.bias" in d.details["param_names"][0]
    assert d.ranks == {3}
    assert [e.line for e in d.evidence] == [1, 4, 5]  # the header and both detail lines, by line number


def test_ready_twice_names_the_parameter() -> None:
    d = diag(explain_text(READY_TWICE), "mark-ready-twice")
    assert d.details["param_indices"] == ["286"]
    assert d.details["param_names"] == ["model.layers.23.mlp.down_proj.weight"]


def test_nccl_watchdog_fields_are_extracted() -> None:
    d = diag(explain_text(NCCL_TIMEOUT_RANK1), "nccl-timeout")
    assert d.details["seq_num"] == ["6463"]
    assert d.details["op_type"] == ["ALLREDUCE"]
    assert d.details["timeout_ms"] == ["1800000"]
    assert d.ranks == {1}
    # watchdog, "Exception (either an error or timeout) detected by watchdog", "Timeout at NCCL work",
    # "Some NCCL operations" lines
    assert d.count == 4


def test_desync_report_names_the_lagging_rank() -> None:
    result = explain_text(DESYNC)
    d = diag(result, "desync-report")
    assert d.details["lagging_ranks"] == ["2"]
    # the lagging rank's report sorts before the timeout it caused
    assert ids(result).index("desync-report") < ids(result).index("nccl-timeout")


def test_duplicate_gpu_suppresses_the_generic_invalid_usage() -> None:
    result = explain_text(DUPLICATE_GPU)
    assert ids(result) == ["duplicate-gpu"]
    d = diag(result, "duplicate-gpu")
    assert d.ranks == {1} and d.details["other_rank"] == ["0"] and d.details["device"] == ["10"]


def test_open_mpi_prefix_gives_the_rank() -> None:
    d = diag(explain_text(DUPLICATE_GPU_MPI), "duplicate-gpu")
    assert d.ranks == {2, 4}


def test_socket_ifname_is_a_cause_before_the_internal_error() -> None:
    assert ids(explain_text(IFNAME_NCCL)) == ["socket-ifname", "nccl-internal-error"]


def test_find_unused_warning_is_only_a_warning_and_ifname_is_named() -> None:
    warn = explain_text(FIND_UNUSED_WARNING + UNUSED_CUTIE)
    assert ids(warn)[-1] == "find-unused-parameters-no-unused"
    assert diag(warn, "find-unused-parameters-no-unused").ranks == {1}
    assert diag(explain_text(GLOO_IFNAME), "socket-ifname").details["interface"] == ["nosuch0"]


def test_port_and_oom_details() -> None:
    assert diag(explain_text(PORT_NEW), "port-in-use").details["port"] == ["29761"]
    oom = diag(explain_text(OOM_NEW), "cuda-oom")
    assert oom.details["tried_to_allocate"] == ["22.00 MiB"] and oom.ranks == {2}
    assert oom.details["capacity"] == ["23.65 GiB"]


def test_sigsegv_rank_comes_from_the_summary_block() -> None:
    d = diag(explain_text(SIGSEGV_SUMMARY), "worker-killed-by-signal")
    assert d.ranks == {0}
    assert d.details["signal"] == ["SIGSEGV"]


# --- ordering and multi-rank logs -------------------------------------------------------------------

def test_real_torchrun_sigkill_log_root_cause_first() -> None:
    """examples/logs/torchrun_sigkill.log: a real 2-rank gloo job where rank 1 was SIGKILLed."""
    with open(EXAMPLES / "torchrun_sigkill.log", "rb") as fh:
        result = explain_streams([("torchrun_sigkill.log", fh, None)])
    assert ids(result) == ["worker-killed-by-signal", "remote-process-exited"]
    killed = result.diagnoses[0]
    assert killed.ranks == {1}  # rank 0's SIGTERM from torchrun's own shutdown is not blamed
    assert killed.details["signal"] == ["SIGKILL"]
    assert result.diagnoses[1].ranks == {0}


def test_signal_killed_rank_comes_before_the_peer_torchrun_names_as_root_cause() -> None:
    """examples/logs/torchrun_sigkill_peer_first.log: a real run where rank 1 was SIGKILLed, rank 0 then
    failed on the broken connection first, and torchrun's summary calls rank 0 the "Root Cause"."""
    with open(EXAMPLES / "torchrun_sigkill_peer_first.log", "rb") as fh:
        result = explain_streams([("torchrun_sigkill_peer_first.log", fh, None)])
    # One problem: rank 0's "Connection reset by peer" is the echo of rank 1's death, and torchrun's exit code
    # for rank 0 is explained by that exception on rank 0 (issue 26: consequences under their cause).
    assert ids(result) == ["worker-killed-by-signal", "remote-process-exited", "worker-failed"]
    assert [(d.ranks, d.caused_by) for d in result.diagnoses] == [
        ({1}, None), ({0}, "worker-killed-by-signal"), ({0}, "remote-process-exited")]
    assert [d.id for d in result.problems] == ["worker-killed-by-signal"]


def test_interleaved_ranks_oom_before_the_timeouts_it_caused() -> None:
    """8 ranks interleaved; rank 5 OOMs, the others time out later in the same file and say 'remote exited'."""
    lines = []
    for step in range(50):
        for r in range(8):
            lines.append(f"[rank{r}]:[2026-11-22 01:00:{step:02d}] step {step} loss 0.{r}{step}")
    lines.append(OOM_NEW.replace("[rank2]", "[rank5]").rstrip("\n"))
    for r in (0, 1, 2, 3, 4, 6, 7):
        lines.append(f"[rank{r}]:[E1122 01:30:00.000000000 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "
                     f"collective operation timeout: WorkNCCL(SeqNum=51, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                     f"Timeout(ms)=600000) ran for 600100 milliseconds before timing out.")
    lines.append("[rank0]: " + NCCL_REMOTE.splitlines()[0])
    result = explain_text("\n".join(lines) + "\n")
    assert ids(result) == ["cuda-oom", "nccl-timeout", "remote-process-exited"]
    assert diag(result, "cuda-oom").ranks == {5}
    timeout = diag(result, "nccl-timeout")
    assert timeout.ranks == {0, 1, 2, 3, 4, 6, 7} and timeout.count == 7
    assert len(timeout.evidence) <= model.MAX_EVIDENCE


def test_one_file_per_rank_with_timestamps_orders_across_files() -> None:
    """rank0.log is read first, but rank1.log's crash happened earlier: timestamps decide."""
    rank0 = (b"[E1122 01:40:00.000000 1 ProcessGroupNCCL.cpp:607] Watchdog caught collective operation timeout: "
             b"WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 "
             b"milliseconds before timing out.\n"
             b"[E1122 01:40:01.000000 1 api.py:1] RuntimeError: boom on 0\n")
    rank1 = (b"hello\n" + b"[E1122 01:30:00.000000 2 x.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to "
             b"allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.00 GiB is free.\n")
    result = explain_streams([("logs/rank0.log", io.BytesIO(rank0), 0), ("logs/rank1.log", io.BytesIO(rank1), 1)])
    assert ids(result)[0] == "cuda-oom"
    assert diag(result, "cuda-oom").ranks == {1}
    assert diag(result, "cuda-oom").evidence[0].line == 2
    assert diag(result, "nccl-timeout").ranks == {0}


@pytest.mark.parametrize(("path", "rank"), [
    ("rank3.log", 3), ("logs/train_rank_3.out", 3), ("job-rank-12.txt", 12), ("out/RANK7.log", 7),
    ("/tmp/logs/none_abc/attempt_0/3/stderr.log", 3), ("attempt_2/11/stdout.log", 11),
    ("train.log", None), ("frank1.log", None), ("rank3/../train.log", None),
])
def test_rank_from_file_name(path: str, rank: int | None) -> None:
    assert rank_from_path(path) == rank


def test_state_dict_prefix_suppresses_the_generic_mismatch() -> None:
    result = explain_text((EXAMPLES / "state_dict_prefix.log").read_text())
    assert ids(result) == ["state-dict-prefix"]
    assert diag(result, "state-dict-prefix").details["prefix"] == ["module.", "_orig_mod."]
    plain = explain_text('RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: '
                         '"fc.weight".\n\tsize mismatch for conv.weight: copying a param with shape '
                         'torch.Size([8, 3]) from checkpoint, the shape in current model is torch.Size([4, 3]).\n')
    assert ids(plain) == ["state-dict-mismatch"]
    assert set(diag(plain, "state-dict-mismatch").details["key"]) == {"fc.weight", "conv.weight"}


def test_healthy_log_has_no_diagnosis() -> None:
    text = "".join(f"[rank{i % 4}]: step {i} loss 0.{i} lr 1e-4 grad_norm 1.{i} time 0.5s\n" for i in range(2000))
    text += "node-a:1:1 [0] NCCL INFO comm 0x55 rank 0 nranks 4 cudaDev 0 busId 1000 - Init COMPLETE\n"
    result = explain_text(text)
    assert result.diagnoses == [] and result.lines_scanned == 2001


# Lines a healthy multi-rank job really prints (NCCL_DEBUG=INFO start-up and teardown, c10d's retried connect
# warnings, PyTorch's deprecation/exit warnings, wandb/urllib3 retries of an HTTP upload). None is a DDP failure.
HEALTHY_REALISTIC = """\
node-a:1001:1001 [1] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation
node-a:1001:1001 [1] NCCL INFO Failed to open libibverbs.so[.1]
node-a:1001:1001 [1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
node-a:1001:1001 [1] NCCL INFO TUNER/Plugin: Failed to find ncclTunerPlugin_v2, using internal tuner instead.
node-a:1001:1001 [1] NCCL INFO Allocated 4194656 bytes of shared memory in /dev/shm/nccl-8rVB6h
node-a:1001:1001 [1] NCCL INFO [Service thread] Connection closed by localRank 1
node-a:1001:1001 [1] NCCL INFO comm 0x55d1c7f0 rank 1 nranks 8 cudaDev 1 busId 11000 - Destroy COMPLETE
[W1122 01:39:41.000000000 socket.cpp:663] [c10d] The client socket has failed to connect to [node-1]:29500 (errno: 111 - Connection refused).
[rank0]:[W1122 01:39:42.1234 ProcessGroupNCCL.cpp:4115] Warning: Guessing device ID based on global rank. This can cause a hang if rank to GPU mapping is heterogeneous.
[rank0]:[W1122 01:59:42.1234 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call destroy_process_group to ensure that any pending NCCL operations have finished in this process. (function operator())
[uv_loop_close] [I1122 02:36:35.843471704 TCPStoreLibUvBackend.cpp:1354] [c10d] uv_loop_close failed with:-16 errn:EBUSY desc:resource busy or locked
WARNING:urllib3.connectionpool:Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'ProtocolError('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))': /api/v1/runs
wandb: Network error (ConnectionError), entering retry loop.
Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0
epoch 3 step 1200 | loss 0.4123 | error rate 0.031 | tokens/s 51234
I1122 01:39:40.561000 1000 torch/distributed/elastic/agent/server/api.py:932] Local worker group finished (WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish
"""


def test_realistic_healthy_lines_are_not_diagnosed() -> None:
    # An HTTP retry quoting 'Connection reset by peer' used to be reported as a DDP peer that went away.
    result = explain_text(HEALTHY_REALISTIC)
    assert ids(result) == []
    # The same words from gloo's transport are still a peer that went away.
    gloo = "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4567\n"
    assert ids(explain_text(gloo)) == ["remote-process-exited"]


# A realistic healthy multi-node log (benchmarks/explain_throughput.py --realistic uses the same generator):
# glog W/I lines from c10d/ProcessGroupNCCL/reducer/torchrun, NCCL_DEBUG=INFO, c10d connect retries, tqdm,
# wandb/urllib3 retries, Python warnings, [rankN]: training output. A bit over one 4 MB read block.
REALISTIC_LINES_COUNT = 32000


@cache
def realistic_healthy_lines() -> tuple[str, ...]:
    return tuple(realistic_lines(REALISTIC_LINES_COUNT, seed=11))


def test_realistic_healthy_log_has_no_diagnosis() -> None:
    data = "".join(realistic_healthy_lines()).encode()
    assert len(data) > scanner.CHUNK_BYTES  # more than one read block
    result = explain_text(data)
    assert ids(result) == [] and result.lines_scanned == REALISTIC_LINES_COUNT


def _header_line(block: str) -> int:
    """0-based line of ``block`` that its diagnosis starts from (the first evidence line)."""
    d = explain_text(block).diagnoses[0]
    return d.evidence[0].line - 1


@pytest.mark.parametrize("where", ["middle", "header-ends-a-read-block"])
@pytest.mark.parametrize("sig_id", sorted(ERROR_BLOCKS))
def test_realistic_log_with_one_error_block_gives_exactly_that_diagnosis(
        sig_id: str, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error block inside a noisy healthy log: the same diagnosis, ranks, details and file:line evidence
    as the block alone (shifted by where it sits), and nothing else. With "header-ends-a-read-block" the
    first read block ends right after the header, so its follow-up lines come in the next block."""
    block = ERROR_BLOCKS[sig_id]
    alone = explain_text(block)
    assert ids(alone) == [sig_id]
    healthy = realistic_healthy_lines()
    at = len(healthy) // 2
    text = "".join(healthy[:at]) + block + "".join(healthy[at:])
    if where == "header-ends-a-read-block":
        header = _header_line(block)
        header_end = len("".join(healthy[:at]).encode()) + len("".join(block.splitlines(True)[:header + 1]).encode())
        monkeypatch.setattr(scanner, "CHUNK_BYTES", header_end + 5)  # 5 bytes into the next line
    result = explain_text(text, name="train.log")
    assert ids(result) == [sig_id]
    got, want = result.diagnoses[0], alone.diagnoses[0]
    assert (got.ranks, got.count, got.details) == (want.ranks, want.count, want.details)
    assert [(e.line, e.text) for e in got.evidence] == [(e.line + at, e.text) for e in want.evidence]
    assert result.lines_scanned == REALISTIC_LINES_COUNT + len(block.splitlines())


# Python's report of an exception in __del__ at exit (cpython Python/errors.c: "Exception ignored in"), as
# DataLoader workers print it at the end of runs that finished fine; then the same exception really raised.
IGNORED_AT_EXIT = """\
[rank1]:Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3b2c1d5e50>
[rank1]:Traceback (most recent call last):
[rank1]:  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1479, in __del__
[rank1]:    self._shutdown_workers()
[rank1]:  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1443, in _shutdown_workers
[rank1]:    if w.is_alive():
[rank1]:       ^^^^^^^^^^^^
[rank1]:  File "/usr/lib/python3.11/multiprocessing/process.py", line 160, in is_alive
[rank1]:    assert self._parent_pid == os.getpid(), 'can only test a child process'
[rank1]:           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank1]:AssertionError: can only test a child process
[rank0]:TRAIN_OK steps=32
"""
RAISED = """\
[rank1]:Traceback (most recent call last):
[rank1]:  File "/work/train.py", line 40, in <module>
[rank1]:    assert batch.shape[0] > 0, 'can only test a child process'
[rank1]:AssertionError: can only test a child process
"""


def test_exception_ignored_at_exit_is_not_a_crash() -> None:
    assert ids(explain_text(IGNORED_AT_EXIT)) == []
    raised = explain_text(RAISED)
    assert ids(raised) == ["python-exception"] and diag(raised, "python-exception").ranks == {1}


def test_json_shape_matches_the_contract() -> None:
    data = json.loads(json.dumps(explain_text(UNUSED_CUTIE).to_json()))
    (d,) = data["diagnoses"]
    assert {"id", "title", "ranks", "evidence", "cause", "remedy", "command"} <= set(d)
    assert d["evidence"][0] == {"file": "<text>", "line": 1, "text": UNUSED_CUTIE.splitlines()[0].strip()[:400]}


# --- streaming: block boundaries, long lines, bounded memory ------------------------------------------

def test_messages_split_across_read_blocks_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny blocks put the follow-up and look-back lines in other blocks than their header."""
    monkeypatch.setattr(scanner, "CHUNK_BYTES", 64)
    monkeypatch.setattr(scanner, "MAX_LINE_BYTES", 4096)
    text = ("x" * 50 + "\n") * 3 + UNUSED_CUTIE + SIGSEGV_SUMMARY + DESYNC
    result = explain_text(text)
    assert diag(result, "unused-parameters").details["param_indices"] == ["282 283"]
    assert diag(result, "worker-killed-by-signal").ranks == {0}
    assert diag(result, "desync-report").details["lagging_ranks"] == ["2"]
    assert diag(result, "unused-parameters").evidence[2].line == 8


def test_huge_line_without_newlines_is_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scanner, "CHUNK_BYTES", 1024)
    monkeypatch.setattr(scanner, "MAX_LINE_BYTES", 2048)
    data = b"\x00\xff" * 5000 + b" RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB " + b"z" * 9000
    result = explain_text(data, name="rank0.log", file_rank=0)  # one rank's log: a rank's OOM
    assert "cuda-oom" in ids(result)


def test_evidence_and_details_stay_bounded() -> None:
    line = "[rank{r}]: RuntimeError: CUDA out of memory. Tried to allocate {r}.00 MiB (GPU 0; 1 GiB total capacity)\n"
    result = explain_text("".join(line.format(r=r) for r in range(10000)))
    d = diag(result, "cuda-oom")
    assert d.count == 10000 and len(d.ranks) == 10000
    assert len(d.evidence) == model.MAX_EVIDENCE
    assert all(len(v) <= model.MAX_DETAIL_VALUES for v in d.details.values())


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    data = b"\xff\xfe\n[rank1]: RuntimeError: DDP expects same model across all ranks, but Rank 1 has 4 params, " \
           b"while rank 0 has inconsistent 2 params. \xc3(\x80\n"
    d = diag(explain_text(data), "model-mismatch")
    assert d.ranks == {1} and "\ufffd" in d.evidence[0].text


# --- the knowledge base itself -----------------------------------------------------------------------

ISSUE_IDS = {"unused-parameters", "mark-ready-twice", "find-unused-parameters-no-unused", "state-dict-prefix",
             "port-in-use", "master-connect-timeout", "nccl-timeout", "desync-report", "duplicate-gpu",
             "nccl-system-error", "nccl-internal-error", "remote-process-exited", "shared-memory",
             "connect-no-route", "socket-ifname", "cuda-oom", "worker-killed-by-signal", "model-mismatch",
             "collective-mismatch"}


def test_kb_covers_every_signature_the_issue_lists_with_stable_ids() -> None:
    kb = load_kb()
    kb_ids = [s.id for s in kb]
    assert set(kb_ids) >= ISSUE_IDS
    # A family may match only through the inventory's templates (ddpdoctor/explain/templates.json).
    from_templates = {t.signature for t in load_templates()}
    for s in kb:
        assert s.id == s.id.lower() and " " not in s.id and "_" not in s.id
        assert s.title and s.cause and s.remedy and s.command.startswith("ddpdoctor ")
        # a family may match through the inventory's templates only; a derived diagnosis (probable-hang) is made
        # by the ranking
        assert s.patterns or s.id in from_templates or s.derived, s.id


def test_every_keyword_is_found_from_a_rare_lead_byte() -> None:
    """The one prefilter pass enters its trie at every chosen lead byte (see prefilter_anchors): a keyword made
    only of common bytes ("NCCL error") would put "N" on every NCCL line into it. Anchors are pieces of their
    keyword from a rare byte on, at most MAX_ANCHOR_BYTES long; the inventory templates' keywords too."""
    keywords = {k for s in load_kb() for k in s.keywords} | set(Scanner()._templates.keywords)
    for keyword, anchor in prefilter.prefilter_anchors(keywords).items():
        assert anchor in keyword.encode() and anchor[0] in prefilter.ANCHOR_LEAD_BYTES, (keyword, anchor)
        assert len(anchor) <= prefilter.MAX_ANCHOR_BYTES
    folded = Scanner()._prefilter.table
    heartbeat = (b"[rank3]:[I501 10:00:00.461980659 ProcessGroupNCCL.cpp:1538] [PG ID 0 PG GUID 0(default_pg) "
                 b"Rank 3] ProcessGroupNCCL heart beat monitor thread joined.")
    leads = heartbeat.translate(folded).count(prefilter.FOLDED_LEAD)
    assert leads <= 1, f"{leads} lead bytes on every heartbeat line: {sorted(set(heartbeat) - set(heartbeat.translate(folded)))}"
    # ... and no anchor starts the way the line goes on from there: the desync report's "joined but didn't
    # finish collective" had "joined but didn'" as its anchor, and every heartbeat line's "joined." went three
    # levels into the trie (0.12 us a line: heartbeat-only logs scanned at 325 MB/s, 375 without it).
    anchors = set(prefilter.prefilter_anchors(keywords).values())
    for at in (i for i, byte in enumerate(heartbeat) if folded[byte] == prefilter.FOLDED_LEAD):
        assert not [a for a in anchors if a[:2] == heartbeat[at:at + 2]], heartbeat[at:at + 8]


def test_what_follows_a_lead_byte_on_healthy_lines_is_turned_away_but_never_hides_a_keyword() -> None:
    """NCCL INFO's "via" and the heartbeat's "joined." are refused right after their lead byte (half of an NCCL
    INFO log's prefilter pass went into the trie for "via"); a keyword whose anchor starts that way drops the
    refusal instead of being lost."""
    shipped = Scanner()._prefilter
    for healthy in prefilter.HEALTHY_AFTER_LEAD:
        assert re.escape(healthy) in shipped.regex.pattern, healthy  # in effect for the shipped keywords
    nccl_info = bytearray(b"node-a:1000:2000 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n")
    assert shipped.search(shipped.fold(nccl_info, len(nccl_info)), 0, len(nccl_info)) is None
    with_via = prefilter.build_prefilter(["Error: ", "via P2P failed"])
    assert re.escape(b"ia ") not in with_via.regex.pattern
    line = bytearray(b"NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P failed\n")
    assert with_via.search(with_via.fold(line, len(line)), 0, len(line)) is not None


def test_a_desync_reports_lines_pasted_alone_name_the_lagging_ranks() -> None:
    """The lines of ProcessGroupNCCL's desync report (TORCH_NCCL_DESYNC_DEBUG=1; torch 2.13.0
    torch/csrc/distributed/c10d/TraceUtils.h:102 and :110) found on their own, without the report's head above
    them: each holds "collective #", their keyword from the rare "v" of "collective" on."""
    joined = "\t   - [2] joined but didn't finish collective #7 (count from 1)\n"
    finished = "\t   - [1, 3] finished collective #6, but didn't join collective #7 (count from 1)\n"
    for line, ranks in ((joined, ["2"]), (finished, ["1, 3"])):
        result = explain_text(line.encode(), name="pasted")
        assert ids(result) == ["desync-report"], line
        assert diag(result, "desync-report").details["lagging_ranks"] == ranks
        assert diag(result, "desync-report").details["seq_num"] == ["7"]


def test_prefilter_lets_through_almost_no_healthy_line() -> None:
    """glog W/I lines, NCCL INFO, training output, tqdm, HTTP retries: none may cost a regex match per line.

    The old keywords (W0-W9, E0-E9, 'Error', 'WARN') admitted every glog line, and a realistic log scanned
    at 25 MB/s instead of the >= 100 MB/s issue 8 asks for."""
    data = "".join(realistic_healthy_lines()).encode()
    # The scanner's own admission: the prefilter's hits, less an `Error('` after no known exception type (urllib3's
    # `ProtocolError('Connection aborted.'` retries, see sources.REPR_ERROR_TYPES).
    admitted = {data[start:end] for start, end in Scanner()._admitted(bytearray(data), len(data)).items()}
    # Only c10d's connect retries ('TCP client failed to connect/validate ... - retrying', 'The client socket
    # has failed to connect to [node-a]:29500 (errno: 111 ...)') share their keywords with the real failures
    # ('... - timed out', '(errno: 113 - No route to host)'); they are printed a few times at start-up.
    retries = (b"TCP client failed to connect/validate", b"The client socket has failed to connect")
    assert all(any(r in line for r in retries) for line in admitted), list(admitted)[:5]
    assert len(admitted) < REALISTIC_LINES_COUNT // 100


def test_docs_table_lists_every_id() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "explain.md").read_text()
    for s in load_kb():
        assert f"`{s.id}`" in doc, s.id


def test_every_example_log_is_explained() -> None:
    for path in sorted(EXAMPLES.glob("*.log")):
        with open(path, "rb") as fh:
            assert explain_streams([(str(path), fh, rank_from_path(str(path)))]).diagnoses, path


def test_torchrun_log_dir_layout() -> None:
    """A real `torchrun --log-dir D --redirects 3` run where rank 1 was SIGKILLed: the killed rank's own
    stderr is empty; the console (torchrun) names it, and rank 0's file (rank from the directory) shows the echo."""
    paths = [EXAMPLES / "torchrun_log_dir" / "console.log",
             *sorted((EXAMPLES / "torchrun_log_dir").rglob("std*.log"))]
    with ExitStack() as stack:
        streams = [(str(p), stack.enter_context(open(p, "rb")), rank_from_path(str(p))) for p in paths]
        result = explain_streams(streams)
    assert ids(result) == ["worker-killed-by-signal", "remote-process-exited"]
    assert diag(result, "worker-killed-by-signal").ranks == {1}
    echo = diag(result, "remote-process-exited")
    assert echo.ranks == {0} and echo.evidence[0].file.endswith("attempt_0/0/stderr.log")


# --- fuzz ---------------------------------------------------------------------------------------------

_REAL = [UNUSED_CUTIE, DUPLICATE_GPU, SIGSEGV_SUMMARY, DESYNC, SHM, NCCL_TIMEOUT_RANK1]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096), st.sampled_from(_REAL), st.integers(min_value=0, max_value=4096))
def test_arbitrary_bytes_never_crash(junk: bytes, real: str, cut: int) -> None:
    data = junk[:cut] + real.encode()[: cut % 700] + junk[cut:]
    result = explain_text(data)
    json.dumps(result.to_json())
    explain.render_text(result)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([*_REAL, "noise line\n", "\r\n", "\x00\n"]), max_size=12))
def test_concatenated_real_messages_never_crash(parts: list[str]) -> None:
    result = explain_text("".join(parts))
    assert all(d.count >= 1 for d in result.diagnoses)


def test_a_start_up_line_marks_a_long_log_distributed_for_a_bare_error_at_its_end() -> None:
    """ProcessGroupNCCL's start-up line, 2.4 MB of a trainer's lines, then a bare CUDA OOM with no rank prefix: the
    OOM is a rank's failure (exit 1, no single-process note), as when the two lines are close. The sign is looked
    for in the input's first MiB only (scanner.DIST_SIGN_BYTES: ~35 literal searches over a whole 4 MB block cost a
    trainer's 200 MB log a seventh of its scan)."""
    from benchmarks.explain_throughput import trainer

    start = b"[W1122 10:00:00.000 ProcessGroupNCCL.cpp:100] [PG ID 0 PG GUID 0(default_pg) Rank 3] started\n"
    oom = (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
           b"79.15 GiB of which 1.06 GiB is free.\n")
    body = "".join(trainer(i) for i in range(20000)).encode()
    assert len(body) > 2 << 20
    result = explain_text(start + body + oom, name="job.log")
    assert ids(result) == ["cuda-oom"] and diag(result, "cuda-oom").fatal
    assert not result.notes
    alone = explain_text(body + oom, name="job.log")  # the same error with no sign of a job: a note
    assert [n.id for n in alone.notes] == ["cuda-oom"]


def test_monitored_barriers_named_ranks_are_the_ones_to_look_at() -> None:
    """ProcessGroupGloo's monitoredBarrier, raised by rank 0: the ranks it names (1 and 3) are the diagnosis'
    headline and details, with or without the message's "[Rank 0]: " head (it read as rank 0's problem, and the
    head-less one-rank form as an unknown RuntimeError)."""
    from ddpdoctor.explain.rendering import headline

    several = explain_text("[rank0]: RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 30000 ms\n")
    d = diag(several, "monitored-barrier-failed")
    assert d.details["lagging_ranks"] == ["1, 3"] and d.details["timeout_ms"] == ["30000"]
    assert headline(d).endswith(": ranks 1,3")
    one = explain_text("RuntimeError: Rank 1 failed to pass monitoredBarrier in 30000 ms\n")
    assert ids(one) == ["monitored-barrier-failed"] and headline(one.diagnoses[0]).endswith(": rank 1")


UNUSED_WITH_FIND_UNUSED = (
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your module has parameters that were not used in producing loss. Since `find_unused_parameters="
    "True` is enabled, this likely  means that not all `forward` outputs participate in computing loss. You can fix "
    "this by making sure all `forward` function outputs participate in calculating loss.")
STATIC_GRAPH_CHANGED = (
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your training graph has changed in this iteration, e.g., one parameter is used in first "
    "iteration, but then got unused in the second iteration. this is not compatible with static_graph set to True.")


@pytest.mark.parametrize("prefix", ["", "[rank1]: "])
def test_the_reducers_two_heads_keep_their_own_diagnosis_with_the_indices_line_under_them(prefix: str) -> None:
    """reducer.cpp's unused-parameters head (find_unused_parameters=True variant) then its indices line, pasted
    without rank prefixes (mp.spawn): the two lines were rejoined as one wrapped line and the static-graph
    signature's indices pattern took it, advising to drop static_graph=True (an explorer's find)."""
    tail = f"{prefix}Parameter indices which did not receive grad for rank 1: 4 5\n"
    unused = explain_text(f"{prefix}{UNUSED_WITH_FIND_UNUSED}\n{tail}")
    assert ids(unused) == ["unused-parameters"] and unused.diagnoses[0].details["param_indices"] == ["4 5"]
    static = explain_text(f"{prefix}{STATIC_GRAPH_CHANGED}\n{tail}")
    assert ids(static) == ["static-graph-changed"]


def test_torchruns_bare_rendezvous_timeout_is_a_rendezvous_that_did_not_complete() -> None:
    """dynamic_rendezvous.py raises RendezvousTimeoutError with no message (torch 2.13.0, line 680): the agent's
    traceback ends with the bare class, which read as "A rank raised RendezvousTimeoutError"."""
    text = ('Traceback (most recent call last):\n  File "/usr/bin/torchrun", line 8, in <module>\n    sys.exit(main())\n'
            '  File "/opt/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", line 680, in run\n'
            "    raise RendezvousTimeoutError\ntorch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n")
    assert ids(explain_text(text)) == ["rendezvous-incomplete"]
