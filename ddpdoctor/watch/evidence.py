"""The evidence bundle of a failed watched run: one folder to attach to a bug report.

On a hang, mismatch, crash or init conflict ``watch`` writes (every file atomically):

- ``verdict.json``: the ``--json`` document; ``report.txt``: the text report;
- ``env.json``: what ``ddpdoctor env`` reports for the supervisor's host;
- ``stack_rank_<N>.txt``: rank N's main-thread stack (user frames) at the verdict;
- ``history_rank_<N>.json``: rank N's last recorded calls (op, group, seq, shapes, site), oldest first;
- ``output_rank_<N>.txt``: rank N's last 1000 lines of stdout and stderr (self-launched ranks; a script that
  starts its own ranks: ``output_script.txt``, every process's lines);
- ``flight_recorder/fr_rank_<N>``: rank N's PyTorch Flight Recorder dump, written by the rank itself where
  it is alive, joined a process group, and its torch can dump (``_dump_fr_trace``). Torch's own pickle
  format and file naming (``TORCH_FR_DUMP_TEMP_FILE`` writes ``<prefix><rank>``, no extension), in a folder
  of their own: torch's ``fr_trace.py`` infers the prefix only when every file in the folder ends in a
  rank, and ``ddpdoctor fr`` takes the folder as it is. Ranks on other hosts write theirs into the same
  path on their own host.

Without ``--evidence DIR`` the folder is a new ``ddpdoctor-watch-*`` directory in the temporary directory
(private to the user: it is in a shared folder), named in the report. ``--evidence DIR`` must be a new or
empty folder (checked before any rank starts, and again when the bundle is written: a folder filled in the
meantime gets no bundle mixed into it, a new one is made and named), so a bundle never mixes two runs and
never replaces a user's file; every file is written under the output policy (:mod:`ddpdoctor.outputs`),
and each JSON file is a ddpdoctor document (``"tool"``/``"command"`` first).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from ddpdoctor import outputs
from ddpdoctor.errors import DoctorError

FR_FOLDER = "flight_recorder"


def validate(folder: str | None, plan: outputs.Plan | None = None) -> None:
    """``--evidence DIR``: refused before any rank starts unless it is a new or empty folder that can be
    created and written, and not where another output of the run goes."""
    if folder is not None:
        (plan or outputs.Plan("watch")).folder("--evidence", folder, outputs.EVIDENCE_FOLDER)


def prepare(folder: str | None) -> str | None:
    """The bundle's folder, created now (only failed runs have one); None, said in one line, when it
    cannot be created (the report still comes)."""
    try:
        if folder is not None and not _new_or_empty(folder):
            fallback = tempfile.mkdtemp(prefix="ddpdoctor-watch-")
            print(f"ddpdoctor watch: --evidence {folder} is no longer empty; the bundle goes to {fallback}",
                  file=sys.stderr, flush=True)
            folder = fallback
        elif folder is None:
            folder = tempfile.mkdtemp(prefix="ddpdoctor-watch-")
        os.makedirs(os.path.join(folder, FR_FOLDER), exist_ok=True)
    except OSError as exc:
        print(f"ddpdoctor watch: cannot create the evidence folder ({exc}); no bundle", file=sys.stderr, flush=True)
        return None
    return os.path.abspath(folder)


def _new_or_empty(folder: str) -> bool:
    """Create ``folder`` (the umask decides its mode), or accept it when it is an empty folder."""
    try:
        os.mkdir(folder, 0o777)
        return True
    except FileExistsError:
        return os.path.isdir(folder) and not os.path.islink(folder) and not os.listdir(folder)


def fr_path(folder: str, rank: int) -> str:
    """Where rank N writes its Flight Recorder dump (``ddpdoctor fr FOLDER/flight_recorder`` reads them)."""
    return os.path.join(folder, FR_FOLDER, f"fr_rank_{rank}")


def _write(path: str, kind: outputs.Kind, data: bytes, command: str = "watch") -> None:
    outputs.write_bytes(outputs.resolve("--evidence", path, kind, command=command), data)


Action = Callable[[str], None]  # writes one file of the bundle at the path it is given


def _text_writer(text: str) -> Action:
    return lambda path: _write(path, outputs.TEXT, text.encode("utf-8"))


def _history_writer(doc: dict[str, Any]) -> Action:
    return lambda path: _write(path, outputs.JSON, (json.dumps(doc, indent=1) + "\n").encode("utf-8"), "watch history")


def _plan(result: dict[str, Any], histories: dict[int, list[dict[str, Any]]],
          rank_output: dict[int | None, str] | None, report: str = "") -> list[tuple[str, Action | None]]:
    """The bundle's files, in order, each with what writes it (None: a Flight Recorder dump its rank wrote
    already). One list for :func:`write` and for the report's ``evidence:`` line (:func:`planned`), so the line
    names what the folder holds: a crash before any collective has no stacks, histories or dumps."""
    plan: list[tuple[str, Action | None]] = [
        ("verdict.json", lambda p: outputs.write_json(p, result, "watch", flag="--evidence")),
        ("report.txt", _text_writer(report + "\n")),
        ("env.json", lambda p: outputs.write_json(p, _env_facts(), "env", flag="--evidence")),
    ]
    folder = result.get("evidence")
    for rank in result["ranks"]:
        number = rank["rank"]
        if rank["stack"]:
            plan.append((f"stack_rank_{number}.txt", _text_writer("\n".join(rank["stack"]) + "\n")))
        history = histories.get(number)
        if history:
            doc = outputs.stamp({"rank": number, "calls": history}, "watch history")
            plan.append((f"history_rank_{number}.json", _history_writer(doc)))
        if folder and rank.get("flight_recorder") and os.path.exists(fr_path(folder, number)):
            plan.append((os.path.relpath(fr_path(folder, number), folder), None))
    for key, text in (rank_output or {}).items():
        if text:
            name = f"output_rank_{key}.txt" if key is not None else "output_script.txt"
            plan.append((name, _text_writer(text)))
    return plan


def planned(result: dict[str, Any], histories: dict[int, list[dict[str, Any]]],
            rank_output: dict[int | None, str] | None) -> list[str]:
    """The names :func:`write` will write for this result (the report names them before they are written: the
    report itself is one of them)."""
    return [name for name, _ in _plan(result, histories, rank_output)]


def write(folder: str, result: dict[str, Any], report: str, histories: dict[int, list[dict[str, Any]]],
          rank_output: dict[int | None, str] | None = None) -> list[str]:
    """Write the bundle; the names written (a file that cannot be written is named with why, not fatal:
    the report on the terminal matters more than any one file)."""
    written: list[str] = []
    for name, action in _plan({**result, "evidence": folder}, histories, rank_output, report):
        if action is None:
            written.append(name)
            continue
        try:
            action(os.path.join(folder, name))
            written.append(name)
        except (OSError, DoctorError, TypeError, ValueError) as exc:
            written.append(f"{name} (not written: {exc})")
    _drop_if_empty(os.path.join(folder, FR_FOLDER))
    return written


def _drop_if_empty(dumps: str) -> None:
    """The Flight Recorder folder, made before the run for the ranks' dumps, is removed when no rank wrote one
    (a crash before any collective, a backend without a recorder): an empty folder the report does not name
    looked like dumps that went missing. ``rmdir`` removes only an empty folder, so a dump that arrives late
    stays."""
    with contextlib.suppress(OSError):
        os.rmdir(dumps)


def _env_facts() -> dict[str, Any]:
    from ddpdoctor.env import collect

    return collect(with_torch=True)
