"""`explain` says what it knows, however the error reaches it (issue 33).

* a known message pasted alone (no launcher lines around it) is named, worded for one process; only the
  catch-all for an unknown exception stays silent in a log with no sign of a distributed job;
* a traceback whose last line was not pasted: the `raise` source line (literals joined), a helper's raise with
  its variable in the caller's frame, the C++ frames and "Exception raised from X at FILE:LINE";
* older releases' wordings: torch 1.x's THC messages, the store-based barrier's 1.x text, gloo's uncaught
  `gloo::IoException` as torch 1.x printed it;
* the log's own numbers and addresses as details of the diagnosis (a loopback address, a short timeout).

Each text is quoted from the source that prints it (named next to it); no log is the only source of a text.
"""

from __future__ import annotations

import json

import pytest

from ddpdoctor.explain import explain_text, render_text
from tests.support import run_cli

# --- no silence when a known message is present ----------------------------------------------------------

# c10/cuda/CUDAException.cpp: "CUDA error: " + cudaGetErrorString(cudaErrorInvalidDevice); a bare paste.
INVALID_ORDINAL = "RuntimeError: CUDA error: invalid device ordinal\n"
# NCCL src/misc/shmutils.cc (2.12+): "Error while creating shared memory segment %s (size %ld)", here behind a
# loguru-style line prefix an application adds, with no launcher line around it.
SHM_BEHIND_PREFIX = ("2024-05-01 10:00:00.123 | ERROR    | __main__:main:42 - node1:2871:2960 [0] "
                     "include/shm.h:... Error while creating shared memory segment /dev/shm/nccl-ZoemSg "
                     "(size 9637888)\n")
# torch/distributed/distributed_c10d.py (init_process_group on a build without NCCL).
NO_NCCL = "RuntimeError: Distributed package doesn't have NCCL built in\n"


@pytest.mark.parametrize(("text", "want", "words"), [
    (INVALID_ORDINAL, "invalid-device-ordinal", "The process asked for a GPU that does not exist"),
    (SHM_BEHIND_PREFIX, "shared-memory", "too small or full for NCCL in this process"),
    (NO_NCCL, "nccl-not-available", "has no NCCL"),
], ids=["invalid-device-ordinal", "nccl-shm-behind-a-prefix", "no-nccl-built-in"])
def test_a_known_message_pasted_alone_is_named(text: str, want: str, words: str) -> None:
    proc = run_cli(["explain", "--json", "-"], input_text=text)
    first = json.loads(proc.stdout)["diagnoses"][0]
    assert (proc.returncode, first["id"], first["level"]) == (1, want, "error")
    assert words in first["title"]


def test_the_same_line_in_a_job_keeps_the_distributed_wording() -> None:
    got = explain_text("[rank5]: " + INVALID_ORDINAL).diagnoses[0]
    assert got.id == "invalid-device-ordinal" and got.signature.title.startswith("A rank asked for a GPU")


def test_a_plain_scripts_exception_is_no_false_alarm() -> None:
    """The false alarm of issue 33: a NameError in a script's non-DDP branch was 'A rank raised a Python
    exception', exit 1. No known message, no sign of a distributed job: a note about that one process, exit 0
    (named, not hidden: "no known error" only when there is nothing to name)."""
    text = ('Traceback (most recent call last):\n  File "/home/u/proj/train.py", line 88, in <module>\n'
            "    main(args)\n  File \"/home/u/proj/train.py\", line 61, in main\n    model = build(cfg)\n"
            "NameError: name 'build' is not defined\n")
    proc = run_cli(["explain", "-"], input_text=text)
    assert proc.returncode == 0 and "no failure found" in proc.stdout and "A rank raised" not in proc.stdout
    assert ("n1. This process raised NameError: name 'build' is not defined  (at /home/u/proj/train.py:61 in main); "
            "no sign of a distributed job in the log  [python-exception]") in proc.stdout


# --- what tracebacks and crash dumps show ------------------------------------------------------------------

# distributed_c10d.py raises it on one line in torch 2.x; written here as two literals the compiler joins.
RAISE_TWO_LITERALS = '''Traceback (most recent call last):
  File "C:\\work\\train.py", line 10, in <module>
    dist.init_process_group("nccl")
  File "C:\\Python39\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py", line 727, in _new_process_group_helper
    raise RuntimeError("Distributed package doesn't have NCCL " "built in")
'''
# torch/nn/parallel/distributed.py (torch 1.x forward): reducer's unused-parameters message as a raise whose
# literals continue on the lines below it (a multi-line statement, shown whole in the paste).
RAISE_OVER_LINES = '''[rank1]:   File "/opt/conda/lib/python3.8/site-packages/torch/nn/parallel/distributed.py", line 692, in forward
[rank1]:     raise RuntimeError(
[rank1]:         "Expected to have finished reduction in the prior iteration before starting a new one. "
[rank1]:         "This error indicates that your module has parameters that were not used in producing loss. "
[rank1]:     )
'''
# torch/distributed/rendezvous.py: _get_env_or_raise(env_var) raises _env_error(env_var); the variable is in the
# caller's frame.
RAISE_THROUGH_HELPER = '''  File "/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py", line 236, in _env_rendezvous_handler
    master_addr = _get_env_or_raise("MASTER_ADDR")
  File "/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py", line 214, in _get_env_or_raise
    raise _env_error(env_var)
'''


@pytest.mark.parametrize(("text", "want", "detail", "rank"), [
    (RAISE_TWO_LITERALS, "nccl-not-available", None, None),
    (RAISE_OVER_LINES, "unused-parameters", None, 1),
    (RAISE_THROUGH_HELPER, "env-not-set", ("variable", ["MASTER_ADDR"]), None),
], ids=["two-literals", "over-lines", "through-helper"])
def test_a_traceback_without_its_last_line_is_read_from_the_raise(text: str, want: str,
                                                                   detail: tuple[str, list[str]] | None,
                                                                   rank: int | None) -> None:
    result = explain_text(text)
    first = result.diagnoses[0]
    assert first.id == want
    assert "raise " in first.evidence[0].text  # the evidence quotes the source line itself
    if detail is not None:
        assert first.details[detail[0]] == detail[1]
    if rank is not None:
        assert first.ranks == {rank}


def test_a_raise_of_an_unknown_message_is_not_a_diagnosis() -> None:
    text = '  File "train.py", line 3, in <module>\n    raise ValueError("the config has no \'model\' section")\n'
    assert explain_text("[rank0]: " + text.replace("\n", "\n[rank0]: ")).diagnoses == []


# c10/util/Exception.cpp appends "Exception raised from <function> at <file>:<line> (most recent call first):"
# and the C++ frames; ProcessGroupNCCL.cpp's WorkNCCL::checkTimeout throws the watchdog's timeout.
WATCHDOG_FRAMES = """terminate called after throwing an instance of 'c10::DistBackendError'
Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f1c in /usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)
frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f1d in /usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)
frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x7f1d in /usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)
"""
# socket.cpp: SocketConnectOp::throwTimeoutError.
CONNECT_FRAMES = ("Exception raised from throwTimeoutError at ../torch/csrc/distributed/c10d/socket.cpp:1021 "
                  "(most recent call first):\n")


def test_the_watchdogs_cpp_frames_alone_name_the_timeout() -> None:
    first = explain_text(WATCHDOG_FRAMES).diagnoses[0]
    assert first.id == "nccl-timeout"
    assert first.details["cpp_source"] == ["../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565"]
    assert any("WorkNCCL::checkTimeout" in e.text for e in first.evidence)


def test_the_connect_timeouts_cpp_frame_names_it() -> None:
    assert [d.id for d in explain_text(CONNECT_FRAMES).diagnoses] == ["master-connect-timeout"]


# --- older releases' wordings --------------------------------------------------------------------------------

# torch 1.x aten/src/THC/THCGeneral.cpp __THCudaCheck: the fprintf line, then _THError's "cuda runtime error (%d)
# : %s" raised as a RuntimeError with " at FILE:LINE".
THC_OOM = ("THCudaCheck FAIL file=/pytorch/aten/src/THC/THCCachingHostAllocator.cpp line=278 error=2 : out of memory\n"
           "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510\n")
THC_ASSERT = ("RuntimeError: cuda runtime error (59) : device-side assert triggered at "
              "/pytorch/aten/src/THC/generic/THCTensorMath.cu:26\n")
THC_ORDINAL = "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=47 error=101 : invalid device ordinal\n"
# gloo transport/tcp/pair.cc at 2b91c6b (2020): handleConnecting's GLOO_ERROR_MSG("connect ", peer_.str(), ": ",
# strerror(optval)) thrown as gloo::IoException, uncaught in torch 1.x's gloo threads.
GLOO_CONNECT = ("terminate called after throwing an instance of 'gloo::IoException'\n"
                "  what():  [/opt/conda/conda-bld/pytorch_1591914880026/work/third_party/gloo/gloo/transport/tcp/"
                "pair.cc:769] connect [127.0.1.1]:36297: Connection refused\n")
GLOO_CLOSED = ("terminate called after throwing an instance of 'gloo::IoException'\n"
               "  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:575] Connection closed by peer "
               "[10.1.1.2]:62451\n")
GLOO_READ_TIMEOUT = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read timeout [10.0.0.2]:1234\n"
# torch 1.x distributed_c10d.py _store_based_barrier (2.x says "on rank {}" and num_workers_joined).
BARRIER_1X = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 3, for key: "
              "store_based_barrier_key:1 (world_size=4, worker_count=2, timeout=0:00:30)\n")


@pytest.mark.parametrize(("text", "want", "details"), [
    ("[rank1]: " + THC_OOM.replace("\n", "\n[rank1]: ", 1), "cuda-oom", {}),
    ("[rank0]: " + THC_ASSERT, "cuda-kernel-error", {"cuda_error": ["device-side assert triggered"]}),
    (THC_ORDINAL, "invalid-device-ordinal", {}),
    (GLOO_CONNECT, "gloo-connect-failed", {"peer": ["127.0.1.1"], "port": ["36297"], "reason": ["Connection refused"]}),
    (GLOO_CLOSED, "remote-process-exited", {"peer": ["10.1.1.2"]}),
    (GLOO_READ_TIMEOUT, "gloo-timeout", {"operation": ["Read"], "peer": ["10.0.0.2"]}),
    (BARRIER_1X, "rendezvous-incomplete", {"world_size": ["4"], "joined": ["2"], "timeout": ["0:00:30"]}),
], ids=["thc-oom", "thc-device-assert", "thc-ordinal", "gloo-connect", "gloo-closed-by-peer", "gloo-read-timeout",
        "store-barrier-1x"])
def test_older_releases_wordings(text: str, want: str, details: dict[str, list[str]]) -> None:
    first = explain_text(text).diagnoses[0]
    assert (first.id, first.level) == (want, "error")
    for name, values in details.items():
        assert first.details[name] == values


def test_the_inventory_holds_gloos_older_io_errors_with_their_commit() -> None:
    """scripts/build_explain_inventory.py reads gloo's GLOO_ERROR_MSG calls (the tcp transport's IoExceptions),
    and gloo at 2b91c6b (2020-06-01) as an older release: the texts only it prints carry that commit."""
    from tests.explain.test_inventory_coverage import INVENTORY

    rows = [json.loads(line) for line in (INVENTORY / "gloo.jsonl").read_text().splitlines()]
    connect = [r for r in rows if r["template"] == "connect {}: {}"]
    assert connect and connect[0]["commit"].startswith("2b91c6b") and connect[0]["exception"] == "IoException"
    mapping = [json.loads(line) for line in (INVENTORY / "mapping.jsonl").read_text().splitlines()]
    closed = [m for m in mapping if m["source"] == "gloo" and m["file"] == "gloo/transport/tcp/pair.cc"
              and m["line"] == 553]
    assert [m["to"] for m in closed] == ["remote-process-exited"]


# --- the log's own numbers and addresses -------------------------------------------------------------------

def test_a_loopback_connect_address_says_hostname_and_ifname() -> None:
    result = explain_text("[rank1]: " + GLOO_CONNECT.replace("\n", "\n[rank1]: ", 1))
    notes = result.diagnoses[0].notes
    assert len(notes) == 1 and "127.0.1.1" in notes[0] and "GLOO_SOCKET_IFNAME" in notes[0]
    assert "/etc/hosts" in notes[0] and "pair.cc:769] connect [127.0.1.1]" in notes[0]  # quotes its line
    assert "loopback" in render_text(result)


def test_a_short_barrier_timeout_is_named_and_the_default_is_not() -> None:
    short = explain_text(BARRIER_1X).diagnoses[0]
    assert short.ranks == {3}
    assert any("0:00:30 (30 s), shorter than the 30-minute default" in n for n in short.notes)
    default = explain_text(BARRIER_1X.replace("0:00:30", "0:30:00")).diagnoses[0]
    assert not any("shorter than" in n for n in default.notes)


def test_a_short_nccl_timeout_is_named() -> None:
    line = ("[rank1]:[E1122 01:39:40.561000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=60000) ran for 60001 "
            "milliseconds before timing out.\n")
    first = explain_text(line).diagnoses[0]
    assert first.id == "nccl-timeout" and any("60000 (60 s), shorter than NCCL's 10-minute default" in n
                                              for n in first.notes)
    assert not any("shorter" in n for n in explain_text(line.replace("60000", "600000")).diagnoses[0].notes)


def test_nccl_on_a_docker_bridge_sharpens_the_connect_failure_and_alone_says_nothing() -> None:
    """src/bootstrap.cc ("Bootstrap : Using IF:ADDR") and transport/net_socket.cc ("NET/Socket : Using [0]IF:ADDR")
    name the interface; src/misc/socket.cc takes docker only when it finds no other. A fact, never a finding."""
    chosen = ("node-b:4004:4074 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>\n"
              "node-b:4004:4074 [0] NCCL INFO NET/Socket : Using [0]docker0:172.17.0.1<0>\n")
    # misc/socket.cc (2.19+): socketStartConnect's WARN
    failed = ("node-b:4004:4090 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 172.17.0.1<35121> "
              "failed : Software caused connection abort\n")
    result = explain_text(chosen + failed)
    assert [d.id for d in result.diagnoses] == ["nccl-connect-failed"]
    note = result.diagnoses[0].notes[-1]
    assert "Bootstrap : Using docker0:172.17.0.1" in note and "NCCL_SOCKET_IFNAME" in note
    proc = run_cli(["explain", "--json", "-"], input_text=chosen)
    assert (proc.returncode, json.loads(proc.stdout)["diagnoses"]) == (0, [])


def test_ray_train_workers_on_one_gpu_get_the_scaling_config_hint() -> None:
    # NCCL init.cc: "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", behind Ray's prefix.
    line = ("(RayTrainWorker pid=2301, ip=10.0.0.5) node:2301:2400 [0] init.cc:1003 NCCL WARN Duplicate GPU "
            "detected : rank 1 and rank 0 both on CUDA device 1a000\n")
    first = explain_text(line).diagnoses[0]
    assert first.id == "duplicate-gpu" and any("ScalingConfig" in n and "RayTrainWorker pid=2301" in n
                                               for n in first.notes)
    assert not any("Ray" in n for n in explain_text(line.split(") ", 1)[1]).diagnoses[0].notes)


# --- the neighbours ----------------------------------------------------------------------------------------

# torch/csrc/DataLoader.cpp (THPModule_errorIfAnyWorkerFails, the worker's SIGSEGV handler).
DATALOADER_BUS = ("[rank3]: RuntimeError: DataLoader worker (pid 30882) is killed by signal: Bus error. It is possible "
                  "that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n")
DATALOADER_KILLED = "[rank3]: RuntimeError: DataLoader worker (pid 30882) is killed by signal: Killed. \n"
DATALOADER_SEGV = "[rank0]: ERROR: Unexpected segmentation fault encountered in worker.\n"
# aws-ofi-nccl src/nccl_ofi_sendrecv.cpp:582 (v1.7.4-aws: nccl_ofi_rdma.c:617), printed by NCCL's logger.
OFI_REGISTER = ("ip-10-0-1-1:3236:3428 [4] register_rail_mr_buffer:617 NCCL WARN NET/OFI Unable to register memory "
                "(type = 2) for device 4. RC: -22, Error: Invalid argument\n")
# torch/cuda/__init__.py _lazy_init.
CUDA_FORK = ("[rank0]: RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
             "you must use the 'spawn' start method\n")


@pytest.mark.parametrize(("text", "want", "level"), [
    (DATALOADER_BUS, "shared-memory", "error"),
    (DATALOADER_KILLED, "dataloader-worker-error", "error"),
    (DATALOADER_SEGV, "dataloader-worker-error", "error"),
    (DATALOADER_KILLED.replace("[rank3]: ", ""), "dataloader-worker-error", "note"),
    (OFI_REGISTER, "ofi-memory-registration", "error"),
    (CUDA_FORK, "cuda-unavailable", "error"),
    ("AssertionError: Torch not compiled with CUDA enabled\n", "cuda-unavailable", "note"),
], ids=["dataloader-bus-error", "dataloader-killed", "dataloader-segv", "dataloader-one-process", "efa-register",
        "cuda-fork", "cpu-build-one-process"])
def test_the_neighbours_every_ddp_user_meets(text: str, want: str, level: str) -> None:
    first = explain_text(text).diagnoses[0]
    assert (first.id, first.level) == (want, level)


def test_efa_registration_says_what_its_return_code_means() -> None:
    notes = explain_text(OFI_REGISTER).diagnoses[0].notes
    assert any("EFA installers before 1.29.1" in n and "FI_EFA_SET_CUDA_SYNC_MEMOPS=0" in n for n in notes)


def test_the_rank_the_others_waited_for_is_named_with_its_last_line() -> None:
    """ProcessGroupNCCL.cpp's watchdog timeout on rank 1 while rank 0 evaluates alone (tqdm's redraws glued with
    \\r): the hint names rank 0 and quotes its last redraw, with the line number."""
    log = ("[rank0]: epoch 0 step 100 loss 1.23\n[rank1]: epoch 0 step 100 loss 1.25\n"
           "[rank0]: Evaluating:  12%|#         | 120/1000 [00:30<03:40,  4.0it/s]\r"
           "[rank0]: Evaluating:  13%|#         | 130/1000 [00:33<03:38,  4.0it/s]\n"
           "[rank1]:[E1122 01:39:40.561000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=205, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
           "600001 milliseconds before timing out.\n")
    first = explain_text(log).diagnoses[0]
    assert first.id == "nccl-timeout" and first.ranks == {1}
    hint = next(n for n in first.notes if n.startswith("Rank 0 did not report this timeout"))
    assert "Evaluating:  13%" in hint and ":3)" in hint
    # Every rank that printed lines reported the timeout: nobody to name.
    both = log.replace("[rank0]: Evaluating", "[rank0]: evaluating") + log.splitlines()[-1].replace(
        "[rank1]", "[rank0]").replace("Rank 1]", "Rank 0]") + "\n"
    assert not any("did not report" in n for n in explain_text(both).diagnoses[0].notes)


def test_deepspeeds_pdsh_launcher_losing_a_host_over_ssh() -> None:
    """pdsh src/modules/sshcmd.c: "%p: %s: ssh exited with exit code %d" (%p is pdsh@HOST); DeepSpeed's
    multi-node launcher runs pdsh. Exit code 255 is ssh's own failure."""
    log = ("[2024-01-01 10:00:00,000] [INFO] [multinode_runner.py:80:get_cmd] Running on the following workers: "
           "node1,node2\npdsh@node1: node2: ssh exited with exit code 255\n")
    first = explain_text(log).diagnoses[0]
    assert (first.id, first.details["host"], first.details["exit_code"]) == ("deepspeed-launch-error", ["node2"],
                                                                               ["255"])
    assert any("passwordless ssh" in n for n in first.notes)


@pytest.mark.parametrize(("text", "want"), [
    # torch/csrc/DataLoader.cpp's SIGBUS message in a plain script: that process's failure.
    (DATALOADER_BUS.replace("[rank3]: ", ""), "shared-memory"),
    # torch/cuda/__init__.py / c10's "No CUDA GPUs are available" in a plain script.
    ("RuntimeError: No CUDA GPUs are available\n", "no-gpu-visible"),
    # torch/nn/parallel/data_parallel.py's device check in a script with no DDP.
    ("RuntimeError: module must have its parameters and buffers on device cuda:0 (device_ids[0]) but found one of "
     "them on device: cpu\n", "dataparallel-in-ddp"),
], ids=["dataloader-bus-error", "no-gpu", "dataparallel"])
def test_a_single_process_failure_is_a_note_not_a_false_alarm(text: str, want: str) -> None:
    proc = run_cli(["explain", "--json", "-"], input_text=text)
    got = json.loads(proc.stdout)["diagnoses"]
    assert (proc.returncode, [(d["id"], d["level"]) for d in got]) == (0, [(want, "note")])
    assert "single-process run" in got[0]["title"]


@pytest.mark.parametrize(("text", "want", "detail"), [
    # torch/nn/modules/module.py Module.__getattr__ on the DDP wrapper.
    ("AttributeError: 'DistributedDataParallel' object has no attribute 'config'\n", "ddp-module-attribute",
     ("attribute", ["config"])),
    # ProcessGroupNCCL.cpp (2.0-2.3): the watchdog thread rethrows; c10 names ncclCommWatchdog.
    ("Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1186 "
     "(most recent call first):\n", "nccl-timeout", ("watchdog_frame", ["ncclCommWatchdog"])),
    # torch/distributed/elastic/multiprocessing/api.py's "failed (exitcode: %s) local_rank: %s (pid: %s) ..." cut
    # after the local rank.
    ("E0217 07:42:21.080000 470998 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
     "local_rank: 3\n", "worker-killed-by-signal", ("signal", ["SIGKILL"])),
    # ProcessGroupNCCL.cpp broadcastUniqueNCCLID's message, cut before "store by key".
    ("RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value\n",
     "nccl-uniqueid-timeout", None),
    # CPython subprocess.CalledProcessError.__str__ for a negative return code, raised by torch 1.x's launch.py.
    ("subprocess.CalledProcessError: Command '['/opt/conda/bin/python', '-u', 'train.py', '--local_rank=1', "
     "'--batch', '16']' died with <Signals.SIGSEGV: 11>.\n", "worker-killed-by-signal", ("signal", ["SIGSEGV"])),
    # NCCL's CUDACHECK (src/include/checks.h) quoting the sticky error an earlier kernel left: the kernel is the cause.
    ("gpu-dev006:25487:25487 [1] init.cc:924 NCCL WARN Cuda failure 'device-side assert triggered'\n"
     "terminate called after throwing an instance of 'std::runtime_error'\n"
     "  what():  NCCL error in: /opt/conda/torch/lib/c10d/../c10d/NCCLUtils.hpp:136, unhandled cuda error, NCCL "
     "version 2.7.8\n", "cuda-kernel-error", ("cuda_error", ["device-side assert triggered"])),
], ids=["ddp-attribute", "watchdog-frame-only", "exitcode-without-pid", "uniqueid-cut", "launch-died-with-signal",
        "nccl-cuda-failure-device-assert"])
def test_more_of_what_pastes_hold(text: str, want: str, detail: tuple[str, list[str]] | None) -> None:
    first = explain_text(text).diagnoses[0]
    assert first.id == want
    if detail is not None:
        assert first.details[detail[0]] == detail[1]


def test_a_missing_script_is_named_in_the_report() -> None:
    # CPython's "can't open file '%s': [Errno %d] %s", behind pdsh's "host: " prefix.
    line = "10.141.250.227: /usr/bin/python3: can't open file 'train_mpu.py': [Errno 2] No such file or directory\n"
    first = explain_text(line).diagnoses[0]
    assert first.id == "script-not-found" and any("'train_mpu.py'" in n for n in first.notes)


def test_interleaved_tracebacks_are_a_multi_process_job() -> None:
    """Two processes writing to one terminal cut each other's tracebacks (a header right after a frame line);
    one process never prints that. The same OOM in one whole traceback stays a single-process note."""
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
           "79.10 GiB of which 1.19 GiB is free.\n")
    frame = '  File "/work/train.py", line 88, in <module>\n    main()\n'
    interleaved = "Traceback (most recent call last):\n" + frame + "Traceback (most recent call last):\n" + frame + oom
    assert [(d.id, d.level) for d in explain_text(interleaved).diagnoses] == [("cuda-oom", "error")]
    whole = "Traceback (most recent call last):\n" + frame + oom
    assert [(d.id, d.level) for d in explain_text(whole).diagnoses] == [("cuda-oom", "note")]
