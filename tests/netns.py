"""Test "hosts" on one machine: network namespaces joined by veth links, each with its own hostname.

Follows the recipe in design.md. Only addresses inside namespaces created here are used; everything is
torn down in ``close()``. Needs root and iproute2 (tests using it are marked ``requires_netns``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


@dataclass
class NetnsHosts:
    """N namespaces on one bridge-less star: host 0 is linked to every other host by its own veth pair."""

    count: int
    subnet: str = "10.77"
    tag: str = field(default_factory=lambda: f"dd{os.getpid() % 10000}")
    names: list[str] = field(default_factory=list)

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
        """argv run inside host ``index`` with its own hostname (a UTS namespace of its own)."""
        script = 'hostname "$0"; exec "$@"'
        return ["ip", "netns", "exec", self.names[index], "unshare", "--uts", "sh", "-c", script, hostname, *argv]

    def close(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self.names.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()
