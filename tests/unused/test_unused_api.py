"""`ddpdoctor.find_unused_parameters` and model fingerprints, on the example models, in-process."""

from __future__ import annotations

import importlib.util
import random
from types import ModuleType

import numpy as np
import pytest
import torch
from torch import nn

import ddpdoctor
from ddpdoctor.errors import DoctorError
from ddpdoctor.unused import compare_fingerprints, fingerprint
from tests.support import REPO


def _examples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("models_unused_examples", REPO / "examples" / "models_unused.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


M = _examples()
HEAD = {"head.weight", "head.bias"}
ENCODER = {"encoder.0.weight", "encoder.0.bias", "norm.weight", "norm.bias"}


def _classes(model: nn.Module, batches: object, **kw: object) -> tuple[set[str], set[str], set[str]]:
    report = ddpdoctor.find_unused_parameters(model, batches, **kw)
    return set(report.always_used), set(report.never_used), set(report.sometimes_used)


def test_healthy_model_reports_nothing() -> None:
    report = ddpdoctor.find_unused_parameters(M.healthy(), M.batch)
    assert set(report.always_used) == ENCODER | HEAD
    assert report.never_used == [] and report.sometimes_used == [] and report.dead_outputs == []
    assert not report.has_problem
    assert report.recommendation.find_unused_parameters is False
    assert "got a gradient on every step" in report.render()


def test_dead_branch_names_the_never_called_layer_and_its_module() -> None:
    report = ddpdoctor.find_unused_parameters(M.dead_branch(), M.batch(0))
    assert set(report.never_used) == {"aux_head.weight", "aux_head.bias"}
    assert set(report.always_used) == ENCODER | HEAD
    owner = {p.name: (p.module, p.module_type) for p in report.params}
    assert owner["aux_head.weight"] == ("aux_head", "Linear")
    assert owner["encoder.0.weight"] == ("encoder.0", "Linear")
    # Verified with a 2-rank gloo DDP run: static_graph=True trains this model.
    assert report.recommendation.static_graph is True
    assert report.has_problem
    assert "aux_head.weight  [aux_head: Linear]" in report.render()


def test_data_dependent_branch_is_sometimes_used() -> None:
    always, never, sometimes = _classes(M.data_dependent(), M.alternating_batch, steps=4)
    assert sometimes == {"pos_head.weight", "pos_head.bias", "neg_head.weight", "neg_head.bias"}
    assert always == {"encoder.weight", "encoder.bias"}
    assert never == set()


def test_one_batch_of_a_data_dependent_model_sees_one_branch_only() -> None:
    # The classification is only as good as the batches: one positive batch never takes neg_head.
    _, never, sometimes = _classes(M.data_dependent(), M.alternating_batch(0))
    assert never == {"neg_head.weight", "neg_head.bias"} and sometimes == set()


def test_rank_dependent_branch_follows_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    assert _classes(M.rank_dependent(), M.batch)[1] == {"extra.weight", "extra.bias"}
    monkeypatch.setenv("RANK", "1")
    always, never, _ = _classes(M.rank_dependent(), M.batch)
    assert never == set() and {"extra.weight", "extra.bias"} <= always


def test_unused_output_is_dead_and_owns_its_head() -> None:
    report = ddpdoctor.find_unused_parameters(M.unused_output(), M.batch)
    assert [d.path for d in report.dead_outputs] == ["output[1]"]
    assert set(report.dead_outputs[0].params) == {"aux_head.weight", "aux_head.bias"}
    assert set(report.never_used) == {"aux_head.weight", "aux_head.bias"}
    # Verified with gloo DDP: static_graph=True fails on this model, find_unused_parameters=True works.
    assert report.recommendation.find_unused_parameters is True
    assert report.recommendation.static_graph is False
    assert "output[1]" in report.render()


def test_loss_over_both_outputs_leaves_nothing_dead() -> None:
    def loss_fn(out: tuple[torch.Tensor, torch.Tensor], _batch: object) -> torch.Tensor:
        return out[0].sum() + out[1].pow(2).mean()

    report = ddpdoctor.find_unused_parameters(M.unused_output(), M.batch, loss_fn=loss_fn)
    assert report.dead_outputs == [] and report.never_used == [] and not report.has_problem


def test_dead_output_feeding_no_own_parameter_is_not_a_problem() -> None:
    class Twice(M.Healthy):  # type: ignore[name-defined,misc]
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
            y = super().forward(x)
            return y, y * 2

    report = ddpdoctor.find_unused_parameters(Twice(), M.batch)
    assert [d.path for d in report.dead_outputs] == ["output[1]"]
    assert report.dead_outputs[0].params == []
    assert not report.has_problem


def test_reentrant_checkpoint_reuse_is_seen_as_double_accumulation() -> None:
    report = ddpdoctor.find_unused_parameters(M.reentrant_reuse(), M.batch(0))
    assert set(report.accumulated_twice) == {"shared.weight", "shared.bias"}
    assert set(report.always_used) == {"shared.weight", "shared.bias", "head.weight", "head.bias"}
    assert report.recommendation.static_graph is True
    assert "ready only once" in report.render()


def test_find_unused_true_on_a_healthy_model_costs_for_nothing() -> None:
    report = ddpdoctor.find_unused_parameters(M.healthy(), M.batch, ddp_find_unused_parameters=True)
    assert report.recommendation.find_unused_costs_for_nothing
    assert "for nothing" in report.render()
    needed = ddpdoctor.find_unused_parameters(M.data_dependent(), M.alternating_batch,
                                              ddp_find_unused_parameters=True)
    assert not needed.recommendation.find_unused_costs_for_nothing


def test_frozen_parameters_are_not_reported() -> None:
    model = M.dead_branch()
    model.aux_head.requires_grad_(False)
    report = ddpdoctor.find_unused_parameters(model, M.batch)
    assert report.never_used == [] and report.frozen_params == 2 and not report.has_problem


def test_tuple_dict_and_list_batches() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 2)
            self.b = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
            return self.a(x) if y is None else self.a(x) + self.b(y)

    x = torch.randn(2, 3)
    assert _classes(TwoInputs(), (x, x))[1] == set()
    assert _classes(TwoInputs(), {"x": x})[1] == {"b.weight", "b.bias"}
    # A list is several batches: b is used in one of the two steps.
    assert _classes(TwoInputs(), [(x, x), (x,)])[2] == {"b.weight", "b.bias"}


class _Stateful(nn.Module):
    """BatchNorm buffers and dropout RNG: what a careless analysis would change."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.unused = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.fc(x)))


def test_model_params_grads_buffers_mode_and_rng_are_unchanged() -> None:
    model = _Stateful().eval()
    model.fc.weight.grad = torch.full_like(model.fc.weight, 0.25)  # the user's half-accumulated grads
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    report = ddpdoctor.find_unused_parameters(model, M.batch, steps=3)
    assert set(report.never_used) == {"unused.weight", "unused.bias"}
    assert model.training is False and all(not m.training for m in model.modules())
    for n, p in model.named_parameters():
        assert torch.equal(p, params[n]), n
        expected = grads[n]
        assert (p.grad is None) if expected is None else torch.equal(p.grad, expected), n
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), n  # running_mean/var and num_batches_tracked untouched
    after = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    assert torch.equal(after[0], torch.rand(3)) and after[1] == random.random() and after[2] == np.random.rand()


def test_bad_batch_is_one_line_doctor_error_pointing_at_user_code() -> None:
    with pytest.raises(DoctorError) as info:
        ddpdoctor.find_unused_parameters(M.healthy(), torch.randn(4, 15))
    message = str(info.value)
    assert "mat1 and mat2 shapes cannot be multiplied" in message and "models_unused.py" in message
    assert "\n" not in message


def test_output_without_grad_is_a_doctor_error() -> None:
    with pytest.raises(DoctorError, match="requires grad"):
        ddpdoctor.find_unused_parameters(M.healthy().requires_grad_(False), M.batch(0))


def test_json_has_the_classes_and_recommendation() -> None:
    data = ddpdoctor.find_unused_parameters(M.unused_output(), M.batch).to_json()
    assert set(data["never_used"]) == {"aux_head.weight", "aux_head.bias"}
    assert data["dead_outputs"][0]["path"] == "output[1]"
    assert data["recommendation"]["find_unused_parameters"] is True
    assert {p["usage"] for p in data["params"]} == {"always", "never"}


def test_fingerprints_equal_for_identical_models_and_name_every_difference() -> None:
    torch.manual_seed(0)
    a = M.healthy()
    b = M.healthy()
    b.load_state_dict(a.state_dict())
    assert compare_fingerprints({0: fingerprint(a), 1: fingerprint(b)}) == []
    torch.manual_seed(1)
    c = M.healthy()  # a different seed: same shapes, other values
    diffs = compare_fingerprints({0: fingerprint(a), 1: fingerprint(b), 2: fingerprint(c)})
    assert {d.field for d in diffs} == {"values"}
    assert all(list(d.values.values()) == [[0, 1], [2]] for d in diffs)
    assert {d.name for d in diffs} == (ENCODER | HEAD) - {"norm.weight", "norm.bias"}  # LayerNorm init is constant
    wide = M.Healthy(hidden=40)
    shape_diffs = compare_fingerprints({0: fingerprint(a), 1: fingerprint(wide)})
    assert {(d.name, d.field) for d in shape_diffs} >= {("encoder.0.weight", "shape"), ("head.weight", "shape")}
    assert "[32, 16] on rank 0; [40, 16] on rank 1" in next(
        d.describe() for d in shape_diffs if d.name == "encoder.0.weight")
    missing = compare_fingerprints({0: fingerprint(a), 1: fingerprint(M.dead_branch())})
    assert ("aux_head.weight", "present") in {(d.name, d.field) for d in missing}
    half = compare_fingerprints({0: fingerprint(a), 1: fingerprint(M.healthy().double())})
    assert ("head.weight", "dtype") in {(d.name, d.field) for d in half}


def test_fingerprint_travels_as_json_dicts() -> None:
    prints = [vars(p) for p in fingerprint(_Stateful())]
    assert {p["kind"] for p in prints} == {"param", "buffer"}
    assert compare_fingerprints({0: prints, 1: prints}) == []


def test_ddp_wrapped_model_is_unwrapped_and_its_flag_judged() -> None:
    import torch.distributed as dist

    from tests.support import free_port

    # A real one-rank gloo group: DDP cannot be constructed without one.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(M.healthy(), find_unused_parameters=True)
        report = ddpdoctor.find_unused_parameters(ddp, M.batch)
        assert set(report.always_used) == ENCODER | HEAD  # no "module." prefix
        assert report.ddp_find_unused_parameters is True
        assert report.recommendation.find_unused_costs_for_nothing
    finally:
        dist.destroy_process_group()
