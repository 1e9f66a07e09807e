"""No false alarms (issue 26): a single-process log gets no DDP diagnosis and exit 0, even with a CUDA error in
it; performance hints are notes with exit 0. Exit 1 only for a failure.

Texts from the sources that print them (file named) and from real runs (examples/logs/, captured with the
scripts next to them); the grad-strides logs are the corpus's (tests/data/real_logs/, tuning half).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddpdoctor.explain import explain_text
from tests.support import REPO, clean_env, run_cli

EXAMPLES = REPO / "examples" / "logs"
REAL_LOGS = REPO / "tests" / "data" / "real_logs"

# c10/cuda/CUDAException.cpp (c10_cuda_check_implementation): "CUDA error: " + cudaGetErrorString(err) and its
# three hint lines; the assertion line is ATen's CUDA_KERNEL_ASSERT in aten/src/ATen/native/cuda/IndexKernel.cu.
DEVICE_ASSERT_SINGLE_GPU = """\
../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [492,0,0], thread: [127,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && "index out of bounds"` failed.
Traceback (most recent call last):
  File "/home/user/yolo/train.py", line 412, in <module>
    loss.backward()
  File "/home/user/.local/lib/python3.10/site-packages/torch/_tensor.py", line 581, in backward
    torch.autograd.backward(
RuntimeError: CUDA error: device-side assert triggered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""
# c10/cuda/CUDACachingAllocator.cpp's message (torch >= 2.2), raised in a single-GPU HF Trainer run: its
# traceback goes through site-packages/accelerate/, which is not a sign of a distributed job.
OOM_SINGLE_GPU_TRAINER = """\
Traceback (most recent call last):
  File "/home/user/finetune.py", line 57, in <module>
    trainer.train()
  File "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", line 2325, in train
    return inner_training_loop(
  File "/opt/conda/lib/python3.10/site-packages/accelerate/accelerator.py", line 2246, in backward
    loss.backward(**kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 13.31 MiB is free. Including non-PyTorch memory, this process has 7.76 GiB memory in use. Of the allocated memory 7.42 GiB is allocated by PyTorch, and 196.81 MiB is reserved by PyTorch but unallocated.
"""
# A DataLoader worker on Windows, started by CPython's Lib/multiprocessing/spawn.py (spawn_main -> _main, which
# unpickles the worker's state: "EOFError: Ran out of input" when the parent died first): the standard
# library's spawn.py, not torch's mp.spawn, and no sign of a distributed job.
WINDOWS_DATALOADER_SPAWN = """\
Traceback (most recent call last):
  File "<string>", line 1, in <module>
  File "C:\\Python39\\lib\\multiprocessing\\spawn.py", line 116, in spawn_main
    exitcode = _main(fd, parent_sentinel)
  File "C:\\Python39\\lib\\multiprocessing\\spawn.py", line 126, in _main
    self = reduction.pickle.load(from_parent)
EOFError: Ran out of input
"""


def in_a_job(text: str, rank: int = 1) -> str:
    """The same lines as a torchrun worker prints them."""
    return "".join(f"[rank{rank}]: {line}\n" for line in text.splitlines())


@pytest.mark.parametrize(("text", "in_job_id"), [
    (DEVICE_ASSERT_SINGLE_GPU, "cuda-kernel-error"),
    (OOM_SINGLE_GPU_TRAINER, "cuda-oom"),
    (WINDOWS_DATALOADER_SPAWN, "python-exception"),
], ids=["device-side-assert", "oom-through-accelerate", "stdlib-spawn"])
def test_single_process_cuda_and_python_errors_are_not_ddp_problems(text: str, in_job_id: str) -> None:
    """Issue 33: without a sign of a distributed job, a CUDA OOM or device-side assert is still named, as a note
    worded for one process (exit 0: a failure of that process, not a DDP problem); a plain exception that
    matches no known message is a note naming it, worded for one process."""
    proc = run_cli(["explain", "--json", "-"], input_text=text)
    got = [(d["id"], d["level"]) for d in json.loads(proc.stdout)["diagnoses"]]
    assert (proc.returncode, got) == (0, [(in_job_id, "note")])
    [note] = json.loads(proc.stdout)["diagnoses"]
    if in_job_id == "python-exception":
        assert note["title"].endswith("(the log shows no sign of a distributed job)")
        assert note["exception"]["exception"] == "EOFError"
    else:
        assert "not a DDP problem" in note["title"]
        # The exception and the user's line, although the diagnosis's first line (the kernel's assertion) came
        # before the traceback: a real H200 run (2026-11-28, tests/gpu/test_gpu_explain_rank.py) had them null.
        want_frame = {"cuda-kernel-error": "/home/user/yolo/train.py:412 in <module>"}.get(in_job_id)
        if want_frame:
            assert (note["exception"]["exception"], note["exception"]["frame"]) == ("RuntimeError", want_frame)
    # The same lines from a rank of a torchrun job are that job's failure.
    proc = run_cli(["explain", "--json", "-"], input_text=in_a_job(text))
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["diagnoses"][0]["id"] == in_job_id


@pytest.mark.slow
def test_a_real_single_process_crash_is_exit_0(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch

        model = torch.nn.Linear(4, 2)
        for step in range(3):
            print(f"step {step} loss {model(torch.ones(4)).sum().item():.3f}", flush=True)
        raise RuntimeError("validation set is empty: check --val-dir")
    """))
    with (tmp_path / "train.log").open("wb") as out:
        run = subprocess.run([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT, timeout=120,
                             env=clean_env())
    assert run.returncode == 1 and "validation set is empty" in (tmp_path / "train.log").read_text()
    proc = run_cli(["explain", str(tmp_path / "train.log")])
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.startswith("ddpdoctor explain: no failure found (1 input, ")
    # Named, as a note about that one process: the exception and the script's line.
    assert ("n1. This process raised RuntimeError: validation set is empty: check --val-dir  (at "
            f"{script}:6 in <module>); no sign of a distributed job in the log  [python-exception]") in proc.stdout


def test_a_performance_hint_alone_is_a_note_and_exit_0() -> None:
    """examples/logs/ddp_find_unused_warning.log, a real 2-rank gloo run: reducer.cpp's warning that
    find_unused_parameters=True found nothing unused. The run did not fail: exit 0, shown as a note."""
    proc = run_cli(["explain", str(EXAMPLES / "ddp_find_unused_warning.log")])
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.startswith("ddpdoctor explain: no failure found (1 input, 6 lines); 1 note below.")
    assert "Notes (hints, not failures):" in proc.stdout and "[find-unused-parameters-no-unused]" in proc.stdout
    data = json.loads(run_cli(["explain", "--json", "-", str(EXAMPLES / "ddp_find_unused_warning.log")]).stdout)
    assert [(d["id"], d["role"], d["level"]) for d in data["diagnoses"]] == [
        ("find-unused-parameters-no-unused", "note", "note")]


def test_a_note_next_to_a_failure_comes_last_and_the_failure_sets_exit_1() -> None:
    hint = (EXAMPLES / "ddp_find_unused_warning.log").read_text()
    failure = (EXAMPLES / "ddp_unused_parameters.log").read_text()
    proc = run_cli(["explain", "-"], input_text=hint + failure)
    assert proc.returncode == 1
    out = proc.stdout
    assert out.index("1. ") < out.index("[unused-parameters]") < out.index("Notes (hints, not failures):") < out.index(
        "[find-unused-parameters-no-unused]")
    result = explain_text(hint + failure)
    assert [d.id for d in result.problems] == ["unused-parameters"]


@pytest.mark.parametrize("name", ["healthy_grad_strides_glog_warning_croco.log",
                                  "healthy_grad_strides_userwarning_gcvit.log",
                                  "healthy_grad_strides_runnable_vst.log",
                                  "healthy_grad_strides_after_tqdm_meanflow.log"])
def test_grad_strides_warning_is_not_a_failure(name: str) -> None:
    """reducer.cpp: "Grad strides do not match bucket view strides ... This is not an error, but may impair
    performance." Real logs whose runs went on (tuning half of the corpus)."""
    proc = run_cli(["explain", str(REAL_LOGS / name)])
    assert proc.returncode == 0, proc.stdout


# lightning/fabric/utilities/device_parser.py (_check_data_type/_sanitize_gpu_ids): "You requested gpu: {gpus}\n
# But your machine only has: {all_available_gpus}". More than one GPU asked for is a DDP job (the accelerator
# connector picks the ddp strategy for more than one device); one is a single-process run.
LIGHTNING_GPUS = """\
lightning.fabric.utilities.exceptions.MisconfigurationException: You requested gpu: {requested}
 But your machine only has: [0]
"""
# c10/cuda/CUDACachingAllocator.cpp's OOM message, the same in every case below.
OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.10 GiB of which 1.19 GiB is free.\n")


@pytest.mark.parametrize(("text", "distributed"), [
    (LIGHTNING_GPUS.format(requested="[0, 1]"), True),
    (LIGHTNING_GPUS.format(requested="[1]"), False),
    # torchrun --tee 3 / --log-line-prefix-template: each worker line starts with [default<rank>]:
    ("".join(f"[default1]:{line}\n" for line in OOM_LINE.splitlines()), True),
    # mpirun / horovodrun --tag-output: [jobid,rank]<stream>:
    ("".join(f"[1,1]<stderr>:{line}\n" for line in OOM_LINE.splitlines()), True),
    # lightning/fabric/utilities/distributed.py, _init_dist_connection's log line
    ("Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2\n" + OOM_LINE, True),
    # accelerate/state.py PartialState.__repr__; "NO" when there is one process
    ("Distributed environment: MULTI_GPU  Backend: nccl\nNum processes: 2\n" + OOM_LINE, True),
    ("Distributed environment: NO\nNum processes: 1\n" + OOM_LINE, False),
    # transformers' examples (run_clm.py, ...): the summary each process logs
    ("Process rank: 1, device: cuda:1, n_gpu: 1, distributed training: True, 16-bits training: False\n" + OOM_LINE,
     True),
    ("Process rank: 0, device: cuda:0, n_gpu: 1, distributed training: False, 16-bits training: False\n" + OOM_LINE,
     False),
    # the rendezvous variables, echoed by a launch script
    ("MASTER_ADDR=node-0 MASTER_PORT=29500 WORLD=2\n" + OOM_LINE, True),
], ids=["lightning-2-gpus", "lightning-1-gpu", "torchrun-tee-prefix", "open-mpi-tag-output", "lightning-init",
        "accelerate-multi-gpu", "accelerate-no", "hf-example-distributed", "hf-example-single", "master-addr"])
def test_what_only_a_distributed_job_prints_makes_its_errors_ddp_problems(text: str, distributed: bool) -> None:
    """A sign of a distributed job the launchers and frameworks print (lines.DIST_CONTEXT) turns the same error
    into a DDP diagnosis (exit 1); its single-process counterpart leaves an OOM a note about that one process
    (exit 0) and names an invalid device in that process's words."""
    proc = run_cli(["explain", "--json", "-"], input_text=text)
    got = json.loads(proc.stdout)["diagnoses"]
    if distributed:
        assert (proc.returncode, got[0]["level"]) == (1, "error"), got
        assert "a single-process run" not in got[0]["title"] and "this process" not in got[0]["title"]
    elif "requested gpu" in text:
        # Lightning's "You requested gpu: [1] But your machine only has: [0]" is CUDA's invalid device ordinal
        # in one process: named (issue 33: no silence on a known message), worded for that process.
        assert (proc.returncode, got[0]["id"]) == (1, "invalid-device-ordinal"), got
        assert got[0]["title"].startswith("The process asked for a GPU that does not exist")
    else:
        assert (proc.returncode, [(d["id"], d["level"]) for d in got]) == (0, [("cuda-oom", "note")]), got


# A rank that pastes only its own traceback: no rank prefix, no launcher line, but the frames go through DDP's own
# module (torch 2.x torch/nn/parallel/distributed.py: DistributedDataParallel.forward -> _run_ddp_forward), which
# only a DDP job runs. The same traceback through DataParallel (one process, several GPUs) is no DDP job.
DDP_FORWARD_TRACEBACK = """\
Traceback (most recent call last):
  File "/home/u/train.py", line 88, in <module>
    loss = model(batch).loss
  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1518, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/opt/conda/lib/python3.10/site-packages/torch/nn/parallel/distributed.py", line 1519, in forward
    else self._run_ddp_forward(*inputs, **kwargs)
  File "/opt/conda/lib/python3.10/site-packages/torch/nn/parallel/distributed.py", line 1355, in _run_ddp_forward
    return self.module(*inputs, **kwargs)  # type: ignore[index]
  File "/home/u/model.py", line 40, in forward
    mask = self.mask[:, :, :T, :T]
AttributeError: 'GPT' object has no attribute 'mask'
"""


def test_a_traceback_through_ddps_forward_is_a_ranks_failure() -> None:
    proc = run_cli(["explain", "--json", "-"], input_text=DDP_FORWARD_TRACEBACK)
    assert proc.returncode == 1, proc.stdout
    [first] = json.loads(proc.stdout)["diagnoses"]
    assert first["id"] == "python-exception" and first["exception"]["frame"] == "/home/u/model.py:40 in forward"
    one_process = DDP_FORWARD_TRACEBACK.replace("parallel/distributed.py", "parallel/data_parallel.py")
    proc = run_cli(["explain", "--json", "-"], input_text=one_process)
    assert proc.returncode == 0
    assert [(d["id"], d["level"]) for d in json.loads(proc.stdout)["diagnoses"]] == [("python-exception", "note")]


# mmdet/apis/test.py's two test loops (mmcv/engine/test.py alike): multi_gpu_test runs under a process group and
# collects every rank's results through get_dist_info; single_gpu_test is one process.
MMDET_TEST = """Traceback (most recent call last):
  File "tools/test.py", line 231, in main
    outputs = {loop}(model, data_loader{args})
  File "/opt/mmdet/apis/test.py", line 88, in {loop}
    for i, data in enumerate(data_loader):
KeyError: 'img_metas'
"""


def test_openmmlabs_multi_gpu_test_is_a_sign_of_a_distributed_job() -> None:
    """A plain exception in a one-process run is a note about that process (exit 0); the same exception inside
    OpenMMLab's distributed test loop is a rank's failure (exit 1)."""
    many = run_cli(["explain", "--json", "-"], input_text=MMDET_TEST.format(loop="multi_gpu_test", args=", args.tmpdir"))
    assert many.returncode == 1
    assert [d["id"] for d in json.loads(many.stdout)["diagnoses"]] == ["python-exception"]
    one = run_cli(["explain", "--json", "-"], input_text=MMDET_TEST.format(loop="single_gpu_test", args=""))
    assert one.returncode == 0
    assert [(d["id"], d["level"]) for d in json.loads(one.stdout)["diagnoses"]] == [("python-exception", "note")]
