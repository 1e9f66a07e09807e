"""How a log reaches `explain` changes nothing it says (issue 33: robustness to how people paste, not one more pattern
per log).

Each log below is built from the format strings of the source that prints it (named next to it); each pasting style
is what a tool or a page does to every line of a whole log: a log collector's or viewer's prefix (an RFC 3339 time
stamp, docker compose's service column, `kubectl logs --prefix`, journald), terminal colours (with or without the
ESC byte the page dropped), a Markdown code block indented four spaces, or both. The first diagnosis and its ranks
must be those of the plain log, and a healthy log must stay quiet under every style.

The real-log corpus is pasted differently in tests/explain/test_real_logs.py (terminal-wrapped, CRLF, quote marks,
pasted line numbers); these styles are the ones a log collector adds.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable

import pytest

from ddpdoctor.explain import explain_text

# torch/distributed/elastic/multiprocessing/api.py (the agent's "failed (exitcode: ...) local_rank: ..." line) and
# errors/__init__.py (_MSG_FORMAT_TEMPLATE, _FAILURE_FORMAT_TEMPLATE) for a worker killed by SIGKILL.
SUMMARY_SIGKILL = """\
E1122 01:39:40.561000 4565 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 4569) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-11-22_01:39:40
  host      : node-a
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4569)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4569
============================================================
"""
# torch/distributed/distributed_c10d.py (_get_default_group), raised on rank 1 under torchrun's "[rank1]:" prefix.
RANK_PREFIXED_TRACEBACK = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/u/train.py", line 31, in main
[rank1]:     dist.barrier()
[rank1]: ValueError: Default process group has not been initialized, please make sure to call init_process_group.
"""
# ProcessGroupNCCL.cpp (the watchdog's timeout message, WorkNCCL's repr) under torchrun's prefix and a glog header.
WATCHDOG = (
    "[rank0]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600022 "
    "milliseconds before timing out.\n")
# Three processes writing one stream, each ending its traceback with a bare AssertionError (CPython's
# traceback.format_exception_only prints the type alone for an empty message): the multi-process sign.
TRACEBACK_ASSERT = """\
Traceback (most recent call last):
  File "/home/u/train.py", line 90, in <module>
    assert not torch.isnan(loss)
AssertionError
"""
THREE_RANKS_ASSERT = TRACEBACK_ASSERT * 3
# ProcessGroupGloo.cpp ("Gloo connectFullMesh failed with " + the exception's text) in a Ray Train worker's
# "(RayTrainWorker pid=..., ip=...)" prefix (ray/_private/log_monitor.py) before torchrun's "[rank1]:".
RAY_GLOO = ("(RayTrainWorker pid=933, ip=10.0.0.2) [rank1]:[E528 08:52:46.164295950 ProcessGroupGloo.cpp:145] Gloo "
            "connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144] no error\n")
# A healthy run: NCCL's INFO lines (init.cc, bootstrap), a trainer's progress and a UserWarning.
HEALTHY = """\
node-a:4565:4601 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
node-a:4565:4601 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
node-a:4565:4601 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0xabc - Init COMPLETE
/usr/lib/python3.10/site-packages/torch/utils/data/dataloader.py:558: UserWarning: This DataLoader will create 8 worker processes in total.
epoch 1 step 100 loss 2.3104 lr 0.0001
epoch 1 step 200 loss 1.9821 lr 0.0001
"""

LOGS = {
    "torchrun-summary-sigkill": (SUMMARY_SIGKILL, ("worker-killed-by-signal", [1])),
    "rank-prefixed-traceback": (RANK_PREFIXED_TRACEBACK, ("default-pg-not-initialized", [1])),
    "nccl-watchdog": (WATCHDOG, ("nccl-timeout", [0])),
    "three-ranks-bare-assertion": (THREE_RANKS_ASSERT, ("python-exception", [])),
    "ray-worker-gloo": (RAY_GLOO, ("gloo-connect-failed", [1])),
}


def _per_line(decorate: Callable[[int, str], str]) -> Callable[[str], str]:
    return lambda text: "".join(decorate(i, ln) for i, ln in enumerate(text.splitlines(keepends=True)))


def _coloured(line: str, esc: str) -> str:
    body = line.rstrip("\n")
    return f"{esc}[31m{body}{esc}[0m" + line[len(body):]


STYLES: dict[str, Callable[[str], str]] = {
    # `docker logs -t`, `kubectl logs --timestamps`: RFC3339Nano in UTC before every line.
    "rfc3339nano": _per_line(lambda i, ln: f"2024-05-01T10:00:{i % 60:02d}.123456789Z {ln}"),
    # GitHub Actions' raw log: seven digits of fraction.
    "github-actions": _per_line(lambda i, ln: f"2024-05-01T10:00:00.1234567Z {ln}"),
    # A `[%(asctime)s] ` logging format.
    "bracketed-asctime": _per_line(lambda i, ln: f"[2024-05-01 10:00:00,123] {ln}"),
    # docker compose (cmd/formatter/logs.go: `%-{width}s | `, coloured per service).
    "docker-compose": _per_line(lambda i, ln: f"\x1b[36mtrainer-1  | \x1b[0m{ln}"),
    # kubectl logs --prefix (pkg/cmd/logs/logs.go: "[pod/%s/%s] ").
    "kubectl-prefix": _per_line(lambda i, ln: f"[pod/ddp-worker-0/pytorch] {ln}"),
    # A Kubernetes node's /var/log/containers file (CRI format: time, stream, full/partial tag; containerd, CRI-O).
    "cri": _per_line(lambda i, ln: f"2024-05-01T10:00:00.123456789Z stderr F {ln}"),
    # docker's json-file records as stored on the host (moby daemon/logger/jsonfilelog): one JSON object a line.
    "docker-json-file": _per_line(lambda i, ln: json.dumps({"log": ln, "stream": "stderr",
                                                            "time": "2024-05-01T10:00:00.123456789Z"},
                                                           separators=(",", ":")) + "\n"),
    # The whole log, after the command that ran it, as one JSON string (a collector's record, an API's answer), and
    # as Python's repr of it (a captured stderr printed by a wrapper).
    "one-json-string": lambda text: json.dumps({"message": "$ torchrun train.py\n" + text}) + "\n",
    "one-python-repr": lambda text: f"output: {'$ torchrun train.py' + chr(10) + text!r}\n",
    # journalctl's short format.
    "journald": _per_line(lambda i, ln: f"May 01 10:00:00 node-a python3[4565]: {ln}"),
    # A colouring logger's SGR codes, and the same codes after a web page dropped the ESC byte ("[31m").
    "ansi-colours": _per_line(lambda i, ln: _coloured(ln, "\x1b")),
    "ansi-colours-esc-lost": _per_line(lambda i, ln: _coloured(ln, "")),
    # A Markdown code block made by indenting every line four spaces; and that of a time-stamped log.
    "indented-4": _per_line(lambda i, ln: f"    {ln}"),
    "indented-4-timestamped": _per_line(lambda i, ln: f"    2024-05-01T10:00:00.123Z {ln}"),
    # The log as a web page's source holds it, or a tool that escaped it for HTML (`in &lt;module&gt;`, `&#39;`).
    "html-escaped": lambda text: html.escape(text),
    # Copied from a rendered page, a chat or a document: no-break spaces for every space, curly quotes.
    "web-page-copy": lambda text: text.replace(" ", "\u00a0").replace("'", "\u2019").replace('"', "\u201d"),
}


def _first(text: str) -> tuple[str, list[int]] | None:
    result = explain_text(text)
    return (result.diagnoses[0].id, sorted(result.diagnoses[0].ranks)) if result.diagnoses else None


@pytest.mark.parametrize("log", list(LOGS))
def test_the_plain_logs_are_named(log: str) -> None:
    text, want = LOGS[log]
    assert _first(text) == want


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("log", list(LOGS))
def test_a_whole_log_prefixed_coloured_or_indented_keeps_its_diagnosis_and_ranks(log: str, style: str) -> None:
    text, want = LOGS[log]
    assert _first(STYLES[style](text)) == want


@pytest.mark.parametrize("style", list(STYLES))
def test_a_healthy_log_stays_quiet_in_every_style(style: str) -> None:
    assert explain_text(STYLES[style](HEALTHY)).failures == []


def test_a_collectors_prefix_is_not_taken_from_a_messages_own_text() -> None:
    """Indented, the short prefixes (a pasted line number "[2] ", srun's "10: ") are a message's own text: the
    desync report's lagging ranks (ProcessGroupNCCL.cpp / TraceUtils.h) stay in it."""
    desync = ("[rank0]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
              "operation timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) "
              "ran for 600022 milliseconds before timing out.\n"
              "\t - [0] Timeout at collective: ALLREDUCE, #6\n"
              "\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:\n"
              "\t     [2] finished collective #5, but didn't join collective #6 (count from 1)\n")
    for text in (desync, STYLES["rfc3339nano"](desync)):
        got = {d.id: d for d in explain_text(text).diagnoses}
        assert got["desync-report"].details["lagging_ranks"] == ["2"]


# --- an exception's repr inside a list, a dict or a framework's wrapper ---------------------------------------
# CPython's BaseException.__repr__ (Objects/exceptions.c): the type, then the message's repr (single quotes unless
# the message holds one). Messages: distributed_c10d.py (_get_default_group), ProcessGroupNCCL.cpp
# (check_gpu_tensors), ProcessGroupNCCL.cpp/NCCLUtils's "NCCL error in: ..." with NCCL's "Last error:" detail from
# misc/socket.cc (socketStartConnect), as DistBackendError's repr writes its newlines.
DEFAULT_PG = "Default process group has not been initialized, please make sure to call init_process_group."
NCCL_CONNECT = ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run "
                "with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\\nncclSystemError: System call (e.g. socket, "
                "malloc) or external library call failed or device error. \\nLast error:\\nsocketStartConnect: Connect "
                "to 10.0.0.2<35841> failed : Software caused connection abort")


@pytest.mark.parametrize(("text", "want"), [
    (f"[RuntimeError('{DEFAULT_PG}')]\n", "default-pg-not-initialized"),
    (f"{{'rank': 1, 'error': \"ValueError('{DEFAULT_PG}')\"}}\n", "default-pg-not-initialized"),
    (f"ERROR:root:worker failed: RuntimeError('{DEFAULT_PG}')\n", "default-pg-not-initialized"),
    ("ray.exceptions.RayTaskError(RuntimeError): RuntimeError('Tensors must be CUDA and dense')\n", "tensors-not-cuda"),
    (f"{{'rank': 1, 'error': \"DistBackendError('{NCCL_CONNECT}')\"}}\n", "nccl-connect-failed"),
], ids=["list", "dict", "logged", "ray-wrapper", "nccl-error-repr"])
def test_an_exceptions_repr_is_read_as_its_message(text: str, want: str) -> None:
    result = explain_text(text)
    assert [d.id for d in result.failures][:1] == [want]
    assert result.failures[0].level == "error"  # "SomeError('" is an error's mark, whatever its message says later


def test_a_retried_requests_repr_is_no_diagnosis() -> None:
    """urllib3's retry warning quotes ProtocolError's repr on healthy runs (connectionpool.py's "Retrying (...) after
    connection broken by '{err!r}'"): no type torch.distributed raises, so the scanner does not even look at it
    (test_explain's prefilter test holds that for speed), and it names nothing."""
    line = ("WARNING:urllib3.connectionpool:Retrying (Retry(total=4, connect=None, read=None, redirect=None, "
            "status=None)) after connection broken by 'ProtocolError('Connection aborted.', RemoteDisconnected('Remote "
            "end closed connection without response'))': /simple/torch/\n")
    assert explain_text(HEALTHY + line).diagnoses == []


# --- an exception line that is its type alone ---------------------------------------------------------------------
# CPython's traceback.format_exception_only prints only the type when str(exc) is empty: `raise NotImplementedError`,
# `raise RuntimeError`, an `assert` without a message. Two ranks printing into one stream (a header right after the
# other's frame) make it a distributed job.
def _two_ranks_raising(kind: str, code: str) -> str:
    frame = '  File "/workspace/llava/train/train_mem.py", line 13, in <module>\n'
    return ("Traceback (most recent call last):\n" + frame + "Traceback (most recent call last):\n" + frame
            + f"    {code}\n{kind}\n" + f"    {code}\n{kind}\n")


@pytest.mark.parametrize(("kind", "code"), [
    ("NotImplementedError", "raise NotImplementedError"),
    ("RuntimeError", "raise RuntimeError"),
    ("AssertionError", "assert loss.isfinite()"),
    ("torch.distributed.DistBackendError", "raise DistBackendError"),
])
@pytest.mark.parametrize("style", ["plain", "rank-prefixed", "crlf", "quoted", "rfc3339nano"])
def test_a_bare_exception_name_ending_a_ranks_traceback_is_its_exception(kind: str, code: str, style: str) -> None:
    text = _two_ranks_raising(kind, code)
    if style == "rank-prefixed":
        text = "".join(f"[rank{i % 2}]: {ln}" for i, ln in enumerate(text.splitlines(keepends=True)))
    elif style == "crlf":
        text = text.replace("\n", "\r\n")
    elif style == "quoted":
        text = "".join(f"> {ln}" for ln in text.splitlines(keepends=True))
    elif style == "rfc3339nano":
        text = STYLES["rfc3339nano"](text)
    got = explain_text(text).failures
    assert [d.id for d in got] == ["python-exception"]
    assert got[0].details["exception"] == [kind.rsplit(".", 1)[-1]]


def test_a_type_name_alone_outside_a_traceback_is_a_word() -> None:
    """A type's name alone on a line that no traceback frame precedes (a table, a printed value) is no exception."""
    text = WATCHDOG.replace("[Rank 0] Watchdog caught", "[Rank 0] Watchdog saw") + "errors seen:\nValueError\nKeyError\n"
    assert explain_text(text).failures == []


def test_a_bare_exception_of_one_script_is_no_false_alarm() -> None:
    text = 'Traceback (most recent call last):\n  File "/home/u/run.py", line 3, in <module>\n' \
           '    raise NotImplementedError\nNotImplementedError\n'
    assert explain_text(text).failures == []



# --- an exception line glued onto the source line above it ------------------------------------------------------
# A thread excerpt or a comment box that lost a line break but kept the padding to the page's width: the traceback's
# last source line, a run of spaces, then the exception line (Python's traceback.format_exception_only).
@pytest.mark.parametrize(("last", "want"), [
    ("AttributeError: 'NoneType' object has no attribute 'dtype'", "python-exception"),
    ("ValueError: Default process group has not been initialized, please make sure to call init_process_group.",
     "default-pg-not-initialized"),
])
def test_an_exception_line_glued_onto_the_source_line_is_read_as_its_own_line(last: str, want: str) -> None:
    def log(glue: str) -> str:
        return (f'[rank1]: Traceback (most recent call last):\n[rank1]:   File "/home/u/train.py", line 31, in main\n'
                f"[rank1]:     mask = build(shape, dtype=embeds.dtype){glue}{last}\n")
    plain = explain_text(log("\n[rank1]: ")).failures
    glued = explain_text(log(" " * 40)).failures
    assert [(d.id, sorted(d.ranks)) for d in glued] == [(d.id, sorted(d.ranks)) for d in plain] == [(want, [1])]
    assert glued[0].rank_events[1].frame == plain[0].rank_events[1].frame == "/home/u/train.py:31 in main"
    # Two spaces before a comment's "# ValueError: ..." or a message quoting one is no glued line.
    comment = "[rank1]:     x = f(y)  # ValueError: when y is empty\n[rank1]: step 3 loss 0.25\n"
    assert explain_text(comment).failures == []


# --- lines a paste flattened with a literal "\n" ----------------------------------------------------------------
# torchrun's error file (torch/distributed/elastic/multiprocessing/errors/error_handler.py: {"message": {"message":
# ..., "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": ...}}}) pasted as `cat error.json` shows it.
def test_torchruns_error_file_pasted_into_a_log_is_read_as_its_traceback() -> None:
    callstack = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 31, in main\n    dist.barrier()\n'
                 f"ValueError: {DEFAULT_PG}\n")
    record = {"message": {"message": f"ValueError: {DEFAULT_PG}",
                          "extraInfo": {"py_callstack": callstack, "timestamp": "1732240780"}}}
    text = "cat /tmp/torchelastic_x/attempt_0/1/error.json\n" + json.dumps(record) + "\n"
    assert explain_text(text).diagnoses[0].id == "default-pg-not-initialized"
    # The traceback alone (a record whose "message" was cut): its frames are read as frames.
    text = json.dumps({"py_callstack": callstack}) + "\n"
    got = explain_text(text).diagnoses[0]
    assert (got.id, got.details["frame"]) == ("default-pg-not-initialized", ["/home/u/train.py:31 in main"])


def test_a_windows_path_is_not_taken_for_a_flattened_line() -> None:
    r"""``C:\Users\me\nccl_tests\new`` holds "\n" before a small letter: no line of a log starts so; the path stays
    whole and so does the cut traceback read from its frames (frames.py's Windows rule)."""
    from ddpdoctor.explain.lines import unflatten

    frame = 'Traceback (most recent call last):\n  File "C:\\Users\\me\\nccl_tests\\new\\train.py", line 9, in <module>\n' \
            "    dist.init_process_group(backend='nccl')\n"
    assert unflatten(frame.encode(), len(frame.encode())) is None
    got = explain_text(frame).diagnoses[0]
    assert got.id == "nccl-not-available"


# --- a paste that stops inside its last message -------------------------------------------------------------------
# Format strings: distributed_c10d.py (_get_default_group; the NCCL-less build's check), TCPStore.cpp's DistStoreError
# ("Timed out after {} seconds waiting for clients. {}/{} clients joined."), ProcessGroupNCCL.cpp's watchdog timeout.
CUT_MESSAGES = [
    (f"[rank1]: ValueError: {DEFAULT_PG}"[:58], "default-pg-not-initialized", [1]),
    ("[rank1]: torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 1/3 clients jo",
     "rendezvous-incomplete", [1]),
    (WATCHDOG[:WATCHDOG.index("OpType=") + 13], "nccl-timeout", [0]),
    ("RuntimeError: Distributed package doesn't have NCCL bu", "nccl-not-available", []),
]


@pytest.mark.parametrize(("line", "want", "ranks"), CUT_MESSAGES, ids=["default-pg", "store-clients", "watchdog", "no-nccl"])
@pytest.mark.parametrize("style", ["plain", "after-a-traceback", "rfc3339nano", "quoted", "trailing-blank-lines",
                                   "terminal-wrapped"])
def test_a_message_the_paste_cut_short_is_still_named(line: str, want: str, ranks: list[int], style: str) -> None:
    text = line + "\n"
    if style == "after-a-traceback":
        text = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 31, in main\n    dist.barrier()\n'
                + text)
    elif style == "terminal-wrapped":  # copied from a 64-column terminal: every longer line cut into 64-wide pieces
        text = ('Traceback (most recent call last):\n  File "/home/user/projects/llm/train_distributed.py", line 31, '
                'in main\n    dist.barrier()\n  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/'
                'c10d_logger.py", line 79, in wrapper\n    return func(*args, **kwargs)\n' + text)
        text = "".join("\n".join(ln[i:i + 64] for i in range(0, len(ln), 64)) + "\n" for ln in text.splitlines())
    elif style == "rfc3339nano":
        text = STYLES["rfc3339nano"](text)
    elif style == "quoted":
        text = "> " + text
    elif style == "trailing-blank-lines":
        text += "\n\n"
    got = explain_text(text).failures
    assert [(d.id, sorted(d.ranks)) for d in got] == [(want, ranks)]
    assert got[0].details["cut"] == ["the paste ends inside this message"]


# ProcessGroupNCCL.cpp (the constructor's TORCH_CHECK): "ProcessGroupNCCL is only supported with GPUs, no GPUs
# found!", here cut after 29 characters of it, inside a word (ChatGLM-6B#829's paste stops so), under the frames of
# init_process_group.
CUT_MIDWORD = (
    'Traceback (most recent call last):\n  File "/home/u/train.py", line 12, in <module>\n'
    '    dist.init_process_group(backend="nccl")\n'
    '  File "/usr/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 1009, in '
    '_new_process_group_helper\n'
    '    backend_class = ProcessGroupNCCL(backend_prefix_store, group_rank, group_size, pg_options)\n'
    'RuntimeError: ProcessGroupNCCL is only supp\n')


def test_a_message_cut_inside_a_word_is_named_with_less_of_it_shown() -> None:
    """Fewer than MIN_CUT_CHARS of the message, but the paste stops inside one of its words: no other message
    could have gone on from there. Stopped at a word's end, the same few words could begin another message."""
    got = explain_text(CUT_MIDWORD).failures
    assert [d.id for d in got] == ["no-gpu-visible"]
    assert got[0].details["cut"] == ["the paste ends inside this message"]
    at_word_end = CUT_MIDWORD.replace("only supp\n", "only\n")
    assert "no-gpu-visible" not in [d.id for d in explain_text(at_word_end).diagnoses]


def test_a_sign_of_a_job_that_a_terminals_wrap_cut_in_two_still_counts() -> None:
    """Lightning's DDP launcher frame (``pytorch_lightning/strategies/launchers/subprocess_script.py``) is the only
    sign of a job in OpenFold's cut traceback; copied from a 120-column terminal the path is cut inside
    "strategies", and the rank's cut traceback read as nothing at all."""
    site = "/home/u/miniforge/envs/openfold_cuda12/lib/python3.10/site-packages/pytorch_lightning"
    log = ('Traceback (most recent call last):\n  File "/home/u/openfold/train_openfold.py", line 455, in main\n'
           "    trainer.fit(\n"
           f'  File "{site}/trainer/call.py", line 43, in _call_and_handle_interrupt\n'
           "    return trainer.strategy.launcher.launch(trainer_fn, *args, trainer=trainer, **kwargs)\n"
           f'  File "{site}/strategies/launchers/subprocess_script.py", line 105, in launch\n'
           "    return function(*args, **kwargs)\n"
           f'  File "{site}/trainer/trainer.py", line 579, in _fit_impl\n'
           "    self._run(model, ckpt_path=ckpt_path)\n")
    whole = [(d.id, d.signature.is_note) for d in explain_text(log).diagnoses]
    assert whole == [("python-exception", False)]
    width = log.index("strategies") - log.rfind("\n", 0, log.index("strategies")) + 3  # a cut inside the word
    wrapped = "".join("\n".join(ln[i:i + width] for i in range(0, len(ln), width)) + "\n" for ln in log.splitlines())
    assert "strategies" not in wrapped
    assert [(d.id, d.signature.is_note) for d in explain_text(wrapped).diagnoses] == whole


def test_no_template_cut_inside_a_word_is_read_as_another_signatures() -> None:
    """Every message of the inventory, cut inside a word of its first 20-31 characters (a short excerpt), is read as
    its own signature or not at all: never as a message of another kind that begins alike."""
    from ddpdoctor.explain.templates import (
        MIN_CUT_CHARS,
        MIN_MIDWORD_CUT_CHARS,
        TemplateMatcher,
        load_templates,
    )

    templates = load_templates()
    matcher = TemplateMatcher(templates)
    read = other = 0
    for t in templates:
        head = t.pieces[0]
        for n in range(MIN_MIDWORD_CUT_CHARS, min(MIN_CUT_CHARS, len(head))):
            if head[n - 1].isalnum() and head[n].isalnum():
                got = matcher.match_cut("RuntimeError: " + head[:n])
                read += got is not None
                other += got is not None and got.signature != t.signature
    assert other == 0 and read > 10_000, (read, other)


@pytest.mark.parametrize("last", [
    "node-a:4565:4601 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/rea",  # NCCL's INFO line, cut
    "epoch 1 step 300 loss 1.7432 lr 0.0001 grad_norm 0.8",  # a trainer's progress, cut
    # c10d's retry (TCPStore.cpp, a warning) cut where it could still have become the "- timed out" failure
    "[W1122 07:27:45.431901986 TCPStore.cpp:343] [c10d] TCP client failed to connect/validate to host node-a:29500 - re",
    # ... and the retry whole: a message that goes on differently is no cut failure
    "[c10d] TCP client failed to connect/validate to host node-a:29500 - retrying (try=0, timeout=1800000ms, "
    "delay=496ms): The client socket has failed to connect to [node-a]:29500 (errno: 111 - Connection refused).",
])
def test_a_healthy_log_cut_short_stays_quiet(last: str) -> None:
    assert explain_text(HEALTHY + last + "\n").failures == []


# --- what a rich-text editor or a web page makes of a message's ASCII ----------------------------------------------
@pytest.mark.parametrize(("text", "want"), [
    ("RuntimeError: Distributed package doesn\u2019t have NCCL built in\n", "nccl-not-available"),  # a curly apostrophe
    (f"ValueError: {DEFAULT_PG.replace(' ', chr(0xa0), 3)}\n", "default-pg-not-initialized"),  # no-break spaces
    (f"Runtime\u200bError: {DEFAULT_PG}\n", "default-pg-not-initialized"),  # a zero-width space from HTML
])
def test_typographic_characters_in_a_pasted_message_are_read_as_ascii(text: str, want: str) -> None:
    assert [d.id for d in explain_text(text).failures] == [want]


def test_a_flattened_line_holding_two_log_lines_reads_both() -> None:
    """A thread's excerpt that lost the line breaks: the rank's watchdog timeout and, on the same line, torchrun's
    logging line about that rank's exit (Python logging's default "ERROR:logger:" format). Each is read: the
    timeout is the cause, the failed worker its consequence (before, the launcher's line took the whole line)."""
    line = ("RuntimeError: NCCL communicator was aborted on rank 0.  Original reason for failure was: [Rank 0] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=719709, OpType=ALLREDUCE, Timeout(ms)=1800000) ran "
            "for 1807565 milliseconds before timing out. ERROR:torch.distributed.elastic.multiprocessing.api:failed "
            "(exitcode: 1) local_rank: 0 (pid: 1530483) of binary: /home/u/.conda/envs/sod/bin/python3.8\n")
    assert [d.id for d in explain_text(line).diagnoses] == ["nccl-timeout", "worker-failed"]
    # The same at the end of a flattened line longer than what one match is handed (read in windows).
    long_line = "INFO:train:step 1 loss 2.31 " * 200 + "Traceback (most recent call last): " + line
    assert len(long_line) > 4096
    assert [d.id for d in explain_text(long_line).diagnoses] == ["nccl-timeout", "worker-failed"]
    # A message that merely mentions a level word, or a rank in brackets, is one line.
    from ddpdoctor.explain.lines import embedded_lines

    for text in ("RuntimeError: bad value for ERROR: see the log", "[Rank 0] Watchdog caught collective operation"):
        assert embedded_lines(text) == [text]
