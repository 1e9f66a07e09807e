"""What `explain` reads from pastes cut short or made of one line (issue 33, second round).

* a traceback cut before its exception line: the innermost frame of torch.distributed / DDP / torchrun code names
  the step that failed, and the diagnosis says it is a guess from that frame, below any real message;
* torchrun's failure summary cut after its head (`<NO_OTHER_FAILURES>`), torch.distributed.launch's
  `CalledProcessError` for a worker (`--local_rank=N`), mmcv's MMDataParallel refusing several GPUs, NCCL's
  connect retries with no final WARN, DeepSpeed's batch assertion (with the arithmetic), a bare `AssertionError`
  ending the tracebacks of several ranks.

The frame names and message texts are quoted from the sources that print them (named next to each).
"""

from __future__ import annotations

import json

import pytest

from ddpdoctor.explain import explain_text
from tests.support import run_cli


def _json(text: str) -> tuple[int, list[dict]]:
    proc = run_cli(["explain", "--json", "-"], input_text=text)
    return proc.returncode, json.loads(proc.stdout)["diagnoses"]


# --- a traceback cut before its message -----------------------------------------------------------------

# torch/nn/parallel/distributed.py (DistributedDataParallel.__init__, torch 1.11+) calls
# _verify_param_shape_across_processes (torch/distributed/utils.py), DDP's first collective; the paste stops there.
CUT_IN_DDP_INIT = (
    '[rank1]: Traceback (most recent call last):\n'
    '[rank1]:   File "/home/u/train.py", line 88, in <module>\n'
    '[rank1]:     model = DDP(model, device_ids=[local_rank])\n'
    '[rank1]:   File "/opt/conda/lib/python3.10/site-packages/torch/nn/parallel/distributed.py", line 798, in __init__\n'
    '[rank1]:     _verify_param_shape_across_processes(self.process_group, parameters)\n'
    '[rank1]:   File "/opt/conda/lib/python3.10/site-packages/torch/distributed/utils.py", line 269, in '
    '_verify_param_shape_across_processes\n'
    '[rank1]:     return dist._verify_params_across_processes(process_group, tensors, logger)\n')
# torch 2.1+ wraps the c10d calls in c10d_logger.py's `wrapper` (`return func(*args, **kwargs)`): a frame that only
# passes the call on; the user's own frame names it.
CUT_IN_INIT = (
    'Traceback (most recent call last):\n'
    '  File "/home/u/train.py", line 12, in <module>\n'
    '    dist.init_process_group(backend="nccl")\n'
    '  File "/usr/lib/python3.10/site-packages/torch/distributed/c10d_logger.py", line 79, in wrapper\n'
    '    return func(*args, **kwargs)\n')
# torch/distributed/launcher/api.py (launch_agent): raise ChildFailedError(name=..., failures=...), the summary cut.
CUT_AT_CHILD_FAILED = (
    'Traceback (most recent call last):\n'
    '  File "/usr/bin/torchrun", line 8, in <module>\n'
    '    sys.exit(main())\n'
    '  File "/usr/lib/python3.10/site-packages/torch/distributed/run.py", line 812, in run\n'
    '    elastic_launch(\n'
    '  File "/usr/lib/python3.10/site-packages/torch/distributed/launcher/api.py", line 263, in launch_agent\n'
    '    raise ChildFailedError(\n')
# A cut traceback in the user's model: no distributed call is the innermost frame.
CUT_IN_MODEL = (
    'Traceback (most recent call last):\n'
    '  File "/home/u/train.py", line 120, in <module>\n'
    '    loss = model(batch)\n'
    '  File "/home/u/model.py", line 40, in forward\n'
    '    x = self.attn(x)\n')


def test_a_cut_traceback_in_ddps_constructor_is_a_guess_named_as_one() -> None:
    code, diags = _json(CUT_IN_DDP_INIT)
    first = diags[0]
    assert (code, first["id"], first["ranks"]) == (1, "traceback-cut", [1])
    assert "_verify_param_shape_across_processes" in first["title"] and "a guess" in first["title"]
    assert first["details"]["stage"] == ["ddp-init"]
    assert any("the model differs between ranks" in n for n in first["notes"])


def test_a_cut_traceback_names_the_users_own_call_through_c10ds_logging_wrapper() -> None:
    got = explain_text(CUT_IN_INIT).diagnoses[0]
    assert got.id == "traceback-cut" and "init_process_group" in got.signature.title
    assert got.details["stage"] == ["init"]
    assert any('dist.init_process_group(backend="nccl")' in e.text for e in got.evidence)


def test_torchruns_traceback_cut_at_child_failed_error_is_a_failed_worker() -> None:
    code, diags = _json(CUT_AT_CHILD_FAILED)
    assert (code, diags[0]["id"]) == (1, "worker-failed")
    assert "cut before its failure summary" in diags[0]["title"]


def test_a_cut_traceback_in_the_model_gives_no_guess() -> None:
    proc = run_cli(["explain", "-"], input_text=CUT_IN_MODEL)
    assert proc.returncode == 0 and "no known DDP/NCCL/torchrun error found" in proc.stdout


def test_a_real_message_ranks_above_the_guess() -> None:
    """A rank's NCCL error, then another rank's traceback cut in the same constructor: the message first, the
    guess under it (a consequence, never a rival root cause)."""
    text = ("[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
            "version 2.20.5\n" + CUT_IN_DDP_INIT)
    ids = [d.id for d in explain_text(text).diagnoses]
    assert ids[0] != "traceback-cut" and "traceback-cut" in ids


def test_a_whole_traceback_is_not_a_cut_one() -> None:
    text = CUT_IN_INIT + "ValueError: Error initializing torch.distributed using env:// rendezvous: environment " \
                         "variable RANK expected, but not set\n"
    ids = [d.id for d in explain_text(text).diagnoses]
    assert ids[:1] == ["env-not-set"] and "traceback-cut" not in ids


# --- one-line and cut pastes of launchers and frameworks ---------------------------------------------------

# torch/distributed/elastic/multiprocessing/errors/__init__.py (ChildFailedError.format_msg): the head of the summary.
SUMMARY_HEAD = ("============================================================\n"
                "train.py FAILED\n"
                "------------------------------------------------------------\n"
                "Failures:\n"
                "  <NO_OTHER_FAILURES>\n")
# torch/distributed/launch.py (torch 1.x main()): raise subprocess.CalledProcessError(returncode=..., cmd=cmd).
LAUNCH_CALLED_PROCESS = ("subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'tools/train.py', "
                         "'--local_rank=3', 'configs/x.py', '--launcher', 'pytorch']' returned non-zero exit "
                         "status 2.\n")
# mmcv/parallel/data_parallel.py (MMDataParallel.train_step, mmcv 1.x): the assertion's literals joined.
MMDP = ("AssertionError: MMDataParallel only supports single GPU training, if you need to train with multiple GPUs, "
        "please use MMDistributedDataParallelinstead.\n")
# NCCL src/misc/socket.cc: INFO(NCCL_ALL, "Call to connect returned %s, retrying", strerror(errno)) every 1000 tries.
NCCL_RETRIES = "".join(f"node-1:16:63 [{r}] NCCL INFO Call to connect returned Connection refused, retrying\n"
                       for r in (0, 2, 0, 2))
# deepspeed/runtime/config.py (_batch_assertion).
DS_BATCH = ("AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
            "gradient_acc_step * world_size 64 != 4 * 8 * 4\n")


def test_torchruns_summary_cut_after_its_head_is_a_failed_worker() -> None:
    code, diags = _json(SUMMARY_HEAD)
    assert (code, diags[0]["id"]) == (1, "worker-failed")
    assert any("Root Cause (first observed failure)" in n for n in diags[0]["notes"])


def test_the_old_launchers_called_process_error_names_the_worker() -> None:
    code, diags = _json(LAUNCH_CALLED_PROCESS)
    first = diags[0]
    assert (code, first["id"]) == (1, "worker-failed")
    assert first["details"]["worker_local_rank"] == ["3"] and first["details"]["exit_code"] == ["2"]
    assert any("argparse" in n for n in first["notes"])


def test_mmcvs_data_parallel_asked_for_several_gpus_wants_the_distributed_launcher() -> None:
    code, diags = _json(MMDP)
    assert (code, diags[0]["id"]) == (1, "env-not-set")
    assert any("tools/dist_train.sh" in n for n in diags[0]["notes"])


def test_nccls_connect_retries_without_the_final_warn_are_a_connect_failure() -> None:
    code, diags = _json(NCCL_RETRIES)
    assert (code, diags[0]["id"]) == (1, "nccl-connect-failed")
    assert any("1000 refused attempts" in n for n in diags[0]["notes"])


def test_deepspeeds_batch_assertion_says_the_batch_size_this_launch_needs() -> None:
    code, diags = _json(DS_BATCH)
    first = diags[0]
    assert (code, first["id"]) == (1, "deepspeed-config-error")
    assert any("must be 4 * 8 * 4 = 128, not 64" in n and "fit 2 processes" in n for n in first["notes"])


BARE_ASSERT = ('Traceback (most recent call last):\n  File "/w/dinov2/train/train.py", line 322, in <module>\n'
               "    main(args)\n  File \"/w/dinov2/train/train.py\", line 279, in do_train\n"
               "    raise AssertionError\nAssertionError\n")


def test_a_bare_assertion_error_ending_several_ranks_tracebacks_is_named() -> None:
    """One process prints one uncaught traceback: the same exception line ending tracebacks back to back is
    several ranks failing alike (lines.interleaved_tracebacks), and the bare name is the exception line."""
    code, diags = _json(BARE_ASSERT * 3)
    assert (code, diags[0]["id"]) == (1, "python-exception")
    assert diags[0]["details"]["exception"] == ["AssertionError"]


def test_one_bare_assertion_error_of_one_script_is_no_false_alarm() -> None:
    proc = run_cli(["explain", "-"], input_text=BARE_ASSERT)
    assert proc.returncode == 0


# --- texts as they reach a paste: trimmed line ends, torch 1.x wordings, gloo's uncaught enforce ---------------

def test_a_message_whose_trailing_space_was_trimmed_still_matches_its_template() -> None:
    """c10d prints "NCCL communicator was aborted on rank N. " + the reason (torch/csrc/distributed/c10d/
    NCCLUtils.cpp); with no reason the line ends in a space that editors and trackers trim."""
    for line in ("RuntimeError: NCCL communicator was aborted on rank 0.\n",
                 "[rank3]: RuntimeError: [Rank 3] NCCL communicator was aborted on rank 3.\n"):
        assert [d.id for d in explain_text(line).diagnoses][:1] == ["nccl-comm-aborted"], line


def test_torch_1x_default_group_assertion() -> None:
    # torch/distributed/distributed_c10d.py, torch 1.0-1.8 (_check_default_pg).
    got = explain_text("AssertionError: Default process group is not initialized\n").diagnoses
    assert [d.id for d in got][:1] == ["default-pg-not-initialized"]


def test_gloos_uncaught_size_enforce_is_a_collective_mismatch() -> None:
    # gloo/transport/tcp/pair.cc: GLOO_ENFORCE_LE(op.preamble.length, op.nbytes), uncaught in a gloo thread.
    text = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
            "  what():  [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
            "op.preamble.length <= op.nbytes. 8773632 vs 8386560\n")
    first = explain_text(text).diagnoses[0]
    assert first.id == "collective-mismatch"
    assert first.details["received_length"] == ["8773632"] and first.details["expected_length"] == ["8386560"]


def test_a_cut_init_traceback_on_windows_asking_for_nccl_is_probably_no_nccl() -> None:
    """PyTorch's Windows and macOS builds have no NCCL (distributed_c10d.py: 'Distributed package doesn't have NCCL
    built in'): a traceback cut in init_process_group, with Windows paths and backend="nccl" on a code line."""
    text = ('Traceback (most recent call last):\n'
            '  File "C:\\Users\\me\\proj\\train.py", line 30, in <module>\n'
            '    dist.init_process_group(backend="nccl", init_method="env://")\n'
            '  File "C:\\Users\\me\\miniconda3\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py", line 907, '
            'in init_process_group\n'
            '    default_pg = _new_process_group_helper(\n')
    code, diags = _json(text)
    assert (code, diags[0]["id"]) == (1, "nccl-not-available")
    assert "on Windows" in diags[0]["title"] and "a guess" in diags[0]["title"]
    # The same frames on Linux stay the step's guess, not this cause.
    linux = text.replace("C:\\Users\\me", "/home/me").replace("\\", "/")
    assert [d.id for d in explain_text(linux).diagnoses] == ["traceback-cut"]


def test_a_cut_init_traceback_on_windows_through_accelerate_is_probably_no_nccl() -> None:
    """accelerate's PartialState passes the backend it chose, "nccl" whenever CUDA is available (accelerate/state.py,
    0.25 to 1.15), so its init_process_group(backend=self.backend) line on Windows asks for NCCL too."""
    text = ('Traceback (most recent call last):\n'
            '  File "D:\\AI\\sd-scripts\\train_network.py", line 996, in <module>\n'
            '    trainer.train(args)\n'
            '  File "D:\\AI\\Python\\Lib\\site-packages\\accelerate\\state.py", line 217, in __init__\n'
            '    torch.distributed.init_process_group(backend=self.backend, **kwargs)\n'
            '  File "D:\\AI\\Python\\Lib\\site-packages\\torch\\distributed\\c10d_logger.py", line 74, in wrapper\n')
    code, diags = _json(text)
    assert (code, diags[0]["id"]) == (1, "nccl-not-available") and "on Windows" in diags[0]["title"]
    linux = text.replace("D:\\AI", "/opt/ai").replace("\\", "/")
    assert [d.id for d in explain_text(linux).diagnoses] == ["traceback-cut"]


# torch/multiprocessing/spawn.py (ProcessRaisedException): "-- Process %d terminated with the following error:" and
# the process's traceback; here cut inside the model, whose frames name no distributed step.
SPAWN_CUT = ('-- Process 1 terminated with the following error:\n'
             'Traceback (most recent call last):\n'
             '  File "/env/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", line 74, in _wrap\n'
             '    fn(i, *args)\n'
             '  File "/test/test.py", line 48, in test_model\n'
             '    y_pred = model_ddp(x)\n'
             '  File "/env/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1355, in _run_ddp_forward\n'
             '    return self.module(*inputs, **kwargs)  # type: ignore[index]\n'
             '  File "/env/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1518, in _wrapped_call_impl\n'
             '    return self._call_impl(*args, **kwargs)\n')


def test_a_spawned_process_whose_traceback_is_cut_raised_an_exception() -> None:
    code, diags = _json(SPAWN_CUT)
    assert (code, diags[0]["id"], diags[0]["ranks"]) == (1, "python-exception", [1])
    assert diags[0]["title"].startswith("Process 1 of mp.spawn raised a Python exception")
    assert "-- Process 1 terminated with the following error:" in diags[0]["evidence"][0]["text"]
    # Whole, the traceback's own exception line is the diagnosis (no guess beside it).
    whole = explain_text(SPAWN_CUT + "ValueError: Pointer argument cannot be accessed from Triton (cpu tensor?)\n")
    assert [d.id for d in whole.diagnoses] == ["python-exception"]
    assert whole.diagnoses[0].details["exception"] == ["ValueError"]


# --- frameworks that only run as a multi-process job ----------------------------------------------------------

# A frame of Megatron-LM (megatron/core/...) above an exception: Megatron runs as a torchrun/Slurm job even on
# one GPU, so its frames are a sign of a distributed job as torch.distributed's are. A Pai-Megatron-Patch user's
# paste (pp2_inputs_embeds_none_attribute_error_glued_mistral_pai_megatron.log, a tuning-half log of issue 33's
# second set) was one such frame and its AttributeError, and was met with silence.
MEGATRON_FRAME = (
    'Traceback (most recent call last):\n'
    '  File "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", line 381, in forward_step\n'
    '    output_tensor, loss_func = forward_step_func(data_iterator, model)\n'
    "AttributeError: 'NoneType' object has no attribute 'dtype'\n")


@pytest.mark.parametrize("frame", ["/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py",
                                   "/opt/conda/lib/python3.10/site-packages/colossalai/booster/booster.py",
                                   "/opt/conda/lib/python3.10/site-packages/torchtitan/train.py",
                                   "/opt/conda/lib/python3.10/site-packages/fairscale/nn/data_parallel/fsdp.py"])
def test_an_exception_under_a_multi_process_frameworks_frame_is_a_ranks_exception(frame: str) -> None:
    code, diags = _json(MEGATRON_FRAME.replace(
        "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", frame))
    assert (code, diags[0]["id"]) == (1, "python-exception")
    assert diags[0]["details"]["exception"] == ["AttributeError"]


def test_the_same_exception_in_a_one_process_script_is_no_false_alarm() -> None:
    proc = run_cli(["explain", "-"], input_text=MEGATRON_FRAME.replace(
        "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", "/home/u/model/schedules.py"))
    assert proc.returncode == 0


def test_a_fatal_signal_in_a_megatron_ray_actor_is_a_workers_death_and_alone_a_note() -> None:
    """Ray prefixes an actor's lines with its class name: a Megatron trainer's (`MegatronPolicyTrainer`) is a rank
    of a Megatron job, so faulthandler's report of its abort is a worker's death, not one process's crash."""
    line = "(MegatronPolicyTrainer pid=15469, ip=10.100.0.114) Fatal Python error: Aborted\n"
    code, diags = _json(line)
    assert (code, diags[0]["id"], diags[0]["details"]["fatal_error"]) == (1, "worker-killed-by-signal", ["Aborted"])
    assert run_cli(["explain", "-"], input_text=line.replace("MegatronPolicyTrainer", "PolicyTrainer")).returncode == 0
