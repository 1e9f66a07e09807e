"""The shared reader for JSON from users' files refuses what no real writer emits, with a reason."""

from __future__ import annotations

import pytest

from ddpdoctor.safejson import MAX_DEPTH, UntrustedJSONError, loads_untrusted


@pytest.mark.parametrize(("text", "reason"), [
    ('{"world_size": Infinity}', "Infinity"),
    ('{"world_size": NaN}', "NaN"),
    ("[1e400]", "too large"),
    ("[" + "9" * 5000 + "]", "5000 digits"),
    ("[" * 5000 + "]" * 5000, "nesting deeper"),
    ('{"a": [' * 300 + "1" + "]}" * 300, "nesting deeper"),
    (b"{\"a\": \"\xff\"}", "decode"),
    ("{not json", "Expecting"),
])
def test_refuses_what_no_writer_emits(text: str | bytes, reason: str) -> None:
    with pytest.raises(UntrustedJSONError, match=reason):
        loads_untrusted(text)


def test_real_documents_pass_unchanged() -> None:
    # Brackets inside strings do not count as nesting; 19-digit nanosecond timestamps and byte offsets pass.
    doc = '{"name": "[[[[{{{{", "time_created_ns": 1732400000123456789, "lr": 1.5e-07, "neg": -3}'
    assert loads_untrusted(doc) == {"name": "[[[[{{{{", "time_created_ns": 1732400000123456789,
                                    "lr": 1.5e-07, "neg": -3}
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads_untrusted(nested) is not None
