"""In-rank progress: what completed, and what was issued but has not completed yet.

A hang is no progress, not a place (issue 25). On gloo a collective completes when the call returns, but on
NCCL ``dist.all_reduce`` only *enqueues* the collective and returns, DDP's gradient reduction is enqueued
inside ``backward()``, and a stuck or desynchronised job shows up as every host thread waiting somewhere
else (``.item()``, ``torch.cuda.synchronize()``, the next forward) with work pending on the GPU. So this
module counts *completions*, from the cheapest source that is true for each call:

- a synchronous call on CPU tensors (gloo), ``init_process_group``, ``new_group``: its return;
- a call that returned a ``Work`` (``async_op=True``, ``isend``/``irecv``, ``batch_isend_irecv``; NCCL and
  gloo alike): ``Work.is_completed()``, polled by the watchdog thread, or its ``wait()`` returning;
- a synchronous call on CUDA tensors: a CUDA event recorded on the tensor's current stream right after the
  call (torch made that stream wait for the collective, so the event completes after it), polled with
  ``Event.query()``; likewise after a DDP ``backward()`` on CUDA (DDP's reducer makes the current stream wait
  for its gradient all_reduces before ``backward()`` returns);
- an optimizer step, and a DDP ``backward()`` returning.

Why not PyTorch's Flight Recorder, which records every collective of the process group (DDP's included)
with a state? Reading it from inside the rank means ``_dump_fr_trace``: a private call that pickles the
whole ring under the GIL (2000 entries: 165 ms on this project's CPU machine, measured with torch 2.13),
and whose gloo entries stay ``scheduled`` after they complete (torch 2.13's CPU build): useless as a live
signal here, and a cost no training step may pay every tick. Work handles and CUDA events are public API,
O(1) per collective, and true on both backends. The Flight Recorder is still read once, at the verdict
(the evidence bundle's dumps), for what the wrappers cannot see (DDP's buckets with their sequence numbers).

The main thread only adds to a dict and bumps a counter; the watchdog polls and ships (see
:meth:`Completions.poll`, :meth:`Completions.snapshot`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

# In flight at once, at most (a script that never waits on its async works must not grow this forever).
MAX_INFLIGHT = 1024
# Oldest in-flight calls sent with every beat (the verdict asks for all of them).
BEAT_INFLIGHT = 8


class InFlight:
    """One issued call that has not completed: the record, what says it completed, since when."""

    __slots__ = ("desc", "group", "handle", "on", "op", "rec", "seq", "since", "site")

    def __init__(self, rec: Any, handle: Any, on: str, op: str | None = None) -> None:
        self.rec = rec
        self.handle = handle
        self.on = on  # "work" (a Work handle) or "gpu" (a CUDA event after the call)
        self.op = op or rec.op
        self.seq = rec.seq
        self.group = rec.group
        self.site = rec.site
        self.desc = rec.desc
        self.since = time.time()

    def done(self) -> bool:
        """Whether it completed (a failed Work counts: it is no longer pending)."""
        try:
            if self.on == "work":
                return bool(self.handle.is_completed())
            return bool(self.handle.query())
        except Exception:  # a Work whose backend went away, a CUDA error: not pending any more
            return True

    def to_json(self, now: float) -> dict[str, Any]:
        return {"op": self.op, "seq": self.seq, "group": self.group or None, "site": self.site, "desc": self.desc,
                "on": self.on, "age_s": round(max(0.0, now - self.since), 3)}


class Completions:
    """Completions counted so far, and the calls still in flight (written by the script's threads, polled
    and read by the watchdog)."""

    def __init__(self) -> None:
        self.done = 0
        self.inflight: dict[int, InFlight] = {}  # id(handle) -> entry; the entry keeps the handle alive
        self.last: Any = None  # the last numbered call known to have completed (the report's "last completed")

    def completed(self) -> None:
        self.done += 1

    def _finished(self, rec: Any) -> None:
        self.done += 1
        if rec is not None and rec.seq is not None:
            self.last = rec

    def issued(self, rec: Any, result: Any, device: Any = None) -> None:
        """A recorded call returned normally: count it, or track what will say it completed."""
        if result is None and device is None:  # the common case (gloo, synchronous): done on return
            self._finished(rec)
            return
        works = [w for w in (result if isinstance(result, list) else (result,)) if hasattr(w, "is_completed")]
        if works:
            for work in works:
                self._track(InFlight(rec, work, "work"))
        elif device is not None:
            self._track_gpu(rec, device)
        else:
            self._finished(rec)

    def waited(self, work: Any) -> None:
        """``work.wait()`` returned: that work completed (for NCCL: as far as this stream is concerned)."""
        entry = self.inflight.pop(id(work), None)
        self._finished(entry.rec if entry is not None else None)

    def backward_done(self, rec: Any, loss: Any) -> None:
        """A DDP ``backward()`` returned; on CUDA its gradient all_reduces complete when an event after it does."""
        self.done += 1
        if getattr(loss, "is_cuda", False):
            self._track_gpu(rec, loss.device, op="DDP gradient all_reduce")

    def _track_gpu(self, rec: Any, device: Any, op: str | None = None) -> None:
        import torch

        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._track(InFlight(rec, event, "gpu", op))

    def _track(self, entry: InFlight) -> None:
        inflight = self.inflight
        inflight[id(entry.handle)] = entry
        if len(inflight) > MAX_INFLIGHT:
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                inflight.pop(next(iter(inflight)))

    # -- the watchdog's side -------------------------------------------------------------------------------

    def poll(self) -> None:
        """Count what completed since the last poll (the watchdog thread, every tick)."""
        for key, entry in list(self.inflight.items()):
            if entry.done() and self.inflight.pop(key, None) is not None:
                self._finished(entry.rec)

    def snapshot(self, limit: int = BEAT_INFLIGHT) -> tuple[int, list[dict[str, Any]]]:
        """(how many are in flight, the oldest ``limit`` of them)."""
        entries = list(self.inflight.values())
        now = time.time()
        return len(entries), [entry.to_json(now) for entry in entries[:limit]]
