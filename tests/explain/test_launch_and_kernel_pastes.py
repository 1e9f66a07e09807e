"""Pastes of issue 33's later sets' tuning halves, in the general form their sources print (issue 33).

* several ranks writing the same exception line into one stream at once (``RuntimeErrorRuntimeError: ...``), a sign
  of a multi-process job as interleaved tracebacks are;
* torchrun's own traceback cut right after ``ChildFailedError:`` (its failure table, which starts on the next line,
  not pasted);
* a CUDA kernel's device-side assertion as the GPU prints it (``<file>.cu:N: <fn>: block: [..], thread: [..]
  Assertion `...` failed.``);
* a script reading a launcher's variable that is not set (``KeyError: 'MASTER_HOST'``: torchpack's dist-run, Slurm's
  and MPI's variables beside torchrun's);
* (the tenth and eleventh sets) exception lines behind Open MPI's ``[1,0]<stderr>:`` tags, OpenMMLab's anomalous
  parameters lines, a PyTorch without ``torch.distributed``, and NCCL's watchdog raising a CUDA error from its event
  query (``WorkNCCL::finishedGPUExecutionInternal`` in the C++ frames).

The sources of each text are in ddpdoctor/explain/kb.json next to its pattern.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.explain import explain_text


def _verdict(text: str) -> tuple[int, list[dict]]:
    """`ddpdoctor explain --json -` on ``text``: its exit code and diagnoses. The CLI runs in this process
    (typer's runner): dozens of one-line pastes, each a Python start-up as a subprocess, cost the suite ~10 s."""
    run = CliRunner().invoke(app, ["explain", "--json", "-"], input=text)
    assert run.exception is None or isinstance(run.exception, SystemExit), run.exception
    return run.exit_code, json.loads(run.stdout)["diagnoses"]


TE = "/opt/te/transformer_engine/common/fused_attn/fused_attn_f16_arbitrary_seqlen.cu:227"


def _one_process(text: str) -> str:
    """What a log with no sign of a distributed job gets for an exception ddpdoctor has no signature for: exit 0,
    one note worded for one process that names it (no silence, no false alarm). Returns the exception named."""
    code, diags = _verdict(text)
    assert (code, [(d["id"], d["level"]) for d in diags]) == (0, [("python-exception", "note")]), diags
    assert diags[0]["title"].startswith("This process raised")
    return str(diags[0]["exception"]["exception"])


def test_exception_lines_glued_by_several_ranks_are_a_distributed_failure_named_once() -> None:
    glued = (f"RuntimeErrorRuntimeError: RuntimeError{TE} in function operator(): cuDNN Error: [cudnn_frontend] "
             "Error: No execution plans built successfully.\n"
             f": : : {TE} in function operator(): cuDNN Error: [cudnn_frontend] Error: No execution plans built\n")
    code, diags = _verdict(glued)
    assert code == 1
    assert diags[0]["id"] == "python-exception"
    said = diags[0]["exception"]
    assert (said["exception"], said["message"][:len(TE)]) == ("RuntimeError", TE), said
    assert diags[0]["details"]["exception"] == ["RuntimeError"]
    # The same line written once, by one process with no sign of a job around it, stays that process's own error.
    alone = f"RuntimeError: {TE} in function operator(): cuDNN Error: [cudnn_frontend] Error: No execution plans\n"
    assert _one_process(alone) == "RuntimeError"


def test_torchruns_traceback_cut_after_childfailederror_says_a_worker_failed() -> None:
    cut = ('Traceback (most recent call last):\n'
           '  File "/home/u/.local/bin/torchrun", line 8, in <module>\n'
           '    sys.exit(main())\n'
           '  File "/home/u/.local/lib/python3.9/site-packages/torch/distributed/launcher/api.py", line 264, in '
           'launch_agent\n'
           '    raise ChildFailedError(\n'
           'torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n')
    code, diags = _verdict(cut)
    assert code == 1
    assert [d["id"] for d in diags] == ["worker-failed"]
    assert "ChildFailedError" in diags[0]["evidence"][0]["text"]


ASSERTION = ("../aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [0,0,0], thread: [3,0,0] Assertion "
             "`-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.")


def test_a_kernels_own_assertion_is_a_cuda_kernel_error_quoting_it() -> None:
    log = ("Training 1/1.0 epoch:   0%|          | 0/104 [00:00<?, ?it/s]" + ASSERTION + "\n"
           "[rank6]: Traceback (most recent call last):\n"
           '[rank6]:   File "/opt/app/ppo.py", line 508, in <module>\n')
    code, diags = _verdict(log)
    assert code == 1
    assert diags[0]["id"] == "cuda-kernel-error"
    assert diags[0]["ranks"] == [] or diags[0]["ranks"] == [6]
    assert "index out of bounds" in diags[0]["evidence"][0]["text"]
    # One process with no sign of a job: its own failure, shown as a note (the single-process device-assert rule).
    assert [(d.id, d.signature.role) for d in explain_text(ASSERTION + "\n").diagnoses] == [("cuda-kernel-error", "note")]
    code, diags = _verdict(ASSERTION + "\n")
    assert code == 0 and [d["id"] for d in diags] == ["cuda-kernel-error"]


def test_a_launchers_variable_missing_is_a_script_started_without_its_launcher() -> None:
    for variable in ("MASTER_HOST", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "LOCAL_RANK"):
        log = ('Traceback (most recent call last):\n'
               '  File "/home/u/bevfusion/tools/train.py", line 24, in main\n'
               '    dist.init()\n'
               '  File "/home/u/env/lib/python3.8/os.py", line 673, in __getitem__\n'
               '    raise KeyError(key) from None\n'
               f"KeyError: '{variable}'\n")
        code, diags = _verdict(log)
        assert (code, diags[0]["id"]) == (1, "env-not-set"), variable
    # Any other missing key is the script's own KeyError, not a launcher's variable.
    assert _one_process("KeyError: 'up_blocks.0'\n") == "KeyError"


def test_mpirun_and_horovodrun_tagged_exception_lines_name_the_ranks() -> None:
    # Open MPI's --tag-output (horovodrun runs mpirun with it): [jobid,rank]<stderr>: before each line.
    lines = []
    for rank in (1, 0):
        lines += [f"[1,{rank}]<stderr>:Traceback (most recent call last):",
                  f'[1,{rank}]<stderr>:  File "trainer.py", line 31, in <module>',
                  f"[1,{rank}]<stderr>:    BATCH_SIZE = int(args.b_size) or 16384",
                  f"[1,{rank}]<stderr>:AttributeError: 'Namespace' object has no attribute 'b_size'"]
    code, diags = _verdict("\n".join(lines) + "\n")
    assert code == 1
    assert diags[0]["id"] == "python-exception" and diags[0]["ranks"] == [0, 1]
    assert diags[0]["first_rank"] == 1  # the first in the paste
    assert diags[0]["exception"]["frame"] == "trainer.py:31 in <module>"


def test_openmmlabs_anomalous_parameter_lines_are_unused_parameters_named() -> None:
    log = ("08/03 15:04:42 - mmengine - ERROR - mmengine/logging/logger.py - print_log - 323 - "
           "module.backbone.final.kernel with shape torch.Size([96, 96]) is not in the computational graph\n"
           "module.backbone.final.bias with shape torch.Size([1, 96]) is not in the computational graph\n")
    code, diags = _verdict(log)
    assert code == 1 and diags[0]["id"] == "unused-parameters"
    assert diags[0]["details"]["param_names"] == ["module.backbone.final.kernel", "module.backbone.final.bias"]


def test_a_pytorch_without_the_distributed_package_is_named_with_a_note() -> None:
    log = ('Traceback (most recent call last):\n'
           '  File "train.py", line 146, in <module>\n'
           '    torch.distributed.init_process_group(backend="nccl", world_size=args.world_size)\n'
           "AttributeError: module 'torch.distributed' has no attribute 'init_process_group'\n")
    code, diags = _verdict(log)
    assert code == 1 and diags[0]["id"] == "nccl-not-available"
    assert any("no distributed package at all" in note for note in diags[0]["notes"])
    # Another module's missing attribute is the script's own error.
    assert _one_process("AttributeError: module 'torch.cuda' has no attribute 'foo'\n") == "AttributeError"


def test_the_watchdog_raising_a_cuda_error_from_its_event_query_is_a_kernel_error() -> None:
    lib = "/opt/venv/lib/python3.12/site-packages/torch/lib"
    log = ("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n\n"
           "Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:44 "
           "(most recent call first):\n"
           f"frame #2: c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const + 0x50 (0x7fd3 in "
           f"{lib}/libtorch_cuda.so)\n"
           f"frame #3: c10d::ProcessGroupNCCL::WorkNCCL::isCompleted() + 0x68 (0x7fd3 in {lib}/libtorch_cuda.so)\n"
           f"frame #4: c10d::ProcessGroupNCCL::Watchdog::runLoop() + 0x969 (0x7fd3 in {lib}/libtorch_cuda.so)\n")
    code, diags = _verdict(log)
    assert code == 1 and [d["id"] for d in diags] == ["cuda-kernel-error"]
    assert "finishedGPUExecutionInternal" in diags[0]["evidence"][0]["text"]


CUT_IN_MODEL = ['Traceback (most recent call last):',
                '  File "/home/u/sid_train.py", line 393, in <module>',
                '    main()',
                '  File "/home/u/training/loop.py", line 120, in training_loop',
                '    loss = model(batch)',
                '  File "/home/u/env/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1736, in '
                '_wrapped_call_impl',
                '    return self._call_impl(*args, **kwargs)',
                '  File "/home/u/training/networks.py", line 88, in forward']


def test_a_ranks_traceback_cut_in_its_own_code_is_that_rank_raising_worded_as_a_guess() -> None:
    code, diags = _verdict("".join(f"[rank0]: {line}\n" for line in CUT_IN_MODEL))
    assert code == 1
    assert [d["id"] for d in diags] == ["python-exception"] and diags[0]["ranks"] == [0]
    assert diags[0]["title"].startswith("Rank 0 raised an exception in forward (its traceback is cut")
    assert "networks.py" in " ".join(e["text"] for e in diags[0]["evidence"])
    # The same traceback with no sign of a distributed job: one process's own affair, no diagnosis.
    assert _verdict("\n".join(CUT_IN_MODEL) + "\n") == (0, [])
    # With torchrun's failure summary found, that summary is the diagnosis; the cut traceback adds no guess above it.
    block = "[E ... api.py:826] failed (exitcode: 1) local_rank: 0 (pid: 2980343) of binary: /usr/bin/python3\n"
    code, diags = _verdict("".join(f"[rank0]: {line}\n" for line in CUT_IN_MODEL) + block)
    assert [d["id"] for d in diags][:1] == ["worker-failed"]


def test_torchruns_own_traceback_cut_in_its_agent_is_no_ranks_exception() -> None:
    site = "/usr/lib/python3.11/site-packages/torch/distributed"
    log = ("torchrun --nproc_per_node=1 train.py\n"
           "Traceback (most recent call last):\n"
           f'  File "{site}/launcher/api.py", line 237, in launch_agent\n'
           "    result = agent.run()\n"
           f'  File "{site}/elastic/metrics/api.py", line 129, in wrapper\n'
           "    result = f(*args, **kwargs)\n")
    assert "python-exception" not in [d["id"] for d in _verdict(log)[1]]


def test_lightnings_process_launcher_in_the_frames_makes_the_job_distributed() -> None:
    pl = "/env/lib/python3.10/site-packages/pytorch_lightning"
    head = ['Traceback (most recent call last):',
            '  File "/work/train.py", line 455, in main',
            '    trainer.fit(model)']
    launcher = [f'  File "{pl}/strategies/launchers/subprocess_script.py", line 105, in launch',
                '    return function(*args, **kwargs)']
    tail = [f'  File "{pl}/trainer/trainer.py", line 579, in _fit_impl',
            '    self._run(model, ckpt_path=ckpt_path)']
    code, diags = _verdict("\n".join(head + launcher + tail) + "\n")
    assert (code, [d["id"] for d in diags]) == (1, ["python-exception"])
    assert _verdict("\n".join(head + tail) + "\n") == (0, [])


def test_the_twelfth_and_thirteenth_sets_messages_in_their_general_form() -> None:
    # DDP's reducer asserting on zero parameters to bucket (older torch): a module with nothing to train.
    assert_line = ('RuntimeError: tensors.size() > 0 INTERNAL ASSERT FAILED at '
                   '"../torch/csrc/distributed/c10d/reducer.cpp":1929, please report a bug to PyTorch.\n')
    assert _verdict("[rank0]: " + assert_line)[1][0]["id"] == "ddp-no-trainable-parameters"
    # The old launcher killing its workers after a failure, alone, and torchrun's agent line cut after local_rank.
    assert [d["id"] for d in _verdict("Killing subprocess 31867\nKilling subprocess 31868\n")[1]] == ["worker-failed"]
    cut = "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: \n"
    code, diags = _verdict(cut)
    assert (code, [d["id"] for d in diags], diags[0]["details"].get("exit_code")) == (1, ["worker-failed"], ["1"])
    # ... and beside the real error the killing lines add nothing.
    oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\nKilling subprocess 31867\n"
    assert [d["id"] for d in _verdict(oom)[1]] == ["cuda-oom"]


def test_cudas_invalid_argument_is_not_nccls_and_nccls_still_is() -> None:
    cuda = "RuntimeError: CUDA error: invalid argument\nCUDA kernel errors might be asynchronously reported\n"
    assert "nccl-invalid-usage" not in [d["id"] for d in _verdict("[rank0]: " + cuda)[1]]
    nccl = ("[rank0]: RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
            "invalid argument, NCCL version 2.14.3\n")
    assert _verdict(nccl)[1][0]["id"] == "nccl-invalid-usage"


def test_a_build_without_kernels_for_the_gpu_is_named_in_a_job_and_a_note_alone() -> None:
    line = "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    code, diags = _verdict("-- Process 0 terminated with the following error:\n[rank0]: " + line)
    assert (code, diags[0]["id"]) == (1, "cuda-arch-unsupported")
    assert "get_arch_list" in diags[0]["remedy"]
    code, diags = _verdict(line)
    assert (code, [d["id"] for d in diags]) == (0, ["cuda-arch-unsupported"])


def test_a_long_calledprocesserror_wrapped_by_a_terminal_still_names_the_signal() -> None:
    args = ", ".join(f"'--opt{i}', '{i * 7}'" for i in range(40))
    line = (f"subprocess.CalledProcessError: Command '['/opt/conda/bin/python', '-u', 'train.py', '--local_rank=0', "
            f"{args}]' died with <Signals.SIGKILL: 9>.")
    wrapped = "\n".join(line[i:i + 80] for i in range(0, len(line), 80)) + "\n"
    assert len(wrapped.splitlines()) > 8  # more pieces than the scanner rejoins around a keyword
    code, diags = _verdict(wrapped)
    assert (code, diags[0]["id"], diags[0]["details"]["signal"]) == (1, "worker-killed-by-signal", ["SIGKILL"])


def test_verls_workers_and_torch_distributed_error_types_are_signs_of_a_job() -> None:
    ray = "(main_task pid=2022388) "
    log = (f'{ray}  File "/home/u/prime/training/verl/workers/fsdp_workers.py", line 1040, in compute_rm_score\n'
           f"{ray}    token_level_scores, metrics = self.prm.update_policy(rm_data)\n"
           f"{ray}ZeroDivisionError: integer division or modulo by zero\n")
    code, diags = _verdict(log)
    assert (code, diags[0]["id"]) == (1, "python-exception")
    assert diags[0]["exception"]["exception"] == "ZeroDivisionError"
    relayed = ("ray.exceptions.RayTaskError(DistBackendError): ray::FSDPRefRayActorBase.init_model() (pid=305566)\n"
               "KeyError: 'model.layers.0'\n")
    assert _verdict(relayed)[0] == 1
    # Without either, the same exception is the process's own.
    assert _one_process("ZeroDivisionError: integer division or modulo by zero\n") == "ZeroDivisionError"


def test_a_traceback_cut_in_accelerates_state_on_windows_is_probably_no_nccl() -> None:
    site = "F:\\venv\\lib\\site-packages\\accelerate"
    log = ("[W socket.cpp:697] [c10d] The client socket has failed to connect to [host]:29500 (system error: 10049).\n"
           "Traceback (most recent call last):\n"
           '  File "F:\\work\\train_network.py", line 220, in train\n'
           "    accelerator = train_util.prepare_accelerator(args)\n"
           f'  File "{site}\\accelerator.py", line 369, in __init__\n'
           "    self.state = AcceleratorState(\n"
           f'  File "{site}\\state.py", line 732, in __init__\n'
           "    Partia\n")
    code, diags = _verdict(log)
    assert (code, diags[0]["id"]) == (1, "nccl-not-available")
    assert "Windows" in diags[0]["title"] and "a guess" in diags[0]["title"]
