"""`ddpdoctor ras` against a stand-in RAS service, and NCCL's status outputs read right.

What a user relies on: a dead or unresponsive NCCL process is named (rank, pid, host) and the command
exits 1; a healthy job exits 0; a service that never answers or stops mid-reply costs at most --timeout;
nothing listening is one line and exit 2. The service is ``tests/ras/server.py`` -- a real TCP server that
replays transcripts grounded in NCCL's source and docs (``tests/ras/data/SOURCES.md``), standing in for
NCCL's RAS thread, which needs a GPU job.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import build_app
from ddpdoctor.ras import judge, parse_addr, parse_json, parse_text, query, render_text, to_json
from tests.ras.server import DATA, RasStandIn


def _verdict(name: str):
    body = (DATA / name).read_text()
    return judge(parse_json(body) if name.endswith(".json") else parse_text(body), "test")


# ---- NCCL's outputs, parsed and judged (pure) --------------------------------------------------------

def test_healthy_text_is_ok() -> None:
    v = _verdict("healthy.txt")
    assert v.status == "ok" and v.nccl_version == "2.26.2"
    assert not v.dead_ranks and not v.unresponsive_ranks and not v.dead_processes


def test_dead_process_text_names_its_rank_and_pid() -> None:
    v = _verdict("dead.txt")
    assert v.status == "problem"
    assert v.dead_ranks == [21] and v.unresponsive_ranks == []
    assert v.dead_processes == [{"host": "172.16.64.213", "pid": 3487984, "ranks": []}]


def test_unresponsive_text_names_rank_with_its_process() -> None:
    v = _verdict("unresponsive.txt")
    assert v.status == "problem"
    assert v.unresponsive_ranks == [21] and v.dead_ranks == []
    assert v.unresponsive_processes == [{"host": "172.16.64.213", "pid": 3487984, "ranks": [21]}]
    assert v.timeouts == 2


def test_mismatched_counts_are_a_warning_naming_the_ranks_behind() -> None:
    v = _verdict("mismatch.txt")
    assert v.status == "warn"
    counts = v.communicators[0]["op_counts"]["collective"]
    assert counts["max"] == 6650 and counts["behind"] == [1, 6]
    assert counts["ranks_at_count"] == {"6649": 2, "6650": 30}
    assert "30 ranks at 6650; ranks 1,6 at 6649" in render_text(v)


def test_json_unresponsive_rank_from_nccl_docs() -> None:
    v = _verdict("unresponsive.json")
    assert v.status == "problem" and v.nccl_version == "2.29.1"
    assert v.unresponsive_ranks == [1] and v.dead_ranks == []
    assert v.unresponsive_processes[0]["pid"] == 1524345


def test_json_dead_rank_mapped_to_global_rank_in_every_communicator() -> None:
    v = _verdict("dead.json")
    assert v.dead_ranks == [3]  # world rank 3, and rank 1 of the 2-rank subgroup is the same process
    sub = next(c for c in v.communicators if c["size"] == 2)
    assert sub["missing"][0]["comm_rank"] == 1 and sub["missing"][0]["rank"] == 3
    world = next(c for c in v.communicators if c["size"] == 4)
    assert world["op_counts"]["AllReduce"]["behind"] == [2]
    assert world["op_counts"]["AllReduce"]["by_count"] == {"811": [2], "812": [0, 1]}


def test_addresses_parse_like_nccl_ras_addr() -> None:
    assert parse_addr("localhost:28028") == ("localhost", 28028)
    assert parse_addr("10.0.0.5") == ("10.0.0.5", 28028)
    assert parse_addr("[::1]:29000") == ("::1", 29000)
    for bad in ("", "host:0", "host:x", ":28028"):
        with pytest.raises(ValueError):
            parse_addr(bad)


# ---- the protocol, against the stand-in service --------------------------------------------------------

def test_client_asks_for_json_and_speaks_the_protocol() -> None:
    with RasStandIn.from_files("healthy.txt", "healthy.json") as srv:
        reply = query(srv.addr, deadline_s=5)
    assert reply.format == "json" and reply.server_protocol == 2
    assert json.loads(reply.body)["communicators"][0]["size"] == 2
    assert srv.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 4", "SET FORMAT json", "STATUS"]


def test_client_falls_back_to_text_on_nccl_before_2_28_7() -> None:
    with RasStandIn.from_files("dead.txt") as srv:  # no JSON: answers "ERROR: Unknown command"
        reply = query(srv.addr, deadline_s=5)
    assert reply.format == "text" and reply.body.startswith("NCCL version 2.24.3")


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build_app("ras"), ["ras", *args])
    return result.exit_code, result.output


def test_cli_healthy_job_exits_0() -> None:
    with RasStandIn.from_files("healthy.txt", "healthy.json") as srv:
        code, out = _run("--addr", srv.addr)
    assert code == 0, out
    assert "every rank answered" in out and "NCCL 2.28.9" in out


def test_cli_dead_rank_exits_1_and_json_names_it(tmp_path) -> None:
    path = tmp_path / "ras.json"
    with RasStandIn.from_files("dead.txt", "dead.json") as srv:
        code, out = _run("--addr", srv.addr, "--json", str(path))
    assert code == 1, out
    assert "rank 3 dead" in out and "pid 4103 on 10.0.0.1" in out
    doc = json.loads(path.read_text())
    assert doc["status"] == "problem" and doc["dead_ranks"] == [3]


def test_cli_json_to_stdout_for_unresponsive_rank() -> None:
    with RasStandIn.from_files("unresponsive.txt") as srv:
        code, out = _run("--addr", srv.addr, "--json", "-")
    assert code == 1
    doc = json.loads(out)
    assert doc["unresponsive_ranks"] == [21] and doc["format"] == "text"


def test_cli_service_that_never_answers_costs_only_the_timeout() -> None:
    # A real process with a subprocess timeout far above --timeout: without the deadline it would hang
    # (the stand-in holds the connection open and silent) and TimeoutExpired would fail the test.
    with RasStandIn.from_files("healthy.txt", silent=True) as srv:
        proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "ras", "--addr", srv.addr, "--timeout", "1"],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "did not answer in time (waiting for its protocol handshake)" in proc.stdout


def test_cli_service_hanging_mid_reply_is_cut_at_the_deadline() -> None:
    with RasStandIn.from_files("dead.txt", hang_after=120) as srv:
        code, out = _run("--addr", srv.addr, "--timeout", "1")
    assert code == 1
    assert "after 120 bytes of its reply" in out and "may be hung" in out


def test_cli_nothing_listening_is_one_line_exit_2() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "ras", "--addr", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no NCCL RAS service at 127.0.0.1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_json_rank_whose_process_nccl_does_not_know_is_read_not_refused() -> None:
    """NCCL writes pid -1 and host "unknown" for a rank whose RAS peer it cannot find (client_support.cc
    rasDumpCommsToJSON): that is NCCL's own reply, so the dead rank is still named, not refused as hostile."""
    doc = json.loads((DATA / "dead.json").read_text())
    world = max(doc["communicators"], key=lambda c: c["size"])
    world["missing_ranks"][0].update(pid=-1, host="unknown")
    v = judge(parse_json(json.dumps(doc)), "test")
    assert v.status == "problem" and v.dead_ranks == [world["missing_ranks"][0]["rank"]]


def test_json_document_fields() -> None:
    doc = to_json(_verdict("dead.json"))
    assert set(doc) >= {"addr", "status", "nccl_version", "dead_ranks", "unresponsive_ranks",
                        "dead_processes", "communicators", "elapsed_s", "error"}


# ---- the wrong address: named for what it is, exit 2 (issue 28) ---------------------------------------


def test_a_host_that_does_not_resolve_is_named_as_a_dns_failure_exit_2() -> None:
    """`.invalid` never resolves (RFC 2606): the line must say the name does not resolve, not that no job
    runs "on this host"."""
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "ras", "--addr", "nosuchhost.invalid:1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "'nosuchhost.invalid'" in proc.stderr and "does not resolve" in proc.stderr
    assert "running on" not in proc.stderr and "job" not in proc.stderr


def test_nothing_listening_on_another_host_does_not_say_this_host() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "ras", "--addr", f"127.0.0.2:{port}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "job running on 127.0.0.2" in proc.stderr and "this host" not in proc.stderr


def test_a_service_that_is_not_ras_is_the_wrong_address_exit_2_as_help_says() -> None:
    """A real server answering the handshake as an HTTP server would: not a RAS service, so bad input
    (exit 2, what `ras --help` promises for "what answers is not RAS"), not a finding about the job."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(100)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    import threading

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "ras", "--addr", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60)
    finally:
        server.close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "is not an NCCL RAS service" in proc.stderr
    assert "'HTTP/1.1 400 Bad Request'" in proc.stderr
    help_text = " ".join(CliRunner().invoke(build_app("ras"), ["ras", "--help"]).output.split())
    assert "2: no RAS service at the address (nothing listens, the host does not resolve, or what answers is not " \
           "RAS)" in help_text
