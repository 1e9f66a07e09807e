"""What the log's own numbers and addresses say, as details of the diagnosis they sharpen (issue 33, item 5).

A diagnosis names the failure; the values in its lines often name the cause too, if read:

* **a loopback connect address**: gloo's ``connect [127.0.1.1]:PORT: Connection refused``, c10d's ``... trying
  to connect to (127.0.1.1, 29500)``. Debian and Ubuntu map the machine's hostname to 127.0.1.1 in
  /etc/hosts; gloo and c10d advertise the address the hostname resolves to, so a peer on another host is told
  to connect to itself (gloo's transport/tcp device picks the hostname's address unless GLOO_SOCKET_IFNAME
  names an interface);
* **the timeout of a store-based barrier or of a collective**: ``timeout=0:00:30`` in torch's "Timed out
  initializing process group in store based barrier" message (distributed_c10d.py: the timeout passed to
  init_process_group; default_pg_timeout is 30 minutes), ``Timeout(ms)=60000`` in the NCCL watchdog's (the
  NCCL default is 10 minutes, default_pg_nccl_timeout): a value below the default was set by the job, and a
  rank that is merely slow (loading or tokenising data, compiling) is then reported as missing.

Each hint quotes the line it came from. Pure functions of the diagnoses (no pass over the input).
"""

from __future__ import annotations

import re

from ddpdoctor.explain.model import Diagnosis

# Diagnoses whose details name the address a rank tried to reach.
ADDRESS_DETAILS = {"gloo-connect-failed": ("peer",), "remote-process-exited": ("peer",),
                   "master-connect-timeout": ("host",), "connect-no-route": ("host", "address", "peer"),
                   "nccl-connect-failed": ("address", "peer", "host"), "hostname-resolution": ("address",)}
_LOOPBACK = re.compile(r"^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$")
# torch.distributed's defaults (distributed_c10d.py / constants.py): default_pg_timeout 30 min, and for NCCL
# default_pg_nccl_timeout 10 min (torch >= 2.2).
DEFAULT_PG_TIMEOUT_S = 1800
DEFAULT_NCCL_TIMEOUT_S = 600
# str(datetime.timedelta): "0:00:30", "0:00:30.500000", "1 day, 0:00:00".
_TIMEDELTA = re.compile(r"^(?:(?P<days>\d{1,6}) days?, )?(?P<h>\d{1,2}):(?P<m>\d\d):(?P<s>\d\d)(?:\.\d{1,6})?$")


def timedelta_seconds(text: str) -> float | None:
    """Seconds of a ``str(timedelta)`` value, or None."""
    m = _TIMEDELTA.match(text.strip())
    if m is None:
        return None
    return (int(m.group("days") or 0) * 86400 + int(m.group("h")) * 3600 + int(m.group("m")) * 60
            + int(m.group("s")))


def _line_with(d: Diagnosis, value: str) -> str | None:
    return next((e.text for e in d.evidence if value in e.text), None)


def _loopback(d: Diagnosis) -> list[str]:
    out = []
    for name in ADDRESS_DETAILS.get(d.id, ()):
        for value in d.details.get(name, ()):
            line = _line_with(d, value)
            if _LOOPBACK.match(value) and line is not None:
                out.append(
                    f"The address {value} in \"{line}\" is a loopback address: this host's name resolves to it "
                    "(Debian and Ubuntu map the hostname to 127.0.1.1 in /etc/hosts), so a rank on another host "
                    "is told to connect to itself. If the job spans hosts, set GLOO_SOCKET_IFNAME (gloo) or "
                    "NCCL_SOCKET_IFNAME (NCCL) to the interface of the network between them, or make the "
                    "hostname resolve to that interface's address in /etc/hosts; check with `ddpdoctor env`.")
    return out


def _short_timeout(d: Diagnosis) -> list[str]:
    if d.id == "rendezvous-incomplete":
        values, default, what = d.details.get("timeout", ()), DEFAULT_PG_TIMEOUT_S, "the 30-minute default"
        seconds = [timedelta_seconds(v) for v in values]
    elif d.id == "nccl-timeout":
        values, default, what = d.details.get("timeout_ms", ()), DEFAULT_NCCL_TIMEOUT_S, "NCCL's 10-minute default"
        seconds = [int(v) / 1000 for v in values if v.isdigit()]
    else:
        return []
    out = []
    for value, secs in zip(values, seconds, strict=False):
        line = _line_with(d, value)
        if secs is None or secs >= default or line is None:
            continue
        out.append(f"The timeout in \"{line}\" is {value} ({secs:g} s), shorter than {what}: the job set it "
                   "(init_process_group's timeout=, or a launcher or framework option). A rank that is only slow "
                   "to get there (loading or tokenising data, compiling, an evaluation on one rank) is then "
                   "reported as missing; raise the timeout or make that work happen on every rank or before it.")
    return out


def add_hints(diagnoses: list[Diagnosis]) -> None:
    """Attach what each diagnosis's own values say (see the module docstring) to its ``hints``."""
    for d in diagnoses:
        for hint in (*_loopback(d), *_short_timeout(d)):
            if hint not in d.hints:
                d.hints.append(hint)
