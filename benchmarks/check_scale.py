"""The control plane of `ddpdoctor check` at 1,024 and 4,096 simulated ranks (no torch in the ranks).

Rank 0 is the real RankRun (rendezvous, collection with its deadline, naming of the ranks that never
reported, the real combine functions, the table); the other ranks are simulated by a few threads speaking
the same store protocol (ddpdoctor.check.simulate). Three ranks misbehave: one never starts (dead), one
joins after the rendezvous deadline (late), one joins and goes silent in the connectivity check.
Prints, per n: rank 0's rendezvous and collection time, its own work in the collection (without the wait
for the silent rank's deadline), the render time, peak memory of collection + render (tracemalloc, in a
second run so that tracing does not distort the times), the plan's and the report's size, and the
report's lines and width.

    python benchmarks/check_scale.py [--ranks 1024 4096] [--timeout 2] [--tcpstore]

With --tcpstore the store is a real c10d TCPStore (server in this process, one client per worker
thread), as in a real run; without it, an in-process store.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from ddpdoctor.check.simulate import simulate
from ddpdoctor.checks import barrier, connectivity


class _PerThreadTCPStore:
    """A TCPStore client per thread (c10d clients are not meant to be shared between threads)."""

    def __init__(self, port: int) -> None:
        import threading

        self.port, self.local = port, threading.local()

    def _client(self) -> Any:
        from datetime import timedelta

        from torch.distributed import TCPStore

        if not hasattr(self.local, "store"):
            self.local.store = TCPStore("127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=30))
        return self.local.store

    def set(self, key: str, value: str | bytes) -> None:
        self._client().set(key, value)

    def get(self, key: str) -> bytes:
        return bytes(self._client().get(key))

    def add(self, key: str, amount: int) -> int:
        return int(self._client().add(key, amount))

    def check(self, keys: list[str]) -> bool:
        return bool(self._client().check(keys))


def tcp_store() -> tuple[Any, Any]:
    from datetime import timedelta

    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    return server, _PerThreadTCPStore(server.port)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--tcpstore", action="store_true")
    parser.add_argument("--show", action="store_true", help="print the report of the largest run")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"# {os.cpu_count()} CPUs, load average {load[0]:.2f}; store: "
          f"{'c10d TCPStore' if args.tcpstore else 'in-process'}; --timeout {args.timeout:g} s")
    checks = [barrier.CHECK, connectivity.CHECK]
    text = ""
    for n in args.ranks:
        bad = {5: "dead", n - 3: "late", n // 2: "silent"}
        results = []
        for memory in (False, True):
            server = store = None
            if args.tcpstore:
                server, store = tcp_store()
            start = time.monotonic()
            results.append(simulate(n, checks, bad, timeout_s=args.timeout, store=store, measure_memory=memory))
            results[-1].notes.append(f"wall {time.monotonic() - start:.2f} s")
            del server
        timed, traced = results
        if timed.notes[:-1] or traced.notes[:-1]:
            print(f"{n} ranks: simulation errors: {timed.notes + traced.notes}")
        print(f"{n} ranks ({', '.join(f'{r} {b}' for r, b in sorted(bad.items()))}): "
              f"rendezvous {timed.rendezvous_s:.2f} s (deadline {args.timeout:g} s + settle), "
              f"collection {timed.collect_s:.2f} s of which rank 0's own work {timed.merge_s:.2f} s, "
              f"render {timed.render_s * 1000:.0f} ms, peak memory {traced.peak_mib:.1f} MiB, "
              f"plan {timed.plan_bytes / 1024:.0f} KiB, report JSON {timed.json_bytes / 1024:.0f} KiB, "
              f"report {timed.lines} lines x {timed.width} columns, status {timed.report.status}; "
              f"{timed.notes[-1]}")
        text = timed.text
    if args.show:
        print(text)


if __name__ == "__main__":
    main()
