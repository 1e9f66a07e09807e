"""`ddpdoctor stacks` on one host of a job that spans two: the other host's ranks are named, and read over
HTTP from PyTorch's debug worker servers when the job runs them (ddpdoctor.stacks.remote).

The hosts are network namespaces with their own hostnames (tests/netns.py), each running a real
``torchrun --nnodes 2 --node-rank i`` of tests/stacks/debug_server_job.py; ``stacks`` runs inside nodea and
sees (by py-spy) only nodea's rank. nodeb's rank registered ``http://nodeb:<port>`` in the job's store, so
nodea resolves nodeb through a hosts file bind-mounted in the stacks command's own mount namespace (as a
cluster's DNS would), never the machine's /etc/hosts.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ddpdoctor.stacks.model import Frame, ProcessStacks, ThreadStack, analyze
from ddpdoctor.stacks.report import render_text, to_json
from tests.netns import NetnsHosts
from tests.support import REPO, clean_env, torchrun_cmd

JOB = REPO / "tests" / "stacks" / "debug_server_job.py"
READY_DEADLINE_S = 180.0


def _line(code: str) -> int:
    """The line of the job's script that holds ``code``."""
    return next(n for n, text in enumerate(JOB.read_text().splitlines(), 1) if code in text)


@dataclass(frozen=True)
class Capture:
    returncode: int
    text: str
    doc: dict  # type: ignore[type-arg]
    store_hosts: object  # rank -> host as read_store found it in the gloo records (or the probe's stderr)


def _wait_ready(procs: list[subprocess.Popen[str]]) -> dict[int, int]:
    """rank -> pid, from each host's "ready <rank> <pid>" line (every wait bounded)."""
    found: dict[int, int] = {}
    seen = ""
    deadline = time.monotonic() + READY_DEADLINE_S
    with selectors.DefaultSelector() as sel:
        for proc in procs:
            assert proc.stdout is not None
            sel.register(proc.stdout, selectors.EVENT_READ)
        while len(found) < len(procs):
            left = deadline - time.monotonic()
            assert left > 0, f"the job never got ready: {seen}"
            for key, _ in sel.select(timeout=min(left, 1.0)):
                line = key.fileobj.readline()  # type: ignore[union-attr]
                seen += line
                if line.startswith("ready "):
                    _, rank, pid = line.split()
                    found[int(rank)] = int(pid)
            for proc in procs:
                assert proc.poll() is None, f"a host's torchrun exited ({proc.returncode}): {seen}"
    return found


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    tmp = tmp_path_factory.mktemp("other_hosts")
    hosts_file = tmp / "hosts"
    with NetnsHosts(2) as hosts:
        hosts_file.write_text(f"127.0.0.1 localhost\n{hosts.ip(0)} nodea\n{hosts.ip(1)} nodeb\n")
        procs = []
        try:
            for index, name in enumerate(("nodea", "nodeb")):
                argv = [*torchrun_cmd(), "--nnodes", "2", "--node-rank", str(index), "--nproc-per-node", "1",
                        "--master-addr", hosts.ip(0), "--master-port", "29500", str(JOB)]
                procs.append(subprocess.Popen(
                    hosts.command(index, name, argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                    env=clean_env({"GLOO_SOCKET_IFNAME": hosts.ifname(index), "HANG_S": "150"}), cwd=REPO,
                    start_new_session=True))
            pids = _wait_ready(procs)
            out = tmp / "nodea.json"
            stacks = [sys.executable, "-m", "ddpdoctor", "stacks", "--pid", str(pids[0]), "--json", str(out)]
            mount = ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts_file)]
            done = subprocess.run(hosts.command(0, "nodea", [*mount, *stacks]), capture_output=True, text=True,
                                  timeout=180, env=clean_env(), cwd=REPO)
            doc = json.loads(out.read_text()) if out.exists() else {}
            # What the store says of each gloo rank's host (its gloo address record), read from nodea.
            probe = ("import json; from ddpdoctor.stacks.rendezvous import read_store; "
                     f"print(json.dumps(read_store({hosts.ip(0)!r}, 29500).hosts))")
            said = subprocess.run(hosts.command(0, "nodea", [sys.executable, "-c", probe]), capture_output=True,
                                  text=True, timeout=120, env=clean_env(), cwd=REPO)
            store_hosts = json.loads(said.stdout.strip().splitlines()[-1]) if said.returncode == 0 else said.stderr
            yield Capture(done.returncode, done.stdout + done.stderr, doc, store_hosts)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.requires_netns
def test_the_other_hosts_rank_is_read_over_http_and_named_by_host(capture: Capture) -> None:
    assert capture.returncode == 1, capture.text  # rank 0 is elsewhere: the ranks disagree
    assert "hosts: nodea: rank 0; nodeb: rank 1" in capture.text, capture.text
    assert "rank 1 on other hosts (nodeb: rank 1): stacks read over HTTP from PyTorch's debug servers" in capture.text
    sleep, barrier = _line("time.sleep("), _line("dist.barrier()")
    assert (f"rank 0 is at debug_server_job.py:{sleep} in evaluate() (not in a torch.distributed call); "
            f"rank 1 is in barrier() at debug_server_job.py:{barrier}") in capture.text
    assert "rank 1@nodeb (debug server)" in capture.text
    assert capture.doc["hosts"] == {"nodea": [0], "nodeb": [1]}
    [remote] = [p for p in capture.doc["processes"] if p["rank"] == 1]
    assert remote["host"] == "nodeb" and remote["debug_server"].startswith("http://nodeb:")
    [main] = [t for t in remote["threads"] if t["main"]]
    assert [f["function"] for f in main["frames"]][:1] == ["barrier"]
    job = capture.doc["jobs"][0]
    assert job["other_hosts"]["fetched"] == [1] and job["elsewhere"] == []


@pytest.mark.slow
@pytest.mark.requires_netns
def test_the_jobs_store_says_where_each_gloo_rank_runs(capture: Capture) -> None:
    # gloo's Rank record (gloo/transport/tcp/context.cc) starts with the rank's gethostname().
    assert capture.store_hosts == {"0": "nodea", "1": "nodeb"}


@pytest.mark.slow
@pytest.mark.requires_netns
def test_every_ranks_flight_recorder_is_read_over_http(capture: Capture) -> None:
    fr = capture.doc["jobs"][0]["other_hosts"]["flight_recorder"]
    assert fr["fetched_ranks"] == [0, 1], fr
    # One all_reduce on each rank, then rank 1's barrier: Flight Recorder sees rank 0 never issue it.
    assert "Flight Recorder of ranks 0-1 (over HTTP): FAIL: rank 0 never issued collective #2" in capture.text, (
        capture.text)


SITE = "/venv/lib/python3.11/site-packages"
BARRIER = [Frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 5356),
           Frame("main", "/job/train.py", 92)]


def test_without_debug_servers_the_commands_for_the_other_hosts_are_printed() -> None:
    here = [ProcessStacks(pid=100 + r, host="nodea", rank=r, world_size=4, local_world_size=2, job="slurm:77.0",
                          threads=[ThreadStack(1, "MainThread", True, BARRIER)]) for r in (0, 1)]
    [report] = analyze(here)
    assert report.elsewhere == [2, 3] and report.missing_ranks == []
    report.other_hosts = {"here": ["nodea"], "why_not": "the job runs no PyTorch debug servers",
                          "hosts": {"nodeb": [2, 3]}}  # as the store's gloo records say (test above)
    text = render_text([report])
    assert ("ranks 2-3 run on other hosts (nodeb: ranks 2-3, from the job's store), not read from here (the job "
            "runs no PyTorch debug servers)") in text
    assert 'ddpdoctor stacks --job slurm:77.0 --json "$(hostname).json"' in text
    assert "ddpdoctor stacks merge nodea.json OTHER-HOST.json ..." in text
    job = to_json(here, [report], "py-spy")["jobs"][0]
    assert job["elsewhere"] == [2, 3] and job["other_hosts"]["commands"][0].startswith("ddpdoctor stacks --job")
