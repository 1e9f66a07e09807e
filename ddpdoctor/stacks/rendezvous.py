"""Which ranks reached a job's rendezvous, read from the job's own c10d store (for a job stuck in
``init_process_group``: "Waiting in store based barrier to initialize process group", or nothing at all).

A job whose ranks never all arrive waits in ``init_process_group`` until its timeout (30 minutes by
default), and every rank that did arrive shows the same stack: the place tells nothing, the absent ranks
are the diagnosis. The job's TCPStore (``MASTER_ADDR:MASTER_PORT``) knows who came:

- gloo: each rank publishes its address under ``<rank>`` in the process group's prefix store before it
  connects the full mesh (``createAndConnectAllPairs`` in gloo/transport/tcp/context.cc); c10d prefixes the
  default group's keys with ``default_pg/<n>/`` and the device's with ``/cpu/`` and its index
  (``PrefixStore`` joins with ``/``), so rank 1 of world 3 sets ``default_pg/0//cpu//0/1`` (seen on torch
  2.13 with 2 of 3 ranks started). Under torchrun's agent store the job's keys carry a further prefix.
- With ``env://`` and no agent store, rank 0 *hosts* the store and waits inside the TCPStore constructor
  for every worker to connect, before it publishes anything: the store answering is rank 0 having arrived.
  The value is gloo's ``Rank::bytes()`` (gloo/transport/tcp/context.cc): a native ``size_t`` length (8
  bytes, little-endian on x86-64 and aarch64), the rank's ``gethostname()``, then its socket address and
  pair ids; so the store also says on which host each gloo rank runs (``vm`` read back on torch 2.13).
- NCCL publishes no key per rank (rank 0 sets the unique id, the others read it): there the store says
  only that it is up.

- PyTorch's debug worker servers (``torch.distributed.debug.start_debug_server``, torch 2.13
  torch/distributed/debug/__init__.py) register each rank's HTTP address in the same store:
  ``store.set(f"rank{RANK}", f"http://{socket.gethostname()}:{port}")`` through
  ``PrefixStore("debug_server", ...)`` (debug/_store.py ``tcpstore_client``), so the key is
  ``debug_server/rank<N>``. :mod:`ddpdoctor.stacks.remote` asks those servers for the stacks of ranks on
  other hosts.

The store is read by a short-lived ``python -c`` with torch (``TCPStore(..., is_master=False,
wait_for_workers=False)``, ``list_keys()``: it never adds a key nor counts as a worker), so ``ddpdoctor
stacks`` itself never imports torch and a store that does not answer costs at most the deadline.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.safejson import UntrustedJSONError, loads_untrusted

PROBE_S = 30.0  # the whole probe, torch's import included (seconds on a busy node)
STORE_S = 5.0  # the store's own answer, once the probe has imported torch
_GLOO_KEY = re.compile(r"(?:^|/)default_pg/\d+//cpu//\d+/(\d+)$")
_DEBUG_KEY = re.compile(r"(?:^|/)debug_server/rank(\d+)$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
_DEBUG_URL = re.compile(r"^https?://[A-Za-z0-9._:\[\]-]{1,300}$")
_MAX_KEYS = 100_000

_PROBE = r"""
import datetime, json, re, sys
import torch.distributed as dist
print("imported", flush=True)
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=float(sys.argv[3])))
keys = store.list_keys() if hasattr(store, "list_keys") else None
debug, hosts = {}, {}
for key in (keys or [])[:100000]:
    if re.search(r"(?:^|/)debug_server/rank\d+$", key):
        debug[key] = store.get(key)[:512].decode("utf-8", "replace")
    elif re.search(r"(?:^|/)default_pg/\d+//cpu//\d+/\d+$", key):
        value = store.get(key)
        size = int.from_bytes(value[:8], "little")
        if 0 < size <= 255 and len(value) >= 8 + size:
            hosts[key] = value[8:8 + size].decode("utf-8", "replace")
print(json.dumps({"keys": keys[:100000] if keys is not None else None, "debug": debug, "hosts": hosts}))
"""


@dataclass
class StoreView:
    """What the job's store says about the rendezvous (``error`` set when it could not be read)."""

    address: str
    reachable: bool = False
    keys_listed: bool = False
    arrived: list[int] = field(default_factory=list)  # ranks whose gloo address is in the store
    error: str | None = None
    # rank -> the HTTP address of its PyTorch debug worker server (``debug_server/rank<N>``), when it runs one
    debug: dict[int, str] = field(default_factory=dict)
    # rank -> its host name, from its gloo address record (gloo jobs only)
    hosts: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"store": self.address, "reachable": self.reachable, "keys_listed": self.keys_listed,
                "published": self.arrived, "error": self.error}


def arrived_ranks(keys: list[str]) -> list[int]:
    """Ranks that published their gloo address in the store (see the module docstring)."""
    found = set()
    for key in keys:
        match = _GLOO_KEY.search(key)
        if match:
            found.add(int(match.group(1)))
    return sorted(found)


def read_store(host: str, port: int, timeout_s: float = PROBE_S, store_s: float = STORE_S) -> StoreView:
    """The store at ``host:port`` as :class:`StoreView`; never raises, never waits past ``timeout_s``.

    The probe is a fresh Python that imports torch (seconds; more on a node whose cores are busy) and then
    gives the store ``store_s`` to answer: a slow import is not reported as a store that does not answer."""
    view = StoreView(f"{host}:{port}")
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, host, str(port), str(store_s)],
                              capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        view.error = (f"no answer within {store_s:g} s" if "imported" in out
                      else f"the probe did not get past importing torch within {timeout_s:g} s")
        return view
    except OSError as exc:
        view.error = f"cannot start the probe: {exc.strerror or exc}"
        return view
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        view.error = (lines[-1] if lines else f"the probe exited with {proc.returncode}")[:200]
        return view
    view.reachable = True
    try:
        doc = loads_untrusted(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}")
    except (UntrustedJSONError, IndexError):
        return view
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if isinstance(keys, list):
        view.keys_listed = True
        view.arrived = arrived_ranks([k for k in keys[:_MAX_KEYS] if isinstance(k, str)])
    found = doc.get("debug") if isinstance(doc, dict) else None
    if isinstance(found, dict):
        view.debug = debug_addresses(found)
    named = doc.get("hosts") if isinstance(doc, dict) else None
    if isinstance(named, dict):
        view.hosts = gloo_hosts(named)
    return view


def gloo_hosts(values: dict[str, object]) -> dict[int, str]:
    """rank -> host name from the probe's reading of the gloo address records; a name with characters no
    host name has (anyone who can reach the store can write it) is left out."""
    found: dict[int, str] = {}
    for key, value in values.items():
        match = _GLOO_KEY.search(key) if isinstance(key, str) else None
        if match and isinstance(value, str) and _HOST_NAME.match(value):
            found[int(match.group(1))] = value
    return dict(sorted(found.items()))


def debug_addresses(values: dict[str, object]) -> dict[int, str]:
    """rank -> debug server address from the store's ``debug_server/rank<N>`` keys; a value that is not an
    http(s)://host:port address (anyone who can reach the store can write it) is left out."""
    found: dict[int, str] = {}
    for key, value in values.items():
        match = _DEBUG_KEY.search(key) if isinstance(key, str) else None
        if match and isinstance(value, str) and _DEBUG_URL.match(value):
            found[int(match.group(1))] = value
    return dict(sorted(found.items()))


def never_arrived(world_size: int, seen: set[int], view: StoreView | None, rank0_hosts: bool) -> list[int]:
    """Ranks below ``world_size`` neither seen (by the caller: running, or connected to watch) nor in the
    store: the ones the others wait for."""
    arrived = set(seen)
    if view is not None and view.reachable:
        arrived |= set(view.arrived)
        if rank0_hosts:
            arrived.add(0)
    return [rank for rank in range(world_size) if rank not in arrived]


def store_text(view: StoreView, rank0_hosts: bool) -> str:
    """One clause for the report: what the store said, or why it said nothing."""
    if not view.reachable:
        return f"the job's store at {view.address} could not be read ({view.error})"
    if not view.keys_listed:
        return f"the job's store at {view.address} answers (this torch cannot list its keys)"
    host = "; rank 0 hosts it" if rank0_hosts else ""
    if not view.arrived:
        return f"the job's store at {view.address} holds no rank's gloo address yet{host}"
    from ddpdoctor.ranks import rank_phrase

    return f"the job's store at {view.address} holds the gloo addresses of {rank_phrase(view.arrived)}{host}"
