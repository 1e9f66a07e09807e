"""A job stuck before its first collective: 2 of 3 ranks started, the third never does (issue 25).

Every rank that arrived waits in ``init_process_group`` with the same stack; the diagnosis is the rank that
is absent. Real processes: the two ranks are started by hand with a launcher's environment (RANK,
WORLD_SIZE=3, MASTER_ADDR, MASTER_PORT: how srun or a hand-written launcher starts them), and
``watch`` (rank 0 supervising) and ``stacks`` (attaching with py-spy) must both name rank 2, with what the
job's own c10d store says (rank 1's gloo address is in it; rank 0 hosts it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpdoctor.stacks.rendezvous import arrived_ranks, read_store, store_text
from tests.support import clean_env, communicate_all, free_port, run_cli
from tests.watch.test_watch import leftovers

RDV = """\
import torch.distributed as dist

dist.init_process_group("gloo")  # ranks 0 and 1 wait here for rank 2, which never starts
dist.barrier()
"""


def _rank_env(rank: int, port: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    return clean_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **(extra or {})})


def test_a_store_nobody_serves_is_told_apart_from_a_probe_that_never_imported_torch() -> None:
    """Nothing listens on the port: the store's own error. A probe given no time: it never got past importing
    torch, which says nothing about the store (seen on a loaded node as "no answer within 10 s")."""
    port = free_port()
    view = read_store("127.0.0.1", port, store_s=1.0)
    assert not view.reachable and view.error and "importing torch" not in view.error, view
    assert "could not be read" in store_text(view, rank0_hosts=True)
    view = read_store("127.0.0.1", port, timeout_s=0.05)
    assert not view.reachable and view.error == "the probe did not get past importing torch within 0.05 s", view


def test_the_gloo_keys_of_the_store_name_the_ranks_that_published_their_address() -> None:
    """The key layout seen on torch 2.13 (default group, CPU device 0), under torchrun's agent prefix too."""
    keys = ["default_pg/0//cpu//0/1", "/worker/attempt_0/default_pg/0//cpu//0/4", "default_pg/0//cpu//0/x",
            "store_based_barrier_key:1", "default_pg/0//cuda//0/3"]
    assert arrived_ranks(keys) == [1, 4]


@pytest.mark.slow
def test_watch_names_the_rank_that_never_arrived(tmp_path: Path) -> None:
    (tmp_path / "rdv.py").write_text(RDV)
    port = free_port()
    procs = []
    # Rank 1 runs through the installed console script (bin/ddpdoctor: `sys.exit(entry())`), as a launcher
    # given `ddpdoctor watch` runs it; rank 0 as `python -m ddpdoctor`.
    script = Path(sys.executable).parent / "ddpdoctor"
    for rank in (0, 1):
        options = ["--json", str(tmp_path / "watch.json"), "--evidence", str(tmp_path / "evidence")] if rank == 0 else []
        command = [sys.executable, "-m", "ddpdoctor"] if rank == 0 or not script.exists() else [str(script)]
        procs.append(subprocess.Popen([*command, "watch", "--hang-timeout", "8", *options,
                                       "rdv.py"], cwd=tmp_path, env=_rank_env(rank, port), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    (code0, _out0, err0), (code1, _out1, _err1) = communicate_all(procs, timeout=240)
    assert code0 == 1 and code1 == 1, err0[-3000:]
    data = json.loads((tmp_path / "watch.json").read_text())
    assert data["status"] == "hang"
    rendezvous = data["rendezvous"]
    assert (rendezvous["waiting"], rendezvous["never_arrived"]) == ([0, 1], [2])
    # The store is read once, at the verdict: rank 1 is inside init_process_group by then, but on a loaded
    # machine it may not have published its gloo address yet (the stacks test below waits for it).
    published = rendezvous["store"]["published"]
    assert rendezvous["store"]["store"] == f"127.0.0.1:{port}" and published in ([1], []), rendezvous
    assert "HANG in the rendezvous: rank 2 never arrived; ranks 0-1 wait for it in init_process_group" in err0
    holds = "the gloo addresses of rank 1" if published else "no rank's gloo address yet"
    assert f"the job's store at 127.0.0.1:{port} holds {holds}" in err0, err0[-3000:]
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert ranks[2]["wait"]["kind"] == "not_started"
    assert [ranks[r]["wait"]["kind"] for r in (0, 1)] == ["rendezvous", "rendezvous"]
    assert ranks[0]["wait"]["site"] == "rdv.py:3"
    # Only the user's frames: not those of our own command line (typer, click, the console script) that runs
    # the script here.
    for rank in (0, 1):
        assert ranks[rank]["stack"] and all(line.startswith("rdv.py:") for line in ranks[rank]["stack"]), ranks[rank]
    assert leftovers("rdv.py") == []


@pytest.mark.slow
def test_stacks_names_the_rank_that_never_arrived(tmp_path: Path) -> None:
    (tmp_path / "rdv.py").write_text(RDV)
    port = free_port()
    # As torchrun's workers (TORCHELASTIC_RUN_ID makes them ranks to `stacks`), but with rank 0 hosting the store.
    procs = [subprocess.Popen([sys.executable, "rdv.py"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=_rank_env(rank, port, {"TORCHELASTIC_RUN_ID": f"rdv{port}"}))
             for rank in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            proc = run_cli(["stacks", "--job", f"rdv{port}", "--json", "-"], timeout=120)
            doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
            job = (doc.get("jobs") or [{}])[0]
            rendezvous = job.get("rendezvous") or {}
            if rendezvous.get("waiting") == [0, 1] and (rendezvous.get("store") or {}).get("published") == [1]:
                break
            time.sleep(1)  # the ranks are still importing torch, or rank 1 has not published its address
        assert proc.returncode == 1, proc.stderr
        assert job["rendezvous"]["never_arrived"] == [2], job
        assert job["rendezvous"]["store"]["published"] == [1]
        text = run_cli(["stacks", "--job", f"rdv{port}"], timeout=120)
        assert ("rendezvous: rank 2 never arrived; ranks 0-1 wait for it in init_process_group (the job's store at "
                f"127.0.0.1:{port} holds the gloo addresses of rank 1; rank 0 hosts it)") in text.stdout, text.stdout
    finally:
        for rank_proc in procs:
            rank_proc.kill()
            rank_proc.wait(timeout=30)


def test_a_rank_waiting_for_rank_0s_watch_says_so_and_then_runs_unwatched(monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 0's watch refused to start on its host (an explorer's lab run: a bad --evidence there): the other
    host's ranks waited for its channel port in torchrun's store for the whole 120 s without a word. A real
    store that never gets the key, with the waits shortened."""
    from datetime import timedelta

    import torch.distributed as dist

    from ddpdoctor.runtime.launcher import LaunchInfo
    from ddpdoctor.watch import supervisor

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    info = LaunchInfo(launcher="torchrun", rank=2, world_size=4, local_rank=0, local_world_size=2,
                      master_addr="127.0.0.1", master_port=port, agent_store=True, run_id="wait-test")
    monkeypatch.setattr(supervisor, "STORE_WAIT_S", 1.6)
    monkeypatch.setattr(supervisor, "WAIT_SHOWN_AFTER_S", 0.3)
    monkeypatch.setattr(supervisor, "WAIT_LOG_EVERY_S", 0.5)
    assert supervisor._published_channel_port(info) is None
    err = capsys.readouterr().err
    assert (f"ddpdoctor: rank 2: waiting for rank 0's watch to publish its channel in torchrun's store at "
            f"127.0.0.1:{port} (if rank 0's watch did not start, its host's output says why): ") in err, err
    assert err.rstrip().endswith("no watch channel port in torchrun's store (rank 0 did not publish it within "
                                 "1.6 s); this rank runs unwatched"), err
    # Published in time: nothing shown.
    server.set("ddpdoctor/watch/wait-test/channel_port", "4321")
    assert supervisor._published_channel_port(info) == 4321
    assert capsys.readouterr().err == ""
