"""One list of a host's interfaces wherever a report shows one (issue 35).

An H200 host's `check` with NCCL_SOCKET_IFNAME=ib0 said "(have: eth0, lo)" in the env finding and
"(interfaces: eth0, ifb0, ifb1, lo)" in the gpu finding folded under it. Both now come from
``env.facts.usable_interfaces``: up, with an IPv4/IPv6 address (the only ones NCCL's and gloo's socket
code can pick). This development host has the same ``ifb0``/``ifb1`` (down, no address) as that one.
"""

from __future__ import annotations

import os
import re

from ddpdoctor.checks import gpu as gpu_check
from ddpdoctor.env import facts as envinfo
from ddpdoctor.env import gpu_facts


def test_only_interfaces_that_are_up_with_an_address_are_listed() -> None:
    addresses = {"eth0": ["10.0.0.2"], "lo": ["127.0.0.1", "::1"], "ifb0": [], "ifb1": [],
                 "eth1": ["10.1.0.2"], "bond0-slave": []}
    up = {"eth0": True, "lo": True, "ifb0": False, "ifb1": False, "eth1": False, "bond0-slave": True}
    assert envinfo.select_usable(addresses, up) == ["eth0", "lo"]
    assert envinfo.select_usable({"eth9": ["10.9.0.1"]}, {}) == []  # no state known: not offered


def test_the_env_finding_and_the_gpu_preflight_name_the_same_interfaces_here() -> None:
    names = envinfo.usable_interfaces()
    on_sys = set(os.listdir("/sys/class/net"))
    assert set(names) <= on_sys and "lo" in names
    # This host's addressless traffic-shaping devices are real and in sysfs, but no choice for NCCL.
    assert not {n for n in on_sys if n.startswith("ifb")} & set(names)
    env_text = envinfo.nccl_ifname_problem("ddpdoctor_no_such_if", names)
    pre = gpu_facts.gather_preflight(None, {"NCCL_SOCKET_IFNAME": "ddpdoctor_no_such_if"}, deadline_s=1.0)
    [gpu_text] = [p[1] for p in gpu_check.preflight_problems(pre) if p[3] == "nccl_socket_ifname"]
    have = re.search(r"\(have: ([^)]*)\)", env_text or "")
    listed = re.search(r"\(interfaces: ([^)]*)\)", gpu_text)
    assert have and listed and have.group(1) == listed.group(1) == ", ".join(names), (env_text, gpu_text)
