"""The control plane: the c10d TCPStore at MASTER_ADDR:MASTER_PORT, with JSON values and deadlines.

It carries hellos, the plan, progress and every rank's findings to rank 0, independently of the process
group under test (NCCL or gloo may be broken; that is what we diagnose). Under torchrun the launcher's
agent already hosts the store (``TORCHELASTIC_USE_AGENT_STORE``) and every rank is a client; otherwise
rank 0 hosts it. Every wait polls with ``store.check`` so it can end at a deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from ddpdoctor.runtime.launcher import LaunchInfo

POLL_S = 0.02


def connect_store(info: LaunchInfo, timeout_s: float) -> Any:
    """A TCPStore client (or, on rank 0 without a launcher store, the server)."""
    from torch.distributed import TCPStore

    is_server = info.rank == 0 and not info.agent_store
    return TCPStore(
        info.master_addr, info.master_port, world_size=None, is_master=is_server,
        timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
    )


def wait_until_reachable(addr: str, port: int, deadline: float) -> bool:
    """Poll a plain TCP connect until it succeeds or the deadline passes.

    Done before building a TCPStore client, whose own failure prints dozens of C++ frames before the
    one line that matters.
    """
    import socket

    while True:
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


class ControlPlane:
    """JSON key/values on a c10d store, with deadline-bounded waits."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def prefixed(self, prefix: str) -> Any:
        """A raw c10d store whose keys live under ``prefix`` (for checks and the process group)."""
        from torch.distributed import PrefixStore

        return PrefixStore(prefix, self.store)

    def put(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def add(self, key: str, amount: int) -> int:
        return int(self.store.add(key, amount))

    def has(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def get_nowait(self, key: str) -> Any:
        """The value at ``key``, or None when nobody wrote it yet."""
        if not self.has(key):
            return None
        return json.loads(self.store.get(key))

    def wait_get(self, key: str, deadline: float) -> Any:
        """The value at ``key`` once written, or None if the deadline passes first."""
        while True:
            if self.has(key):
                return json.loads(self.store.get(key))
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)

    def wait_keys(self, keys: Iterable[str], deadline: float,
                  on_poll: Callable[[list[str]], None] | None = None) -> set[str]:
        """Wait until every key exists or the deadline passes; returns the keys that exist.

        ``on_poll(keys)`` runs between polls (to show the wait; it may look the keys up one by one).
        """
        wanted = list(keys)
        # One round trip for all keys while waiting; per-key look-ups only to name the absent ones.
        while not self.store.check(wanted):
            if time.monotonic() >= deadline:
                return {key for key in wanted if self.has(key)}
            if on_poll is not None:
                on_poll(wanted)
            time.sleep(POLL_S)
        return set(wanted)

    def absent(self, keys: Iterable[str]) -> list[str]:
        """The keys nobody wrote yet (one look-up each)."""
        return [key for key in keys if not self.has(key)]
