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

Without ``--evidence DIR`` the folder is a new ``ddpdoctor-watch-*`` directory in the temporary directory,
named in the report.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ddpdoctor.errors import DoctorError
from ddpdoctor.fileio import atomic_output, write_json_atomic

FR_FOLDER = "flight_recorder"


def validate(folder: str | None) -> None:
    """``--evidence DIR``: refused before any rank starts when it could not be created or written."""
    if folder is None:
        return
    if os.path.exists(folder):
        if not os.path.isdir(folder):
            raise DoctorError(f"--evidence {folder!r}: exists and is not a folder")
        if not os.access(folder, os.W_OK):
            raise DoctorError(f"--evidence {folder!r}: the folder is not writable")
        return
    parent = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(parent):
        raise DoctorError(f"--evidence {folder!r}: the folder {parent!r} does not exist")


def prepare(folder: str | None) -> str | None:
    """The bundle's folder, created now (only failed runs have one); None, said in one line, when it
    cannot be created (the report still comes)."""
    try:
        if folder is None:
            folder = tempfile.mkdtemp(prefix="ddpdoctor-watch-")
        os.makedirs(os.path.join(folder, FR_FOLDER), exist_ok=True)
    except OSError as exc:
        print(f"ddpdoctor watch: cannot create the evidence folder ({exc}); no bundle", file=sys.stderr, flush=True)
        return None
    return os.path.abspath(folder)


def fr_path(folder: str, rank: int) -> str:
    """Where rank N writes its Flight Recorder dump (``ddpdoctor fr FOLDER/flight_recorder`` reads them)."""
    return os.path.join(folder, FR_FOLDER, f"fr_rank_{rank}")


def _write_text(path: str, text: str) -> None:
    with atomic_output(Path(path)) as handle:
        handle.write(text.encode("utf-8"))


def write(folder: str, result: dict[str, Any], report: str, histories: dict[int, list[dict[str, Any]]],
          outputs: dict[int | None, str] | None = None) -> list[str]:
    """Write the bundle; the names written (a file that cannot be written is named with why, not fatal:
    the report on the terminal matters more than any one file)."""
    written: list[str] = []

    def attempt(name: str, action: Any) -> None:
        try:
            action(os.path.join(folder, name))
            written.append(name)
        except (OSError, DoctorError, TypeError, ValueError) as exc:
            written.append(f"{name} (not written: {exc})")

    attempt("verdict.json", lambda p: write_json_atomic(p, result))
    attempt("report.txt", lambda p: _write_text(p, report + "\n"))
    attempt("env.json", lambda p: write_json_atomic(p, _env_facts()))
    for rank in result["ranks"]:
        number = rank["rank"]
        if rank["stack"]:
            attempt(f"stack_rank_{number}.txt", lambda p, r=rank: _write_text(p, "\n".join(r["stack"]) + "\n"))
        history = histories.get(number)
        if history:
            attempt(f"history_rank_{number}.json",
                    lambda p, h=history: _write_text(p, json.dumps(h, indent=1) + "\n"))
        if rank.get("flight_recorder") and os.path.exists(fr_path(folder, number)):
            written.append(os.path.relpath(fr_path(folder, number), folder))
    for key, text in (outputs or {}).items():
        if text:
            name = f"output_rank_{key}.txt" if key is not None else "output_script.txt"
            attempt(name, lambda p, t=text: _write_text(p, t))
    return written


def _env_facts() -> dict[str, Any]:
    from ddpdoctor.env import collect

    return collect(with_torch=True)
