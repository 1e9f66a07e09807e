"""`ddpdoctor ras` given a hostile reply (issue 20): numbers no NCCL writes, wrong types, absurd rank
ranges. The service is the stand-in of tests/ras/server.py (a real TCP server speaking NCCL's RAS client
protocol; no NCCL job can run here). Before the fix each of these exited 3 or hung; now one line, exit 2.
"""

from __future__ import annotations

import json

import pytest

from tests.ras.server import DATA, RasStandIn
from tests.support import run_cli

# NCCL's own JSON reply (tests/ras/data/SOURCES.md), then edited one field at a time.
DEAD = (DATA / "dead.json").read_text()
HEALTHY_TEXT = (DATA / "healthy.txt").read_text()


def _edited_json(path: list[str | int], raw: str) -> str:
    """``DEAD`` with the value at ``path`` replaced by ``raw`` (JSON text that json.dumps cannot write)."""
    doc = json.loads(DEAD)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "@@VALUE@@"
    return json.dumps(doc).replace('"@@VALUE@@"', raw)


def _first_rank_path() -> list[str | int]:
    doc = json.loads(DEAD)
    [ci] = [i for i, c in enumerate(doc["communicators"]) if c.get("ranks")][:1]
    return ["communicators", ci, "ranks", 0]


@pytest.mark.parametrize(("body", "text"), [
    (lambda: _edited_json(["communicators", 0, "size"], "Infinity"), "Infinity"),
    (lambda: _edited_json([*_first_rank_path(), "rank"], "1e400"), "1e400"),
    (lambda: _edited_json([*_first_rank_path(), "pid"], "9" * 5000), "5000 digits"),
    (lambda: _edited_json([*_first_rank_path(), "host"], "[1, 2]"), "host"),
    (lambda: _edited_json([*_first_rank_path(), "rank"], "-5"), "rank"),
], ids=["size-infinity", "rank-1e400", "pid-5000-digits", "host-list", "negative-rank"])
def test_hostile_json_reply_is_one_line_exit_2(body: object, text: str) -> None:
    with RasStandIn(HEALTHY_TEXT, body()) as srv:  # type: ignore[operator]
        res = run_cli(["ras", "--addr", srv.addr, "--timeout", "10"], timeout=60)
    assert res.returncode == 2, (res.returncode, res.stdout[-300:], res.stderr[-1500:])
    assert res.stderr.count("\n") == 1 and text in res.stderr and "Traceback" not in res.stderr, res.stderr


NO_LIST = "without a 'communicators' list"
NOT_NCCLS = "a status that NCCL does not write"
NO_RANK = "names no rank"


@pytest.mark.parametrize(("body", "text"), [
    ("[]", NO_LIST), ("null", NO_LIST), ('{"communicators": 5}', NO_LIST),  # refused before the fix too
    ("{}", NO_LIST),
    ('{"nccl_version": "2.28.9", "communicators": [5]}', "communicators[0] is '5', not an object"),
    ('{"communicators": []}', NO_RANK),
    ('{"communicators": [{"hash": "0x1", "size": 2, "ranks": [], "missing_ranks": []}]}', NO_RANK),
    ('{"communicators": [{"hash": "0x1", "size": 2, "ranks": "0,1"}]}', "communicators[0].ranks is '0,1', not a list"),
    ('{"communicators": [{"hash": "0x1", "size": 2, "missing_ranks": [1]}]}', "missing_ranks[0] is '1', not an object"),
    ('{"communicators": [{"hash": "0x1", "size": 2, "missing_ranks": [{"host": "h"}]}]}', "has no rank"),
], ids=["list", "null", "number", "empty-object", "entries-not-objects", "no-communicator", "no-rank",
        "ranks-not-a-list", "missing-rank-not-an-object", "missing-rank-without-rank"])
def test_json_reply_that_names_no_rank_is_never_an_all_clear(body: str, text: str) -> None:
    """An explorer's find: ``{}`` and ``{"communicators": [5]}`` read as "every rank answered", exit 0, where
    ``[]``, ``null`` and ``{"communicators": 5}`` were refused. A reply that is not NCCL's layout, or names no
    rank at all, is refused the same way (one line, exit 2); never an all-clear."""
    with RasStandIn(HEALTHY_TEXT, body) as srv:
        res = run_cli(["ras", "--addr", srv.addr, "--timeout", "10"], timeout=60)
    assert res.returncode == 2, (res.returncode, res.stdout[-300:], res.stderr[-1500:])
    assert "every rank answered" not in res.stdout
    assert res.stderr.count("\n") == 1 and text in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_text_reply_that_is_no_status_report_is_never_an_all_clear() -> None:
    """Text after a good handshake that holds neither NCCL's job summary nor its communicators table ("hello")
    read as "every rank answered", exit 0 (the fixing helper's find, beside the JSON one above)."""
    with RasStandIn("hello\n") as srv:
        res = run_cli(["ras", "--addr", srv.addr, "--text", "--timeout", "10"], timeout=60)
    assert res.returncode == 2, (res.returncode, res.stdout[-300:], res.stderr[-1500:])
    assert "every rank answered" not in res.stdout
    assert res.stderr.strip() == ("ddpdoctor: error: NCCL RAS sent text with no 'Job summary' or 'Communicators' "
                                  "section: not a RAS status report; is something else listening on the RAS port?")


@pytest.mark.parametrize("line", ["    The missing ranks: 0-99999999999", "    The missing rank: " + "7" * 5000])
def test_hostile_text_reply_is_one_line_exit_2(line: str) -> None:
    """NCCL 2.24's Errors section (dead.txt) with its missing-rank list made absurd."""
    body = (DATA / "dead.txt").read_text()
    lines = [ln for ln in body.splitlines() if "The missing rank" in ln]
    assert lines, "dead.txt lists its missing rank"
    with RasStandIn(body.replace(lines[0], line)) as srv:
        res = run_cli(["ras", "--addr", srv.addr, "--text", "--timeout", "10"], timeout=60)
    assert res.returncode == 2, (res.returncode, res.stdout[-300:], res.stderr[-1500:])
    assert res.stderr.count("\n") == 1 and "rank" in res.stderr and "Traceback" not in res.stderr, res.stderr
