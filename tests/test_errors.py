"""Exceptions become one readable line in findings and messages."""

from __future__ import annotations

from ddpdoctor.errors import short_error


def test_gloo_source_prefix_is_dropped_and_only_the_first_line_kept() -> None:
    exc = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                       "[127.0.0.1]:19114: Connection reset by peer.\nException raised from ...")
    assert short_error(exc) == "Read error [127.0.0.1]:19114: Connection reset by peer."


def test_an_exception_without_a_message_gives_its_type_not_an_index_error() -> None:
    assert short_error(RuntimeError()) == "RuntimeError"
    assert short_error(TimeoutError("")) == "TimeoutError"


def test_typed_error_strips_the_source_path_and_names_the_type() -> None:
    from ddpdoctor.errors import typed_error

    gloo = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [h]:1: reset\nmore")
    assert typed_error(gloo) == "RuntimeError: Read error [h]:1: reset"
    assert typed_error(KeyError()) == "KeyError"
