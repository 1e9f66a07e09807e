"""Message families found by issue 33's research note (old torch wheels' texts, libcudart's strings).

Every text below is built from the format string of the release named next to it (the wheel's `.py` file or the
string constant in its `libtorch*`/`libcudart`), not from a log: a positive per wording and release, and the
negatives the note lists.
"""

from __future__ import annotations

import pytest

from ddpdoctor.explain import explain_text

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
