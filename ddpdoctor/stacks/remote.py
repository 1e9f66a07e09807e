"""Stacks and Flight Recorder entries of ranks on other hosts, from PyTorch's debug worker servers.

A job that calls ``torch.distributed.debug.start_debug_server()`` (torch 2.13,
torch/distributed/debug/__init__.py) runs an HTTP server in every rank (``_WorkerServer("::", port)``) and
registers it in the job's c10d store as ``debug_server/rank<N>`` = ``http://<hostname>:<port>``
(:mod:`ddpdoctor.stacks.rendezvous` reads them). PyTorch's own frontend asks each worker with an HTTP POST to
``<address>/handler/<name>`` (``fetch_all`` in torch/distributed/debug/_frontend.py); the handlers used here
answer, as seen on torch 2.13 CPU:

- ``ping``: ``pong``;
- ``dump_traceback``: Python's ``faulthandler`` dump of every thread (the "Current thread" is the server's
  own, with no Python frame);
- ``fr_trace_json``: the rank's Flight Recorder buffer as the JSON dump ``ddpdoctor fr`` reads.

So ``ddpdoctor stacks`` on one host reads the other hosts' ranks with the standard library alone: no ssh, and
none of the frontend's extra packages (Jinja2, aiohttp). The servers are meant for trusted networks (their
docstring says so); a body is bounded and parsed as text, never run.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from ddpdoctor.stacks.model import ProcessStacks, ThreadStack
from ddpdoctor.stacks.signal_dumps import parse_faulthandler

FETCH_S = 10.0  # all ranks are asked at once; a hung host costs this, never more
MAX_BODY = 64 << 20  # a Flight Recorder buffer of 2,000 entries with stacks is a few MB


def post(address: str, handler: str, timeout: float) -> bytes:
    """POST ``<address>/handler/<handler>`` as PyTorch's frontend does; the body, or OSError with why."""
    request = urllib.request.Request(f"{address}/handler/{handler}", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read(MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code} from {address}") from None
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OSError(f"{address}: {reason}") from None
    if len(body) > MAX_BODY:
        raise OSError(f"{address}: the answer is larger than {MAX_BODY >> 20} MiB")
    return bytes(body)


def fetch_all(addresses: Mapping[int, str], handler: str, timeout: float = FETCH_S) -> dict[int, bytes | str]:
    """rank -> body (bytes) or why there is none (str), every rank asked at once, all within ``timeout``."""
    results: dict[int, bytes | str] = {}
    lock = threading.Lock()

    def ask(rank: int, address: str) -> None:
        try:
            value: bytes | str = post(address, handler, timeout)
        except OSError as exc:
            value = str(exc)
        with lock:
            results[rank] = value

    threads = [threading.Thread(target=ask, args=item, daemon=True) for item in addresses.items()]
    for thread in threads:
        thread.start()
    end = time.monotonic() + timeout + 1.0
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    with lock:
        return {rank: results.get(rank, f"{addresses[rank]}: no answer within {timeout:g} s") for rank in addresses}


def host_of(address: str) -> str:
    """``http://nodeb:4321`` -> ``nodeb`` (the rank's ``socket.gethostname()``, as it registered)."""
    return urllib.parse.urlsplit(address).hostname or address


def main_thread(threads: list[ThreadStack]) -> list[ThreadStack]:
    """The worker's dump without the server's own thread, and one thread marked main: the one running the
    script's top level (``<module>``), else the oldest (faulthandler lists the newest first)."""
    kept = [t for t in threads if t.frames]
    for thread in kept:
        thread.main = False
    main = next((t for t in kept if t.frames[-1].function == "<module>"), kept[-1] if kept else None)
    if main is not None:
        main.main = True
        main.name = main.name or "MainThread"
    return kept


def remote_process(rank: int, address: str, answer: bytes | str, world_size: int | None,
                   job: str | None) -> ProcessStacks:
    """One rank read over HTTP: its threads, or why not. Its pid is not known there (0)."""
    proc = ProcessStacks(pid=0, host=host_of(address), rank=rank, world_size=world_size, job=job,
                         address=address)
    if isinstance(answer, str):
        proc.error = f"its debug server did not answer ({answer})"
        return proc
    proc.threads = main_thread(parse_faulthandler(answer.decode("utf-8", "replace"), None))
    if not proc.threads:
        proc.error = "its debug server's dump holds no Python thread"
    return proc


def flight_recorder(addresses: Mapping[int, str], world_size: int | None,
                    timeout: float = FETCH_S) -> tuple[dict[str, Any] | None, str | None]:
    """Every rank's Flight Recorder entries over HTTP, read by ``ddpdoctor fr``: (its JSON verdict, its
    headline), or (None, why not). The dumps pass through a private temporary folder, removed after."""
    from ddpdoctor.errors import DoctorError
    from ddpdoctor.fr import diagnose
    from ddpdoctor.fr import to_json as fr_json

    answers = fetch_all(addresses, "fr_trace_json", timeout)
    bodies = {rank: body for rank, body in answers.items() if isinstance(body, bytes)}
    if not bodies:
        return None, "no rank's debug server returned its Flight Recorder entries"
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-fr-http-") as folder:
        for rank, body in bodies.items():
            with open(os.path.join(folder, f"fr_trace_rank_{rank}"), "wb") as out:
                out.write(body)
        try:
            report = diagnose([folder], "fr_trace_rank_", world_size)
        except DoctorError as exc:
            return None, f"the Flight Recorder entries could not be read ({exc})"
        doc = fr_json(report)
    doc["fetched_ranks"] = sorted(bodies)
    return doc, f"{report.status.upper()}: {report.summary()}"
