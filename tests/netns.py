"""Test "hosts" on one machine: network namespaces joined by veth links, each with its own hostname.

Follows the recipe in design.md. Only addresses inside namespaces created here are used; everything is
torn down in ``close()``. Needs root and iproute2 (tests using it are marked ``requires_netns``).

With ``whole_hosts=True`` each host is a network, UTS, PID and mount namespace of its own, held by one
init process (``unshare --uts --pid --fork --mount-proc``): every command of that host runs inside it
(``nsenter``), so its processes cannot see the other host's, and :meth:`NetnsHosts.kill_host` ends the host
whole (SIGKILL to its init: the kernel then SIGKILLs every process of the namespace, as a power cut or a
kernel panic ends every process of a node at once). The faults the watch lab needs: :meth:`link_down`,
:meth:`block_port` (nftables inside the host), :meth:`rate_limit` (tc).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.debian import NFTABLES, ensure_packages

# How many times closing a host lists and kills what runs in its namespace (see NetnsHosts.close).
NAMESPACE_KILL_ROUNDS = 20


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


@dataclass
class NetnsHosts:
    """N namespaces on one bridge-less star: host 0 is linked to every other host by its own veth pair."""

    count: int
    subnet: str = "10.77"
    tag: str = field(default_factory=lambda: f"dd{os.getpid() % 10000}")
    names: list[str] = field(default_factory=list)
    whole_hosts: bool = False  # each host its own PID + mount namespace too (see the module docstring)
    inits: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def ip(self, index: int) -> str:
        return f"{self.subnet}.0.{index + 1}"

    def __enter__(self) -> NetnsHosts:
        try:
            for index in range(self.count):
                name = f"{self.tag}n{index}"
                sh("ip", "netns", "add", name)
                self.names.append(name)
                sh("ip", "-n", name, "link", "set", "lo", "up")
            hub = self.names[0]
            sh("ip", "netns", "exec", hub, "ip", "link", "add", "dd0", "type", "bridge")
            sh("ip", "-n", hub, "addr", "add", f"{self.ip(0)}/24", "dev", "dd0")
            sh("ip", "-n", hub, "link", "set", "dd0", "up")
            for index in range(1, self.count):
                # Same interface name (dd0) on every spoke host, so GLOO_SOCKET_IFNAME agrees across ranks.
                outside, inside = f"{self.tag}h{index}", f"{self.tag}s{index}"
                sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
                sh("ip", "link", "set", outside, "netns", hub)
                sh("ip", "link", "set", inside, "netns", self.names[index])
                sh("ip", "-n", hub, "link", "set", outside, "master", "dd0")
                sh("ip", "-n", hub, "link", "set", outside, "up")
                sh("ip", "-n", self.names[index], "link", "set", inside, "name", "dd0")
                sh("ip", "-n", self.names[index], "addr", "add", f"{self.ip(index)}/24", "dev", "dd0")
                sh("ip", "-n", self.names[index], "link", "set", "dd0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def ifname(self, index: int) -> str:
        """Every host's link is called dd0 (a bridge on host 0, a veth end elsewhere)."""
        return "dd0"

    def rate_limit(self, index: int, rate: str) -> None:
        """Slow host ``index``'s link down (token bucket on its side of the veth)."""
        sh("tc", "-n", self.names[index], "qdisc", "add", "dev", self.ifname(index), "root", "tbf", "rate", rate,
           "burst", "64kb", "latency", "50ms")

    def command(self, index: int, hostname: str, argv: Sequence[str]) -> list[str]:
        """argv run inside host ``index`` with its own hostname (a UTS namespace of its own; with
        ``whole_hosts``, inside the host's PID and mount namespaces too, started on first use)."""
        if self.whole_hosts:
            init = self._init_pid(index, hostname)
            return ["nsenter", "--target", str(init), "--net", "--uts", "--pid", "--mount", "--", *argv]
        script = 'hostname "$0"; exec "$@"'
        return ["ip", "netns", "exec", self.names[index], "unshare", "--uts", "sh", "-c", script, hostname, *argv]

    def _init_pid(self, index: int, hostname: str) -> int:
        """The host's init (PID 1 of its namespace), as a PID outside it; started on first use."""
        if index not in self.inits:
            script = 'hostname "$0"; exec sleep 100000'
            self.inits[index] = subprocess.Popen(
                ["ip", "netns", "exec", self.names[index], "unshare", "--uts", "--pid", "--fork", "--mount-proc",
                 "sh", "-c", script, hostname], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
        unshare = self.inits[index].pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            # unshare --fork waits for its child, which is the namespace's PID 1 (sh, then sleep).
            try:
                with open(f"/proc/{unshare}/task/{unshare}/children") as handle:
                    children = handle.read().split()
            except OSError:
                children = []
            if children:
                child = int(children[0])
                try:
                    with open(f"/proc/{child}/comm") as handle:
                        if handle.read().strip() == "sleep":  # its hostname is set
                            return child
                except OSError:
                    pass
            time.sleep(0.02)
        raise RuntimeError(f"host {index}'s namespace init did not start")

    def kill_host(self, index: int) -> None:
        """Every process of host ``index`` SIGKILLed at once (its init, then the kernel does the rest)."""
        proc = self.inits.get(index)
        if proc is None or proc.poll() is not None:
            return
        os.kill(self._init_pid(index, ""), signal.SIGKILL)
        proc.wait(timeout=30)

    def link_down(self, index: int) -> None:
        """Host ``index``'s link goes down (its processes live on; no packet leaves or arrives)."""
        sh("ip", "-n", self.names[index], "link", "set", self.ifname(index), "down")

    def block_port(self, index: int, port: int) -> None:
        """Host ``index`` drops every TCP packet to or from ``port`` on its links to other hosts (nftables in its
        namespace; as a firewall rule between nodes does: the host's own loopback traffic, e.g. rank 0 reaching
        the store on its own host, still passes). Needs the ``nft`` command (Debian's nftables)."""
        why = ensure_packages(NFTABLES)
        if why:
            raise RuntimeError(f"nft (Debian's nftables): {why}")
        rules = (f"add table inet ddlab\n"
                 f"add chain inet ddlab input {{ type filter hook input priority 0; }}\n"
                 f"add chain inet ddlab output {{ type filter hook output priority 0; }}\n"
                 f"add rule inet ddlab input iifname != \"lo\" tcp dport {port} drop\n"
                 f"add rule inet ddlab input iifname != \"lo\" tcp sport {port} drop\n"
                 f"add rule inet ddlab output oifname != \"lo\" tcp dport {port} drop\n"
                 f"add rule inet ddlab output oifname != \"lo\" tcp sport {port} drop\n")
        subprocess.run(["ip", "netns", "exec", self.names[index], "nft", "-f", "-"], input=rules.encode(),
                       check=True, capture_output=True, timeout=30)

    def close(self) -> None:
        for proc in self.inits.values():
            if proc.poll() is None:
                try:
                    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as handle:
                        children = [int(c) for c in handle.read().split()]
                except OSError:
                    children = []
                for child in children:
                    with contextlib.suppress(OSError):
                        os.kill(child, signal.SIGKILL)
                proc.kill()
                proc.wait(timeout=30)
        self.inits.clear()
        for name in self.names:
            # Whatever still runs in the host's network namespace (a launcher's workers in sessions of their own,
            # which a killpg of the launcher misses) would keep the namespace alive and outlive the test. Listed
            # and killed until none is left: a process forking as it is killed (setsid, a launcher starting a
            # worker) puts a new pid there after the listing.
            for _ in range(NAMESPACE_KILL_ROUNDS):
                pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                                      timeout=30).stdout.split()
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.05)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self.names.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()


def torchrun_on_hosts(hosts: NetnsHosts, names: Sequence[str], port: int, ddpdoctor_argv: Sequence[str],
                      deadline_s: float = 240) -> list[tuple[int, str, str]]:
    """``torchrun --nnodes N --node-rank i ... -m ddpdoctor ARGV`` on every host (one rank each, host 0 the master,
    gloo over each host's link): the (exit code, stdout, stderr) of each; every process group killed past the
    deadline (its exit code then says so)."""
    from tests.support import clean_env, torchrun_cmd

    procs: list[subprocess.Popen[str]] = []
    try:
        for i, name in enumerate(names):
            argv = [*torchrun_cmd(), "--nnodes", str(len(names)), "--node-rank", str(i), "--nproc-per-node", "1",
                    "--master-addr", hosts.ip(0), "--master-port", str(port), "-m", "ddpdoctor", *ddpdoctor_argv]
            procs.append(subprocess.Popen(hosts.command(i, name, argv), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True,
                                          env=clean_env({"GLOO_SOCKET_IFNAME": hosts.ifname(i)})))
        deadline = time.monotonic() + deadline_s
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
        return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
