"""Message families found by issue 33's research note (old torch wheels' texts, libcudart's strings), and the
neighbours' texts read from their sources (FSDP's _p_assert messages, torchrun's restart line).

Every text below is built from the format string of the release named next to it (the wheel's `.py` file or the
string constant in its `libtorch*`/`libcudart`), not from a log: a positive per wording and release, and the
negatives the note lists.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.explain import explain_text
from tests.support import run_cli

# --- 1. FSDP's grad_fn assertion -------------------------------------------------------------------------
# torch/distributed/fsdp/_runtime_utils.py, _register_post_backward_hook:
#   _p_assert(temp_flat_param.grad_fn is not None,
#             "The `grad_fn` is needed to access the `AccumulateGrad` and " "register the post-backward hook")
# 2.13.0 (cf30153c) line 1461, 2.1.2 (a8e7c98c) 1437, 2.0.1 (e9ebda29) 1238; 1.13.1 (49444c3e)
# fully_sharded_data_parallel.py:3179 through fsdp/_utils.p_assert. _p_assert prints the message alone, then the
# stack, then raises AssertionError(msg) (2.0+) or a bare AssertionError (1.13.x, fsdp/_utils.py:149).
GRAD_FN = "The `grad_fn` is needed to access the `AccumulateGrad` and register the post-backward hook"


def _fsdp_2x(line: int, path: str) -> str:
    return (f"[rank1]: {GRAD_FN}\n[rank1]: Traceback (most recent call last):\n"
            f'[rank1]:   File "/venv/lib/python3.10/site-packages/torch/distributed/fsdp/{path}", line {line}, '
            "in _register_post_backward_hook\n[rank1]:     _p_assert(\n"
            f"[rank1]: AssertionError: {GRAD_FN}\n")


FSDP_113 = (f"{GRAD_FN}\n"
            '  File "/venv/lib/python3.8/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py", '
            "line 3179, in _register_post_backward_hooks\n    p_assert(\n"
            "Traceback (most recent call last):\n"
            '  File "/venv/lib/python3.8/site-packages/torch/distributed/fsdp/_utils.py", line 149, in p_assert\n'
            "    raise AssertionError\nAssertionError\n")


@pytest.mark.parametrize("text", [
    _fsdp_2x(1461, "_runtime_utils.py"),
    _fsdp_2x(1437, "_runtime_utils.py"),
    _fsdp_2x(1238, "_runtime_utils.py"),
    FSDP_113,
    f"[rank1]: AssertionError: {GRAD_FN}\n",
    f"[rank1]: {GRAD_FN}\n",
], ids=["2.13.0", "2.1.2", "2.0.1", "1.13.1-bare-assertion", "exception-line-alone", "printed-line-alone"])
def test_fsdps_grad_fn_assertion_says_inference_mode(text: str) -> None:
    problems = explain_text(text).problems
    assert [d.id for d in problems] == ["fsdp-usage-error"]
    (note,) = problems[0].notes
    assert "torch.inference_mode()" in note and "torch.no_grad()" in note and "113203" in note


def test_fsdps_bare_assertion_is_folded_under_its_message() -> None:
    """1.13's bare AssertionError is the printed message's own exception, not a second problem."""
    got = {d.id: d.caused_by for d in explain_text(FSDP_113).diagnoses}
    assert got == {"fsdp-usage-error": None, "python-exception": "fsdp-usage-error"}


def test_another_fsdp_assertion_gets_no_inference_mode_note() -> None:
    text = "[rank0]: AssertionError: Expects a parameter in the FlatParameter\n"
    for d in explain_text(text).diagnoses:
        assert not any("inference_mode" in n for n in d.notes)


# --- 2. torch 1.9's elastic agent lines as worker-failed evidence ---------------------------------------------
# api.py SimpleElasticAgent._exit_barrier: 'Local worker group finished ({state}). Waiting {t} seconds for other
# agents to finish' (f-string 1.9.0:879 ... 2.0.1:915 prints '(FAILED)' on Python <= 3.10; '%s' from 2.1.2:930,
# and any f-string on Python >= 3.11, prints '(WorkerState.FAILED)').
FINISHED_19 = ("INFO:torch.distributed.elastic.agent.server.api:Local worker group finished (FAILED). "
               "Waiting 300 seconds for other agents to finish\n")
FINISHED_21 = ("[2024-05-02 10:01:09,001] torch.distributed.elastic.agent.server.api: [INFO] Local worker group "
               "finished (WorkerState.FAILED). Waiting 300 seconds for other agents to finish\n")


# 1.9.0 events/__init__.py:56 (destination 'console'): json.dumps(asdict(Event)) of api.py _construct_event.
def _event(state: str, source: str = "WORKER", rank: int = 1, pid: int = 4242) -> str:
    return ('{"name": "torchelastic.worker.status.' + state + '", "source": "' + source + '", "timestamp": 0, '
            '"metadata": {"run_id": "none", "global_rank": ' + str(rank) + ', "group_rank": 0, "worker_id": "'
            + str(pid) + '", "role": "default", "hostname": "node7", "state": "' + state + '", "total_run_time": '
            '35, "rdzv_backend": "static", "raw_error": "{\\"message\\": \\"<NONE>\\"}", "metadata": '
            '"{\\"group_world_size\\": 1, \\"entry_point\\": \\"python\\", \\"local_rank\\": [1], '
            '\\"role_rank\\": [1], \\"role_world_size\\": [2]}", "agent_restarts": 3}}\n')


# 1.9.0 local_elastic_agent.py:208 log.error(f"[{role}] Worker group failed"): not a pattern, because a keyword
# for it admits every healthy "[default] Starting worker group" line (cut at the line end, see the prefilter);
# 1.9 prints "Local worker group finished (FAILED)" right after it anyway.
GROUP_FAILED_19 = "ERROR:torch.distributed.elastic.agent.server.local_elastic_agent:[default] Worker group failed\n"
# 1.9.0 errors/__init__.py:274-297 (the no-error-file UserWarning's body).
CHILD_FAILED_19 = "Child process 4242 (local_rank 1) FAILED (exitcode 1)\n"


@pytest.mark.parametrize(("text", "details"), [
    (FINISHED_19, {}),
    (FINISHED_21, {}),
    (_event("FAILED"), {"pid": ["4242"]}),
    (CHILD_FAILED_19, {"pid": ["4242"], "exit_code": ["1"]}),
], ids=["finished-1.9-f-string", "finished-2.1-percent-s", "1.9-worker-event", "1.9-child-process-failed"])
def test_the_elastic_agents_failure_lines_are_worker_failed(text: str, details: dict[str, list[str]]) -> None:
    (d,) = explain_text(text).diagnoses
    assert d.id == "worker-failed" and {k: v for k, v in d.details.items() if k in details} == details


@pytest.mark.parametrize("text", [
    FINISHED_19.replace("(FAILED)", "(SUCCEEDED)"),
    FINISHED_21.replace("(WorkerState.FAILED)", "(WorkerState.SUCCEEDED)"),
    _event("TERMINATED", rank=0, pid=4241),
    _event("SUCCEEDED", rank=0, pid=4241),
    _event("SUCCEEDED", source="AGENT"),  # 1.9's launcher records it even for a failed job (launcher/api.py:239)
    "Child process 4242 (local_rank 1) FAILED (exitcode 0)\n",
    "I1122 02:58:55.805325069 57704 torch/distributed/elastic/agent/server/local_elastic_agent.py:301] [default] "
    "Starting worker group\n",
], ids=["finished-succeeded", "finished-workerstate-succeeded", "terminated-event", "succeeded-event",
        "agent-succeeded-event", "exitcode-0",
        "starting-worker-group"])
def test_the_elastic_agents_healthy_lines_stay_quiet(text: str) -> None:
    assert explain_text(text).diagnoses == []


def test_the_worker_event_names_its_rank() -> None:
    assert explain_text(_event("FAILED", rank=3)).diagnoses[0].ranks == {3}


def test_the_agents_lines_add_nothing_to_the_ranks_own_exception() -> None:
    text = ("[rank1]: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new "
            "one.\n" + GROUP_FAILED_19 + FINISHED_19 + _event("FAILED"))
    assert [d.id for d in explain_text(text).problems] == ["unused-parameters"]


# --- 3. the unused-parameter error's tail lines -------------------------------------------------------------
# reducer.cpp Reducer::ensure_prior_reduction_finished (2.7.0a0 copy, jizhuoran/EasyFHE 8cd54cb4, 1941-2047):
# either head, then in every branch the indices line and, with TORCH_DISTRIBUTED_DEBUG off, the tail sentence
# (one leading space, no full stop; byte-identical in 1.9.0, 1.10.0, 1.13.1 and 2.13.0, absent from 1.8.1).
UNUSED_HEAD = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
               "This error indicates that your module has parameters that were not used in producing loss.")
STATIC_HEAD = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
               "This error indicates that your training graph has changed in this iteration, e.g., one parameter is "
               "used in first iteration, but then got unused in the second iteration. this is not compatible with "
               "static_graph set to True.")
INDICES = "Parameter indices which did not receive grad for rank 1: 4 5"
NAMES = "Parameters which did not receive grad for rank 1: head.weight, head.bias"
TAIL = (" In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to "
        "print out information about which particular parameters did not receive gradient on this rank as part of "
        "this error")


def _rank1(*lines: str) -> str:
    return "".join(f"[rank1]: {ln}\n" for ln in lines)


@pytest.mark.parametrize(("text", "want"), [
    (_rank1(STATIC_HEAD, INDICES, TAIL), "static-graph-changed"),
    (_rank1(STATIC_HEAD, NAMES), "static-graph-changed"),
    (STATIC_HEAD + "\n" + INDICES + "\n" + TAIL + "\n", "static-graph-changed"),
    (_rank1(UNUSED_HEAD, INDICES, TAIL), "unused-parameters"),
    (_rank1(UNUSED_HEAD, NAMES), "unused-parameters"),
    (_rank1(TAIL), "unused-parameters"),
    (TAIL + "\n", "unused-parameters"),
    (_rank1(INDICES, TAIL), "unused-parameters"),
], ids=["static-indices-tail", "static-names", "static-unprefixed", "unused-indices-tail", "unused-names",
        "tail-alone-prefixed", "tail-alone", "indices-and-tail"])
def test_one_reducer_error_is_one_finding(text: str, want: str) -> None:
    assert [d.id for d in explain_text(text).diagnoses] == [want]


@pytest.mark.parametrize("width", [None, 80])
def test_the_names_and_indices_lines_alone_name_the_rank_they_state(width: int | None) -> None:
    """A paste of only the reducer's two lines (YOLOv9's log, no `[rankN]:` prefix): the rank is in their own text
    ("... for rank 0: ..."); it was lost when neither line held one of the signature's keywords, and under a
    terminal's wrap at 80 columns (the names line then holds only its first parameter)."""
    names = "Parameters which did not receive grad for rank 0: " + ", ".join(f"model.22.cv{i}.bias" for i in range(12))
    indices = "Parameter indices which did not receive grad for rank 0: " + " ".join(str(i) for i in range(474, 507))
    text = f"{names}\n{indices}\n"
    if width:
        text = "".join("\n".join(ln[i:i + width] for i in range(0, len(ln), width)) + "\n" for ln in text.splitlines())
    [got] = explain_text(text).diagnoses
    assert (got.id, sorted(got.ranks)) == ("unused-parameters", [0])
    assert got.details["param_names"][0].startswith("model.22.cv0.bias")
    assert got.details["param_indices"][0].startswith("474 475 476")


def test_the_tail_alone_carries_its_rank() -> None:
    assert explain_text("[rank3]: " + TAIL + "\n").diagnoses[0].ranks == {3}


def test_the_tail_alone_outranks_torchruns_summary_of_the_same_failure() -> None:
    # The tail names levels in prose ("to either INFO or DETAIL"): it is an error line, not an INFO line, so
    # the reducer's error stays the cause and torchrun's line for the rank it killed goes under it.
    summary = ("E1122 01:39:40.123000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed "
               "(exitcode: 1) local_rank: 1 (pid: 4569) of binary: /usr/bin/python3\n")
    found = explain_text(_rank1(TAIL) + summary).diagnoses
    assert found[0].id == "unused-parameters" and found[0].ranks == {1}, [d.id for d in found]


def test_mark_ready_twices_debug_hint_is_not_the_tail() -> None:
    # reducer.cpp:823-825: mark-ready-twice's own TORCH_DISTRIBUTED_DEBUG sentence, worded differently.
    text = ("[rank0]: RuntimeError: Expected to mark a variable ready only once. Parameter at index 7 has been "
            "marked as ready twice. This means that multiple autograd engine  hooks have fired for this particular "
            "parameter during this iteration. You can set the environment variable TORCH_DISTRIBUTED_DEBUG to "
            "either INFO or DETAIL to print parameter names for further debugging.\n")
    assert [d.id for d in explain_text(text).diagnoses] == ["mark-ready-twice"]


# --- 4. CUDA's start-up refusals ------------------------------------------------------------------------------
# cudaGetErrorString strings of libcudart (nvidia-cuda-runtime-cu11 11.7.99/11.8.89, -cu12 12.1.105/12.9.79),
# printed by torch as "CUDA error: {}" (c10/cuda/CUDAException.cpp) and by NCCL as "Cuda failure '{}'"
# (src/include/checks.h); the older runtimes' "all CUDA-capable devices are busy or unavailable" through torch
# 0.x-1.x's THC ("THCudaCheck FAIL ... error=46 : {}", "cuda runtime error (46) : {}"); c10/cuda/CUDAFunctions.cpp
# (2.7.0a0 copy) for the driver checks.
BUSY = "CUDA-capable device(s) is/are busy or unavailable"
BUSY_OLD = "all CUDA-capable devices are busy or unavailable"


@pytest.mark.parametrize(("text", "want", "note"), [
    (f"[rank1]: RuntimeError: CUDA error: {BUSY}\n", "cuda-unavailable", "nvidia-smi"),
    (f"[rank1]: RuntimeError: CUDA error: {BUSY_OLD}\n", "cuda-unavailable", "nvidia-smi"),
    (f"[rank1]: RuntimeError: cuda runtime error (46) : {BUSY_OLD} at /pytorch/aten/src/THC/THCGeneral.cpp:50\n",
     "cuda-unavailable", "nvidia-smi"),
    (f"[rank1]: THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=50 error=46 : {BUSY_OLD}\n",
     "cuda-unavailable", "nvidia-smi"),
    (f"node3:4242:4242 [1] include/checks.h:16 NCCL WARN Cuda failure '{BUSY}'\n", "cuda-unavailable",
     "nvidia-smi"),
    ("[rank1]: RuntimeError: CUDA error: exclusive-thread device already in use by a different thread\n",
     "cuda-unavailable", "exclusive-thread"),
    ("[rank5]: RuntimeError: CUDA error: system not yet initialized\n", "cuda-unavailable", "fabricmanager"),
    ("[rank0]: RuntimeError: CUDA error: system has unsupported display driver / cuda driver combination\n",
     "cuda-unavailable", "reboot"),
    ("[rank0]: RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n",
     "cuda-unavailable", None),
    ("[rank0]: RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your "
     "GPU driver by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx"
     "\n", "cuda-unavailable", None),
    ("[rank0]: RuntimeError: CUDA error: forward compatibility was attempted on non supported HW\n",
     "cuda-unavailable", None),
    ("[rank0]: RuntimeError: CUDA error: CUDA driver is a stub library\n", "cuda-unavailable", None),
    ("[rank0]: RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. "
     "changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero.\n",
     "cuda-unavailable", None),
    ("[rank0]: RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.\n",
     "cuda-unavailable", None),
    ("[rank0]: RuntimeError: CUDA error: initialization error\n", "cuda-unavailable", None),
    ("[rank2]: RuntimeError: CUDA error: no CUDA-capable device is detected\n", "no-gpu-visible", None),
    ("[rank2]: RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
     "installed a driver from http://www.nvidia.com/Download/index.aspx\n", "no-gpu-visible", None),
], ids=["busy", "busy-older-runtime", "busy-thc-runtime-error", "busy-thcudacheck", "busy-nccl", "exclusive-thread",
        "not-yet-initialized", "driver-mismatch", "insufficient-driver", "driver-too-old", "compat", "stub",
        "unknown-error", "init-failed", "initialization-error", "no-device", "no-driver"])
def test_cudas_start_up_refusals(text: str, want: str, note: str | None) -> None:
    (d,) = explain_text(text).diagnoses
    assert d.id == want and d.level == "error"
    if note is not None:
        assert any(note in n for n in d.notes)


def test_a_busy_gpu_in_one_process_is_a_note() -> None:
    (d,) = explain_text(f"RuntimeError: CUDA error: {BUSY}\n").diagnoses
    assert (d.id, d.level) == ("cuda-unavailable", "note")


@pytest.mark.parametrize("text", [
    # torch.cuda.device_count() on a machine without a GPU (a healthy CPU/gloo run): a warning, not a finding.
    "[rank0]: /venv/lib/python3.10/site-packages/torch/cuda/__init__.py:128: UserWarning: CUDA initialization: Found "
    "no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver from "
    "http://www.nvidia.com/Download/index.aspx (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)\n",
    "[rank0]: UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11040). "
    "Please update your GPU driver\n",
    "[rank0]: UserWarning: CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up "
    "environment, e.g. changing env variable CUDA_VISIBLE_DEVICES after program start.\n",
], ids=["no-driver-warning", "too-old-warning", "unknown-error-warning"])
def test_cuda_initialization_warnings_are_no_false_alarm(text: str) -> None:
    assert explain_text(text).failures == []


# --- 5. FSDP's _p_assert messages, from the inventory -------------------------------------------------------
# torch 2.13.0 (cf30153c) torch/distributed/fsdp/_runtime_utils.py:1059-1069, _check_grad_to_accumulate:
#   _p_assert(accumulated_grad.shape == new_sharded_grad.shape,
#             "Shape mismatch when accumulating gradients: "
#             f"existing gradient shape={accumulated_grad.shape} "
#             f"new gradient shape={new_sharded_grad.shape}")
# reached from _post_backward_hook (766) -> _reduce_grad (885) -> _accumulate_sharded_grad (923); _p_assert
# (torch/distributed/utils.py:158-164) prints the message, then the stack (traceback.print_stack), then raises
# AssertionError(message). scripts/build_explain_inventory.py reads these calls into torch-python.jsonl.
SITE = "/opt/conda/lib/python3.11/site-packages/torch"
SHAPES = ("Shape mismatch when accumulating gradients: existing gradient shape=torch.Size([1049088]) "
          "new gradient shape=torch.Size([524544])")
_BACKWARD_FRAMES = [
    '  File "/workspace/train.py", line 64, in <module>', "    loss.backward()",
    f'  File "{SITE}/_tensor.py", line 623, in backward', "    torch.autograd.backward(",
    f'  File "{SITE}/autograd/__init__.py", line 395, in backward', "    _engine_run_backward(",
    f'  File "{SITE}/autograd/graph.py", line 979, in _engine_run_backward',
    "    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass",
    f'  File "{SITE}/utils/_contextlib.py", line 124, in decorate_context', "    return func(*args, **kwargs)",
    f'  File "{SITE}/distributed/fsdp/_runtime_utils.py", line 766, in _post_backward_hook',
    "    _reduce_grad(state, handle)",
    f'  File "{SITE}/distributed/fsdp/_runtime_utils.py", line 885, in _reduce_grad',
    "    grad_to_offload = _accumulate_sharded_grad(state, handle, new_sharded_grad)",
    f'  File "{SITE}/distributed/fsdp/_runtime_utils.py", line 923, in _accumulate_sharded_grad',
    "    _check_grad_to_accumulate(sharded_grad, flat_param._saved_grad_shard)",
    f'  File "{SITE}/distributed/fsdp/_runtime_utils.py", line 1063, in _check_grad_to_accumulate',
    "    _p_assert(",
]


def _p_assert_tail(rank: int, msg: str = SHAPES) -> str:
    """What _p_assert leaves on a torchrun rank's output: the message, the stack, the traceback."""
    lines = [msg, *_BACKWARD_FRAMES, f'  File "{SITE}/distributed/utils.py", line 162, in _p_assert',
             "    traceback.print_stack()", "Traceback (most recent call last):", *_BACKWARD_FRAMES,
             f'  File "{SITE}/distributed/utils.py", line 164, in _p_assert', "    raise AssertionError(s)",
             f"AssertionError: {msg}"]
    return "".join(f"[rank{rank}]: {ln}\n" for ln in lines)


# torch 2.13.0 multiprocessing/api.py:1003 (the agent's first failure) and errors/__init__.py's summary.
def _failed(pid: int) -> str:
    return ("E1126 10:00:05.000000 4565 torch/distributed/elastic/multiprocessing/api.py:1003] failed (exitcode: 1) "
            f"local_rank: 1 (pid: {pid}) of binary: /usr/bin/python3\n")


def test_an_fsdp_p_assert_is_an_fsdp_usage_error_citing_its_source() -> None:
    result = explain_text(_p_assert_tail(1) + _failed(4567))
    first = result.problems[0]
    assert [d.id for d in result.problems] == ["fsdp-usage-error"]
    assert first.ranks == {1} and first.evidence[0].text == f"[rank1]: AssertionError: {SHAPES}"
    assert first.details["template_source"] == ["pytorch 2.13.0+cpu torch/distributed/fsdp/_runtime_utils.py:1063"]
    assert not any("inference_mode" in n for n in first.notes)  # the grad_fn note is that assertion's alone
    assert {d.id: d.caused_by for d in result.diagnoses}["worker-failed"] == "fsdp-usage-error"


@pytest.mark.parametrize(("msg", "where"), [
    ("Expects the `FlatParameter` to be on CPU when parameter CPU offloading is enabled, not cuda:0",
     "fsdp/_flat_param.py:1250"),
    ("The post-backward callback should only be called on the root FSDP instance", "fsdp/_runtime_utils.py:1093"),
    ("Freeing a tensor's storage is unsafe when it is not the sole occupant", "utils.py:199"),
], ids=["f-string-flat-param", "runtime-utils", "storage-helper-in-distributed-utils"])
def test_other_p_assert_messages_name_their_file(msg: str, where: str) -> None:
    (d,) = explain_text(f"[rank0]: AssertionError: {msg}\n").diagnoses
    assert d.id == "fsdp-usage-error"
    assert d.details["template_source"] == [f"pytorch 2.13.0+cpu torch/distributed/{where}"]


def test_the_fsdp_report_and_exit_code(tmp_path: Path) -> None:
    log = tmp_path / "rank1.log"
    log.write_text(_p_assert_tail(1) + _failed(4567))
    proc = run_cli(["explain", str(log)])
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "1 known problem found" in out and out.index("[fsdp-usage-error]") < out.index("[worker-failed]")
    line = _p_assert_tail(1).count("\n")  # the AssertionError line, the tail's last
    assert f"rank1.log:{line}: [rank1]: AssertionError: {SHAPES}" in out


# --- 6. torchrun restarting its worker group: a note, never the root cause ------------------------------------
# torch 2.13.0 (cf30153c) torch/distributed/elastic/agent/server/api.py:941-949 SimpleElasticAgent._invoke_run:
#   logger.info("[%s] Worker group %s. " "%s/%s attempts left;" " will restart worker group",
#               role, state.name, self._remaining_restarts, spec.max_restarts)
# then _restart_workers: "[%s] Stopping worker group" (733), "[%s] Rendezvous'ing worker group" (707),
# "[%s] Starting worker group" (715).
AGENT = "I1126 10:00:0{} 4565 torch/distributed/elastic/agent/server/api.py:{}] [default] {}\n"
RESTART = (AGENT.format("5.100000", 941, "Worker group FAILED. 1/1 attempts left; will restart worker group")
           + AGENT.format("5.200000", 733, "Stopping worker group")
           + AGENT.format("6.000000", 707, "Rendezvous'ing worker group")
           + AGENT.format("6.500000", 715, "Starting worker group"))


def test_a_restart_before_the_failure_is_a_note_not_the_root_cause() -> None:
    result = explain_text(_p_assert_tail(1) + _failed(4567) + RESTART + _p_assert_tail(1) + _failed(4603))
    assert [d.id for d in result.problems] == ["fsdp-usage-error"]
    (note,) = result.notes
    assert note.id == "elastic-restart" and note.level == "note" and note.caused_by is None
    assert {k: note.details[k] for k in ("state", "attempts_left", "max_restarts")} == {
        "state": ["FAILED"], "attempts_left": ["1"], "max_restarts": ["1"]}
    assert note.evidence[0].text.endswith("[default] Worker group FAILED. 1/1 attempts left; will restart worker group")


def test_the_restart_report_and_exit_codes(tmp_path: Path) -> None:
    failed = tmp_path / "torchrun.log"
    failed.write_text(_p_assert_tail(1) + _failed(4567) + RESTART + _p_assert_tail(1) + _failed(4603))
    proc = run_cli(["explain", str(failed)])
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert out.index("1. ") < out.index("[fsdp-usage-error]") < out.index("Notes (hints, not failures):") \
        < out.index("n1. ") < out.index("[elastic-restart]")
    # A job that finished after its restart: the note alone, exit 0.
    healed = tmp_path / "healed.log"
    healed.write_text(RESTART + "[rank1]: epoch 3 step 100 loss 1.93\n")
    proc = run_cli(["explain", str(healed)])
    assert proc.returncode == 0, proc.stderr
    assert "no failure found" in proc.stdout and "[elastic-restart]" in proc.stdout
    assert "healed.log:1: " in proc.stdout and "Worker group FAILED. 1/1 attempts left" in proc.stdout


@pytest.mark.parametrize("line", [
    "INFO:torch.distributed.elastic.agent.server.api:[default] Worker group FAILED. 3/3 attempts left; will restart "
    "worker group\n",  # the logging.basicConfig line format (torch 1.x scripts)
    "[2024-05-02 10:01:09,001] torch.distributed.elastic.agent.server.api: [INFO] [default] Worker group UNHEALTHY. "
    "2/3 attempts left; will restart worker group\n",  # torch 2.1-2.3's format
    AGENT.format("5.100000", 941, "Worker group FAILED. 3/3 attempts left; will restart worker group"),
], ids=["1.x", "2.1-unhealthy", "2.13"])
def test_each_logging_format_of_the_restart_line_is_the_note(line: str) -> None:
    (d,) = explain_text(line).diagnoses
    assert (d.id, d.level) == ("elastic-restart", "note") and explain_text(line).failures == []


@pytest.mark.parametrize("line", [
    AGENT.format("6.500000", 715, "Starting worker group"),
    AGENT.format("5.200000", 733, "Stopping worker group"),
    "I1126 10:00:05.100000 4565 torch/distributed/elastic/agent/server/api.py:962] [default] Detected 1 new nodes "
    "from group_rank=0; will restart worker group\n",
], ids=["starting", "stopping", "membership-change"])
def test_the_agents_other_restart_lines_stay_quiet(line: str) -> None:
    assert explain_text(line).diagnoses == []


# --- Python's faulthandler: "Fatal Python error: <signal>" -------------------------------------------------------
# CPython Modules/faulthandler.c: faulthandler_fatal_error writes "Fatal Python error: " and the handler's name
# (faulthandler_handlers: "Bus error", "Illegal instruction", "Floating point exception" ("Floating-point exception"
# from 3.13), "Aborted", "Segmentation fault"), then "Current thread 0x... (most recent call first):" and the
# frames. Printed by a process started with -X faulthandler or PYTHONFAULTHANDLER=1, and by Ray's workers.
FAULTHANDLER = (
    "Fatal Python error: {name}\n\n"
    "Current thread 0x00007f3a9c1ff740 (most recent call first):\n"
    '  File "/home/u/train.py", line 88 in train_step\n'
    '  File "/home/u/train.py", line 120 in main\n')


@pytest.mark.parametrize("name", ["Segmentation fault", "Bus error", "Aborted", "Floating-point exception",
                                  "Floating point exception", "Illegal instruction"])
def test_faulthandlers_fatal_error_is_a_rank_killed_by_a_signal(name: str) -> None:
    text = "".join(f"[rank2]: {line}\n" for line in FAULTHANDLER.format(name=name).splitlines())
    [first, *_] = explain_text(text).failures
    assert first.id == "worker-killed-by-signal" and sorted(first.ranks) == [2]
    assert first.evidence[0].text.endswith(f"Fatal Python error: {name}")


def test_faulthandlers_fatal_error_in_one_process_is_a_note() -> None:
    """The same lines from a plain script (no rank, launcher or process group in the log): a crash of that one
    process, named as a note (exit 0), not a DDP failure."""
    proc = run_cli(["explain", "-"], input_text=FAULTHANDLER.format(name="Segmentation fault"))
    assert proc.returncode == 0, proc.stdout
    assert "A fatal signal ended this process (a single-process run: not a DDP problem)" in proc.stdout
