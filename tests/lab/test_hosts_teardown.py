"""The lab's hosts leave nothing behind: a process a test started on a host in a session of its own (as torchrun
starts its workers, which a killpg of the launcher misses) is gone when the hosts are closed."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.netns import NetnsHosts


@pytest.mark.requires_netns
def test_closing_the_hosts_kills_what_still_runs_in_them() -> None:
    with NetnsHosts(1) as hosts:
        orphan = subprocess.Popen(hosts.command(0, "nodea", ["setsid", "sleep", "300"]), start_new_session=True)
        # The sleep itself, not the `ip netns exec`/`sh` that start it: those are there first, and a test that took
        # them for the sleep passed while the sleep, forked a moment later, outlived it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _sleeping(hosts.names[0]):
            time.sleep(0.05)
        inside = _sleeping(hosts.names[0])
        assert inside, "the sleep did not start inside the host"
    # setsid forked the sleep off: it is no child of ours, only the host's namespace knows it.
    gone = time.monotonic() + 10
    while time.monotonic() < gone and any(_alive(int(pid)) for pid in inside):
        time.sleep(0.05)
    assert not [pid for pid in inside if _alive(int(pid))], "a process of the closed host still runs"
    orphan.wait(timeout=10)


def _sleeping(namespace: str) -> list[str]:
    """The pids of `sleep` processes in the network namespace."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30).stdout.split()
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as handle:
                if handle.read().strip() == "sleep":
                    found.append(pid)
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False
