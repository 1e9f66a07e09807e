"""The shadow unpickler/re-pickler: round trips, torch's weights-only reader accepts its output, no torch needed."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from collections import OrderedDict
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.ckpt import inspect_checkpoint, open_checkpoint, unpickler
from ddpdoctor.ckpt.locate import STORAGE_DTYPES
from tests.support import REPO, clean_env

# Not b"": protocol 2 writes it as builtins.bytes(), which torch's weights-only loader (and so ours) refuses.
_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False), st.text(max_size=20), st.binary(min_size=1, max_size=20),
)
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner, inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=5),
        st.builds(lambda d: OrderedDict(d), st.dictionaries(st.text(max_size=8), inner, max_size=5)),
        st.frozensets(st.integers(), max_size=4).map(set),
    ),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(_values)
def test_shadow_round_trip_equals_original_and_torch_weights_only_reads_it(value: Any) -> None:
    original = pickle.dumps(value, protocol=2)
    shadow, _ = unpickler.loads(original)
    rewritten = unpickler.dumps(shadow)
    assert pickle.loads(rewritten) == value
    from torch import _weights_only_unpickler as wo

    assert wo.Unpickler(io.BytesIO(rewritten), encoding="utf-8").load() == value


def test_shared_objects_stay_shared() -> None:
    inner = [1, 2]
    shadow, _ = unpickler.loads(pickle.dumps({"a": inner, "b": inner}, protocol=2))
    again = pickle.loads(unpickler.dumps(shadow))
    assert again["a"] is again["b"]


def test_static_allowlist_is_a_subset_of_torch_weights_only() -> None:
    from torch import _weights_only_unpickler as wo

    assert set(wo._get_allowed_globals()) >= unpickler.STATIC_ALLOWED
    assert not unpickler.is_allowed("argparse.Namespace")
    assert not unpickler.is_allowed("posix.system")


def test_static_storage_dtypes_match_torch() -> None:
    from torch.serialization import StorageType

    for name, (dtype, size) in STORAGE_DTYPES.items():
        real = torch.uint8 if name == "UntypedStorage" else StorageType(name).dtype
        assert str(real) == f"torch.{dtype}"
        assert real.itemsize == size


def test_new_dtypes_are_described_by_rebuild_tensor_v3(tmp_path: Any) -> None:
    path = tmp_path / "f8.pt"
    torch.save({"module.w": torch.zeros(3, 2, dtype=torch.float8_e4m3fn), "module.u": torch.zeros(2, dtype=torch.uint16)},
               path)
    rep = inspect_checkpoint(open_checkpoint(path))
    assert rep.dtypes == {"float8_e4m3fn": 1, "uint16": 1}
    assert rep.tensor_bytes == 6 + 4


def test_strip_does_not_import_torch(tmp_path: Any) -> None:
    """torch's import costs ~1.5 s and ~200 MB: strip of zip and safetensors files never needs it."""
    src = tmp_path / "ddp.pt"
    torch.save(OrderedDict([("module.w", torch.ones(3))]), src)
    code = ("import sys\n"
            "from ddpdoctor.cli import main\n"
            f"rc = main(['ckpt', 'strip', {str(src)!r}, '-o', {str(tmp_path / 'o.pt')!r}])\n"
            "assert rc == 0, rc\n"
            "print('torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(),
                         cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("False")
    assert list(torch.load(tmp_path / "o.pt", weights_only=True)) == ["w"]
