"""`ddpdoctor stacks` adds NCCL's RAS verdict to its report, and a hung RAS service costs it at most ~1 s.

The stacks are real (py-spy on a real blocked process); the RAS service is the labelled stand-in of
``tests/ras/server.py`` (a real TCP server replaying NCCL transcripts), because NCCL's RAS needs a GPU job.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator

import pytest

from tests.ras.server import RasStandIn
from tests.support import BLOCKED_TARGET, clean_env, run_cli, started


@pytest.fixture(scope="module")
def blocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    log = tmp_path_factory.mktemp("target") / "target.log"
    with started([sys.executable, str(BLOCKED_TARGET)], log) as proc:
        yield proc.pid


def test_dead_rank_from_ras_is_in_the_report_and_the_exit_code(blocked: int) -> None:
    with RasStandIn.from_files("dead.txt", "dead.json") as srv:
        res = run_cli(["stacks", "--pid", str(blocked)], env=clean_env({"NCCL_RAS_ADDR": srv.addr}))
        doc_res = run_cli(["stacks", "--pid", str(blocked), "--json", "-"],
                          env=clean_env({"NCCL_RAS_ADDR": srv.addr}))
    assert res.returncode == 1, res.stderr  # the one local process agrees with itself; RAS lost rank 3
    assert f"NCCL RAS at {srv.addr} (NCCL 2.28.9, json): PROBLEM" in res.stdout
    assert "rank 3 dead (RAS gave up on them): pid 4103 on 10.0.0.1" in res.stdout
    doc = json.loads(doc_res.stdout)
    assert doc["ras"]["dead_ranks"] == [3] and doc["processes"][0]["pid"] == blocked


def test_ras_that_hangs_mid_reply_is_cut_off_and_the_stacks_still_come(blocked: int) -> None:
    with RasStandIn.from_files("healthy.txt", hang_after=40) as srv:
        res = run_cli(["stacks", "--pid", str(blocked), "--json", "-"], env=clean_env({"NCCL_RAS_ADDR": srv.addr}),
                      timeout=120)
    assert res.returncode == 0, res.stderr  # a slow RAS is noted, not a problem of the job's ranks
    doc = json.loads(res.stdout)
    assert "did not answer in time" in doc["ras"]["error"] and "after 40 bytes" in doc["ras"]["error"]
    assert doc["processes"][0]["pid"] == blocked


def test_no_ras_service_no_ras_section(blocked: int) -> None:
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 28028)) == 0:
            pytest.skip("something listens on the default RAS port 28028 here")
    env = clean_env()
    env.pop("NCCL_RAS_ADDR", None)
    res = run_cli(["stacks", "--pid", str(blocked), "--json", "-"], env=env)
    assert res.returncode == 0, res.stderr
    assert "ras" not in json.loads(res.stdout)
