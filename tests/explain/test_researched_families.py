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
