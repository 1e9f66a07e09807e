"""A native crash in the InfiniBand verbs libraries, called by NCCL, read from its backtrace (issue 33).

The backtraces are in the forms their printers write (see ddpdoctor/explain/native.py for the sources): UCX's
fatal-signal handler (``Caught signal 11 (...)``, ``==== backtrace (tid: N) ====`` and glibc ``backtrace_symbols``
frames), gdb's ``bt``, and c10's ``frame #N:`` lines. The library offsets are made up; the frame order (innermost
first), the libraries and the NCCL wrapper names are what those printers and NCCL's ibvwrap.cc give.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.explain import explain_text

SITE = "/opt/conda/lib/python3.10/site-packages/torch/lib"

# UCX (loaded by HPC-X's MPI or NCCL's UCX plugin) catches the SIGSEGV and prints glibc's backtrace_symbols frames.
UCX_CRASH = (
    "[node07:41213:0:41213] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x7f20)\n"
    "==== backtrace (tid:  41213) ====\n"
    " 0  /opt/hpcx/ucx/lib/libucs.so.0(ucs_handle_error+0x2a4) [0x7f2106e83824]\n"
    " 1  /lib/x86_64-linux-gnu/libpthread.so.0(+0x153c0) [0x7f26c5cff3c0]\n"
    " 2  /lib/x86_64-linux-gnu/libmlx5.so.1(+0x2a1c8) [0x7f21043c51c8]\n"
    " 3  /lib/x86_64-linux-gnu/libibverbs.so.1(ibv_open_device+0x3f) [0x7f21043c2635]\n"
    f" 4  {SITE}/../../nvidia/nccl/lib/libnccl.so.2(+0x84825) [0x7f21c54eb825]\n"
    f" 5  {SITE}/../../nvidia/nccl/lib/libnccl.so.2(+0x9f27c) [0x7f21c550627c]\n"
    "=================================\n"
)

# gdb on the core file of the same crash.
GDB_CRASH = (
    "Program terminated with signal SIGSEGV, Segmentation fault.\n"
    "#0  0x00007f21043c51c8 in ?? () from /lib/x86_64-linux-gnu/libmlx5.so.1\n"
    "#1  0x00007f21043c2635 in ibv_get_device_list () from /lib/x86_64-linux-gnu/libibverbs.so.1\n"
    f"#2  0x00007f21c54eb825 in wrap_ibv_get_device_list () from {SITE}/libnccl.so.2\n"
    f"#3  0x00007f21c550627c in ncclIbInit () from {SITE}/libnccl.so.2\n"
)

# The same calls in c10's frame form, as an "Exception raised from" message lists them.
C10_FRAMES = (
    "frame #0: <unknown function> + 0x2a1c8 (0x7f21043c51c8 in /usr/lib/x86_64-linux-gnu/libmlx5.so.1)\n"
    "frame #1: ibv_reg_mr + 0x55 (0x7f21043c2635 in /usr/lib/x86_64-linux-gnu/libibverbs.so.1)\n"
    f"frame #2: <unknown function> + 0x84825 (0x7f21c54eb825 in {SITE}/libnccl.so.2)\n"
)


def _first(text: str) -> tuple[int, dict]:
    """`ddpdoctor explain --json -` on ``text`` (the CLI in this process, typer's runner): exit code, first diagnosis."""
    run = CliRunner().invoke(app, ["explain", "--json", "-"], input=text)
    assert run.exception is None or isinstance(run.exception, SystemExit), run.exception
    return run.exit_code, json.loads(run.stdout)["diagnoses"][0]


def test_a_ucx_segfault_in_the_verbs_library_called_by_nccl_is_nccls_ib_transport_with_the_frames_quoted() -> None:
    code, first = _first("Starting training on 8 GPUs\n" + UCX_CRASH)
    assert code == 1
    assert first["id"] == "nccl-ib-error"
    assert "Segmentation fault" in first["title"] and "ibv_open_device" in first["title"]
    quoted = [e["text"] for e in first["evidence"]]
    assert quoted[0].startswith("[node07:41213:0:41213] Caught signal 11")
    assert "libibverbs.so.1(ibv_open_device+0x3f)" in quoted[1]  # the named verbs frame, not the bare offset
    assert "libnccl.so.2" in quoted[2]
    assert "NCCL_IB_DISABLE=1" in first["remedy"]


def test_gdb_and_c10_frame_forms_are_read_alike() -> None:
    for text, call in ((GDB_CRASH, "ibv_get_device_list"), (C10_FRAMES, "ibv_reg_mr")):
        result = explain_text(text)
        assert [d.id for d in result.diagnoses][:1] == ["nccl-ib-error"], text
        assert call in result.diagnoses[0].signature.title


def test_a_backtrace_wrapped_by_a_terminal_is_still_read() -> None:
    wrapped = "".join(line[i:i + 80] + "\n" for line in UCX_CRASH.splitlines() for i in range(0, len(line), 80))
    assert max(len(line) for line in wrapped.splitlines()) == 80
    assert [d.id for d in explain_text(wrapped).diagnoses][:1] == ["nccl-ib-error"]


def test_verbs_crashing_without_nccl_above_it_or_nccl_crashing_without_verbs_is_not_an_ib_transport_diagnosis() -> None:
    # An MPI program's UCX crashing in libibverbs: no NCCL frame further out.
    no_nccl = UCX_CRASH.replace("nvidia/nccl/lib/libnccl.so.2", "openmpi/lib/libmpi.so.40")
    assert "nccl-ib-error" not in [d.id for d in explain_text(no_nccl).diagnoses]
    # NCCL crashing in its own code: no verbs frame inside it.
    no_verbs = "\n".join(line for line in UCX_CRASH.splitlines() if "libmlx5" not in line and "libibverbs" not in line)
    assert "nccl-ib-error" not in [d.id for d in explain_text(no_verbs).diagnoses]
    # A verbs frame in one backtrace and NCCL's in another, far below: two crashes, not one call.
    apart = UCX_CRASH.split(" 4  ")[0] + "\n" * 10 + f" 0  {SITE}/libnccl.so.2(+0x84825) [0x7f21c54eb825]\n"
    assert "nccl-ib-error" not in [d.id for d in explain_text(apart).diagnoses]


def test_an_ib_error_line_from_nccl_itself_is_kept_and_the_backtrace_adds_no_second_diagnosis() -> None:
    warn = "node07:41213:41300 [0] transport/net_ib.cc:1295 NCCL WARN Call to ibv_open_device failed\n"
    ids = [d.id for d in explain_text(warn + UCX_CRASH).diagnoses]
    assert ids.count("nccl-ib-error") == 1
    assert ids[0] == "nccl-ib-error"
