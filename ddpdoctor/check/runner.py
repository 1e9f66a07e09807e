"""What every rank does in ``ddpdoctor check``: join, run the checks with deadlines, report to rank 0.

1. Connect to the control plane (c10d store) and say hello (rank, host, pid).
2. Rank 0 waits for every hello until the rendezvous deadline and publishes the plan: who joined, and
   whether the process group under test can be initialised (only if everyone joined).
3. Initialise the process group under test (its own prefix on the store), with a deadline.
4. Run the checks in registry order, each in a thread with a deadline; an exception or overrun becomes an
   ``error`` finding with the stack, and after a stuck collective the process group is not used again.
5. Post this rank's findings; rank 0 collects them until the collection deadline, names ranks that never
   reported, renders one report.

The process leaves through ``os._exit``: an abandoned check thread stuck in C++ must not keep it alive.
Under torchrun only rank 0's exit code carries the result (non-zero ranks exit 0 so the launcher does not
tear rank 0 down before it reports).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from ddpdoctor.check.api import Check, CheckContext, CheckOptions, collapse
from ddpdoctor.check.causes import (
    CHECK_RAISED,
    CHECK_TIMEOUT,
    NEVER_JOINED,
    PG_INIT_FAILED,
    PG_UNUSABLE,
    WENT_SILENT,
)
from ddpdoctor.check.model import Report
from ddpdoctor.check.report import render_table, short_rank_list
from ddpdoctor.errors import EXIT_BUG, EXIT_OK, EXIT_PROBLEM, DoctorError, short_error
from ddpdoctor.findings import ERROR, FAIL, SKIP, Finding, RankInfo
from ddpdoctor.outputs import emit_json, json_to_stdout
from ddpdoctor.ranks import rank_phrase
from ddpdoctor.runtime.backend import resolve_backend
from ddpdoctor.runtime.clock import command_started_epoch
from ddpdoctor.runtime.control import ControlPlane, connect_store, wait_until_reachable
from ddpdoctor.runtime.deadline import innermost_line, run_with_deadline
from ddpdoctor.runtime.device import init_device_kwargs
from ddpdoctor.runtime.launcher import LaunchInfo
from ddpdoctor.runtime.progress import SHOW_AFTER_S, WaitDisplay
from ddpdoctor.runtime.selflaunch import interrupted_by, write_result_file

CLAIM_SETTLE_S = 0.3
# Tearing the process group under test down as a rank leaves (issue 35) takes at most this long: NCCL's
# shutdown and abort can block on a broken communicator, and the rank leaves through os._exit regardless.
TEARDOWN_S = 10.0
# More ranks than this that went silent are reported one row per check they stopped in, not one row each.
MAX_SILENT_NAMED = 4


@dataclass
class RunConfig:
    """What the user asked for; every rank builds the same one from the same command line."""

    checks: list[Check]
    backend: str = "auto"
    options: CheckOptions = field(default_factory=CheckOptions)
    json_path: str | None = None
    # None: when a selected check needs it. `bench` runs no checks and always needs one.
    process_group: bool | None = None
    # Rank 0 shows what it waits for on stderr (``runtime.progress``); off for simulated runs.
    show_waits: bool = True

    @property
    def timeout_s(self) -> float:
        return self.options.timeout_s

    @property
    def needs_process_group(self) -> bool:
        if self.process_group is not None:
            return self.process_group
        # The user's code (--model's factory, --batch) runs after the process group exists, so that it
        # sees its rank as in training: a forward that reads dist.get_rank() takes its rank's branch.
        return self.options.model is not None or any(check.needs_process_group for check in self.checks)


class Terminated(Exception):
    """SIGTERM/SIGINT from the launcher (usually: another rank died, torchrun is tearing the job down)."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signal.Signals(signum).name)


def _ignore_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


class RankRun:
    """One rank's run of the checks."""

    def __init__(self, info: LaunchInfo, config: RunConfig) -> None:
        self.info = info
        self.config = config
        self.me = RankInfo(info.rank, info.local_rank, socket.gethostname(), os.getpid())
        self.start = time.monotonic()
        # The user's clock: when the command they typed started (before this rank and its torch import).
        self.started_epoch = command_started_epoch(info.launcher)
        self.control: ControlPlane | None = None
        self.peers: dict[int, RankInfo] = {}
        self.runtime_findings: list[Finding] = []
        self.check_findings: dict[str, list[Finding]] = {}
        self.backend = config.backend
        self.device = "cpu"
        self.plan: dict[str, Any] | None = None
        self.pg_problem: str | None = None  # why the process group under test is unusable, once joined
        # Where this rank's time went (seconds per phase and per check): the JSON's ``phases_s``.
        self.phases: dict[str, float] = {}
        # Rank 0 is the one the user watches: it says what it waits for (never silent for long).
        self.waits: WaitDisplay | None = WaitDisplay() if info.rank == 0 and config.show_waits else None
        self._named_at = 0.0

    def _wait(self, what: str, total_s: float | None = None, since: float | None = None) -> None:
        if self.waits is not None:
            self.waits.begin(what, total_s, since)

    def starting(self) -> None:
        """The first wait, counted from the user's Enter: the launcher, Python and torch start in every rank."""
        now = time.monotonic()
        self._wait("starting the ranks and the control plane", since=now - max(0.0, time.time() - self.started_epoch))

    def _waited(self) -> None:
        if self.waits is not None:
            self.waits.end()

    def _naming(self, template: str, prefix: str) -> Callable[[list[str]], None]:
        """A ``wait_keys`` callback that names the ranks still missing (``{}`` in ``template``), refreshed
        once a second while the wait is shown (the look-ups are per key)."""
        def on_poll(keys: list[str]) -> None:
            waits, control = self.waits, self.control
            if waits is None or control is None or waits.waiting_for() < SHOW_AFTER_S:
                return
            now = time.monotonic()
            if now - self._named_at < 1.0:
                return
            self._named_at = now
            missing = [int(k[len(prefix):]) for k in control.absent(keys)]
            if missing:
                waits.update(template.format(_phrase(missing)))
        return on_poll

    def _phase(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.phases[name] = round(now - since, 4)
        return now

    # -- steps -------------------------------------------------------------------------------------

    def connect(self) -> bool:
        timeout = self.config.timeout_s
        is_client = self.info.rank != 0 or self.info.agent_store
        if is_client and not wait_until_reachable(self.info.master_addr, self.info.master_port,
                                                  time.monotonic() + timeout):
            self._cannot_reach(f"nothing answered within {timeout:g} s")
            return False
        outcome = run_with_deadline(lambda: connect_store(self.info, timeout), timeout + 2, "ddpdoctor-store")
        if outcome.ok:
            self.control = ControlPlane(outcome.value)
            self.control.store = self.control.prefixed(f"ddpdoctor/{self.info.run_id}/")
            return True
        err = short_error(outcome.error) if outcome.error else f"no answer within {timeout:g} s"
        if self.info.rank == 0 and not self.info.agent_store and "in use" in err.lower():
            from ddpdoctor.ports import busy_port_message

            print(f"ddpdoctor: rank 0: {busy_port_message(self.info.master_port)}", file=sys.stderr)
        else:
            self._cannot_reach(err)
        return False

    def _cannot_reach(self, why: str) -> None:
        where = f"{self.info.master_addr}:{self.info.master_port}"
        print(f"ddpdoctor: rank {self.info.rank} on {self.me.host}: cannot reach the control plane at "
              f"MASTER_ADDR:MASTER_PORT {where}: {why}. Check that MASTER_ADDR is rank 0's host as "
              "this node resolves it, and that the port is open between the nodes.", file=sys.stderr)

    def join(self) -> bool:
        """Connect, rendezvous and initialise the process group under test (``self.plan``, ``self.pg_problem``).

        False when this rank cannot take part (it has said why on stderr).
        """
        t = time.monotonic()
        self.starting()
        if not self.connect():
            self._waited()
            return False
        t = self._phase("connect", t)
        if self.rendezvous() is None:
            self._waited()
            return False
        t = self._phase("rendezvous", t)
        self.pg_problem = self.init_process_group()
        self._waited()
        self._phase("init_process_group", t)
        return True

    def rendezvous(self) -> dict[str, Any] | None:
        """Say hello; rank 0 decides who joined. Returns the plan, or None if rank 0 never published one."""
        assert self.control is not None
        control, ws, timeout = self.control, self.info.world_size, self.config.timeout_s
        control.put(f"hello/{self.info.rank}", self.me.to_json())
        claim = control.add(f"claims/{self.info.rank}", 1)
        control.put(f"claimant/{self.info.rank}/{claim}", self.me.to_json())
        if self.info.rank == 0:
            deadline = self.start + timeout
            others = "the other rank" if ws == 2 else f"the other {ws - 1} ranks"
            self._wait(f"waiting for {others} to join", timeout, self.start)
            present = control.wait_keys([f"hello/{r}" for r in range(ws)], deadline,
                                        self._naming("waiting for {} to join", "hello/"))
            self._waited()
            # A moment for a second process claiming the same rank (a broken task layout) to show up too,
            # so the report can name both; everyone else is already waiting for the plan anyway.
            time.sleep(CLAIM_SETTLE_S)
            joined = sorted(int(k.split("/")[1]) for k in present)
            peers = {str(r): control.get_nowait(f"hello/{r}") for r in joined}
            plan: dict[str, Any] = {"joined": joined, "missing": [r for r in range(ws) if r not in joined],
                                    "peers": peers}
            control.put("plan", plan)
        else:
            plan = control.wait_get("plan", self.start + 2 * timeout + 5)
            if plan is None:
                print(f"ddpdoctor: rank {self.info.rank}: rank 0 never published the plan within the deadline; "
                      "rank 0 is not running ddpdoctor or died (its host's output says why)", file=sys.stderr)
                return None
        if self.info.rank not in plan["joined"]:
            print(f"ddpdoctor: rank {self.info.rank} on {self.me.host}: joined after rank 0's rendezvous "
                  f"deadline (--timeout {timeout:g} s) and is reported as never joined; start every rank "
                  "together, or raise --timeout", file=sys.stderr)
            return None
        self.peers = {int(r): RankInfo.from_json(d) for r, d in plan["peers"].items() if d}
        self.plan = dict(plan)
        return self.plan

    def init_process_group(self) -> str | None:
        """Initialise the process group under test; returns why it is unusable, or None when it is up."""
        try:
            self.backend, self.device = resolve_backend(self.config.backend, self.info.local_rank)
        except DoctorError as exc:  # under torchrun/srun: every rank reports it, rank 0 names the hosts
            self.backend, self.device = self.config.backend, "cpu"
            self.runtime_findings.append(Finding("connectivity", FAIL, str(exc), [self.info.rank],
                                                 "run with --backend gloo or auto on hosts without GPUs",
                                                 {"kind": "backend_unusable"}))
            return str(exc)
        if not self.config.needs_process_group:
            return "no selected check needs it"
        assert self.plan is not None
        if self.plan["missing"]:
            return f"{rank_phrase(self.plan['missing'])} never joined"
        assert self.control is not None
        import torch.distributed as dist

        store = self.control.prefixed("pg/")
        timeout = self.config.timeout_s
        from datetime import timedelta

        # Bound to its GPU (device_id): NCCL neither guesses the device nor warns that it did.
        bind = init_device_kwargs(self.backend, self.device)

        def init() -> None:
            dist.init_process_group(self.backend, store=store, rank=self.info.rank,
                                    world_size=self.info.world_size, timeout=timedelta(seconds=timeout), **bind)

        self._wait(f"initialising the {self.backend} process group", timeout)
        outcome = run_with_deadline(init, timeout, "ddpdoctor-pg-init")
        self._waited()
        if outcome.ok:
            return None
        why = (f"did not finish within {timeout:g} s" if outcome.timed_out
               else _backend_error(outcome.error) if outcome.error else "failed")
        if outcome.error is not None:
            abort_half_made_groups(outcome.error)
        self.runtime_findings.append(Finding(
            "connectivity", FAIL, f"init_process_group({self.backend}) failed: {why}", [self.info.rank],
            "the ranks reached each other's store but not each other: check firewalls between nodes and "
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME",
            {"kind": PG_INIT_FAILED, "error": outcome.error_text or outcome.stack_at_timeout}))
        return f"init_process_group failed on this rank: {why}"

    def run_checks(self, pg_problem: str | None) -> None:
        assert self.control is not None
        timeout = self.config.timeout_s
        import torch.distributed as dist

        for check in self.config.checks:
            self.control.put(f"progress/{self.info.rank}", check.id)
            if check.rank0_only and self.info.rank != 0:
                continue
            if check.needs_process_group and pg_problem is not None:
                if any(f.check == check.id and f.status in (FAIL, ERROR) for f in self.runtime_findings):
                    continue  # its failure is already reported (connectivity: the init that failed)
                self.runtime_findings.append(Finding(
                    check.id, SKIP, f"not run: the process group is not usable ({pg_problem})", [self.info.rank],
                    details={"kind": PG_UNUSABLE}))
                continue
            ctx = CheckContext(
                rank=self.info.rank, world_size=self.info.world_size, local_rank=self.info.local_rank,
                local_world_size=self.info.local_world_size, host=self.me.host, pid=self.me.pid,
                launcher=self.info.launcher, backend=self.backend, device=self.device,
                master_addr=self.info.master_addr, master_port=self.info.master_port,
                process_group=dist.group.WORLD if dist.is_initialized() else None,
                store=self.control.prefixed(f"check/{check.id}/"), options=self.config.options,
                deadline=time.monotonic() + timeout, peers=self.peers, started_epoch=self.started_epoch)
            began = time.monotonic()
            self._wait(f"running the {check.id} check", timeout, began)
            outcome = run_with_deadline(functools.partial(check.run, ctx), timeout, f"ddpdoctor-{check.id}")
            self._waited()
            self._phase(f"check:{check.id}", began)
            if outcome.timed_out:
                where = innermost_line(outcome.stack_at_timeout)
                self.runtime_findings.append(Finding(
                    check.id, ERROR, f"did not finish within {timeout:g} s (stuck at: {where or 'unknown'})",
                    [self.info.rank], "a peer is stuck or dead (see ranks that did not report); raise --timeout "
                    "only if the network is known to be slow", {"kind": CHECK_TIMEOUT, "stack": outcome.stack_at_timeout}))
                if check.needs_process_group:
                    pg_problem = f"{check.id} was abandoned while inside a collective"
            elif outcome.error is not None:
                internal = not _is_peer_failure(outcome.error)
                self.runtime_findings.append(Finding(
                    check.id, ERROR, f"the check raised {type(outcome.error).__name__}: {short_error(outcome.error)}"[:300],
                    [self.info.rank], _remedy_for_exception(outcome.error),
                    {"kind": CHECK_RAISED, "traceback": outcome.error_text, "internal": internal}))
                if check.needs_process_group:
                    pg_problem = f"{check.id} raised {type(outcome.error).__name__}"
            else:
                produced = outcome.value or []
                for finding in produced:
                    finding.check = check.id
                    finding.ranks = finding.ranks or [self.info.rank]
                self.check_findings[check.id] = list(produced)
                if check.needs_process_group and any(f.status in (FAIL, ERROR) for f in produced):
                    # A failed collective leaves the process group in an unknown state (gloo pairs closed,
                    # NCCL communicators aborted): later checks would only fail again, slower.
                    pg_problem = f"the {check.id} check failed"
            self.pg_problem = pg_problem  # what close() goes by: a group a check broke is aborted, not shut down
            # Posted after every check: if this rank dies later, rank 0 still has what it found so far.
            self.post(final=False)

    def _own_result(self) -> dict[str, Any]:
        return {
            "info": self.me.to_json(),
            "backend": self.backend,
            "checks": {cid: [f.to_json() for f in fs] for cid, fs in self.check_findings.items()},
            "runtime": [f.to_json() for f in self.runtime_findings],
            "phases": self.phases,
        }

    def post(self, final: bool = True) -> None:
        assert self.control is not None
        self.control.put(f"result/{self.info.rank}", self._own_result())
        if final:
            self.control.put(f"progress/{self.info.rank}", "done")
            self.control.put(f"done/{self.info.rank}", True)

    def close(self) -> str:
        """Tear the process group under test down before this rank leaves; what was done, in a word.

        PyTorch asks for ``destroy_process_group()`` before exit; its NCCL group prints "WARNING:
        destroy_process_group() was not called before program exit, which can leak resources" from its
        destructor otherwise (``~ProcessGroupNCCL``). A healthy group is destroyed; one a check broke (or
        a signal interrupted) is aborted on NCCL -- its shutdown can wait forever on a peer that is gone --
        and left to ``os._exit`` on gloo, which has nothing to release that the exit does not. Either way
        within :data:`TEARDOWN_S`: past it the rank leaves anyway (``"abandoned"``).
        """
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return "none"
        # _abort_process_group: torch >= 2.4 (an older one keeps its group to os._exit, which runs no destructor).
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if self.pg_problem is None:
            work, done = dist.destroy_process_group, "destroyed"
        elif self.backend == "nccl" and abort is not None:
            work, done = abort, "aborted"
        else:
            return "left"
        outcome = run_with_deadline(work, TEARDOWN_S, "ddpdoctor-teardown")
        return done if outcome.ok else "abandoned" if outcome.timed_out else "failed"

    # -- rank 0 ------------------------------------------------------------------------------------

    def collect(self, deadline: float) -> Report:
        """Gather every joined rank's result until ``deadline`` and merge them into one report."""
        began = time.monotonic()
        ws = self.info.world_size
        joined = self.plan["joined"] if self.plan else [self.info.rank]
        results: dict[int, dict[str, Any]] = {}
        finished: set[int] = set()
        if self.control is not None:
            self._wait("waiting for the other ranks to report", max(0.0, deadline - began), began)
            present = self.control.wait_keys([f"done/{r}" for r in joined], deadline,
                                             self._naming("waiting for {} to report", "done/"))
            self._waited()
            finished = {int(key.split("/")[1]) for key in present}
            for rank in joined:
                partial = self.control.get_nowait(f"result/{rank}")
                if partial is not None:
                    results[rank] = partial
        else:  # the store is gone (the launcher went with it): this rank's own findings at least
            results[self.info.rank] = self._own_result()
        findings: list[Finding] = []
        runtime: list[Finding] = []
        for check in self.config.checks:
            by_rank = {r: [Finding.from_json(f) for f in res["checks"].get(check.id, [])]
                       for r, res in sorted(results.items()) if check.id in res["checks"]}
            if not by_rank:
                continue
            if check.combine is not None:
                findings.extend(check.combine(by_rank, self.peers))
            else:
                findings.extend(collapse([f for r in sorted(by_rank) for f in by_rank[r]]))
        for res in results.values():
            runtime.extend(Finding.from_json(f) for f in res["runtime"])
        findings.extend(collapse(runtime))
        findings[:0] = self._unreported(joined, finished) + self._duplicate_claims()
        backend = next((res["backend"] for res in results.values() if res.get("backend")), self.backend)
        ranks = [self.peers.get(r) or RankInfo.from_json(res["info"]) for r, res in results.items()]
        ranks += [self.peers[r] for r in self.peers if r not in results]
        if not ranks:
            ranks = [self.me]
        phases = _slowest_phases(results)
        phases["collect"] = round(time.monotonic() - began, 4)
        return Report(ws, backend, self.info.launcher, ranks, findings, [c.id for c in self.config.checks],
                      time.monotonic() - self.start, phases, max(0.0, time.time() - self.started_epoch)).fold()

    def _duplicate_claims(self) -> list[Finding]:
        """Two processes that both think they are rank N: the launcher's task layout is wrong."""
        if self.control is None:
            return []
        found = []
        for rank in range(self.info.world_size):
            count = self.control.add(f"claims/{rank}", 0)
            if count > 1:
                claimants = [RankInfo.from_json(c) for i in range(1, count + 1)
                             if (c := self.control.get_nowait(f"claimant/{rank}/{i}"))]
                named = ", ".join(f"pid {c.pid} on {c.host}" for c in claimants)
                found.append(Finding(
                    "env", FAIL, f"rank {rank} is claimed by {count} processes ({named})", [rank],
                    "every process needs a distinct RANK: check --node-rank on each torchrun, or the "
                    "SLURM task layout (one srun per job step)", {"claimants": [c.to_json() for c in claimants]}))
        return found

    def _unreported(self, joined: list[int], finished: set[int]) -> list[Finding]:
        ws, timeout = self.info.world_size, self.config.timeout_s
        missing = []
        never = [r for r in range(ws) if r not in joined]
        if never:
            missing.append(Finding(
                "barrier", FAIL, f"{_phrase(never)} did not report: "
                f"never joined within {timeout:g} s", never,
                "those ranks never started ddpdoctor or could not reach MASTER_ADDR:MASTER_PORT "
                f"({self.info.master_addr}:{self.info.master_port}); look at their own output, and at "
                "`ddpdoctor stacks` on their hosts if they are stuck", {"kind": NEVER_JOINED, "unreported": True}))
        silent = [r for r in joined if r not in finished]
        last_of = {r: (self.control.get_nowait(f"progress/{r}") if self.control is not None else None)
                   for r in silent}
        if len(silent) > MAX_SILENT_NAMED:
            # Hundreds of rows would bury the cause: one row per check they stopped in, ranks as a list.
            by_last: dict[str | None, list[int]] = {}
            for rank in silent:
                by_last.setdefault(last_of[rank], []).append(rank)
            for last, ranks in by_last.items():
                hosts = sorted({self.peers[r].host for r in ranks if r in self.peers})
                on = (f" on {len(hosts)} host{'s' if len(hosts) != 1 else ''} ({', '.join(hosts[:3])}"
                      f"{', ...' if len(hosts) > 3 else ''})") if hosts else ""
                missing.append(Finding(
                    "barrier", FAIL, f"{_phrase(ranks)}{on} did not report: joined, then went silent"
                    + (f" during the '{last}' check" if last else ""), ranks,
                    "those ranks died or hang: check their exit status / dmesg (OOM killer) on their hosts, or "
                    "run `ddpdoctor stacks` there while they hang", {"kind": WENT_SILENT, "unreported": True,
                                                                   "last_check": last,
                                                                   "hosts": hosts}))
            return missing
        for rank in silent:
            peer = self.peers.get(rank)
            last = last_of[rank]
            where = f" on {peer.host} (pid {peer.pid})" if peer else ""
            missing.append(Finding(
                "barrier", FAIL, f"rank {rank}{where} did not report: it joined, then went silent"
                + (f" during the '{last}' check" if last else ""), [rank],
                "the rank died or hangs: check its exit status / dmesg (OOM killer) on its host, or run "
                "`ddpdoctor stacks` there while it hangs", {"kind": WENT_SILENT, "unreported": True,
                                                            "last_check": last,
                                                            "host": peer.host if peer else None,
                                                            "pid": peer.pid if peer else None}))
        return missing

    def finish(self, report: Report) -> int:
        """Print the report (or ``--json -``: the JSON instead), write --json and the self-launch result file;
        the exit code."""
        _ignore_signals()  # the report is printed once, whole
        if self.waits is not None:
            self.waits.close()
        json_path = self.config.json_path
        if not json_to_stdout(json_path):
            print(render_table(report, verbose=self.config.options.verbose), flush=True)
        data = report.to_json()
        code = EXIT_PROBLEM if report.status == FAIL else EXIT_OK
        if any(f.details.get("internal") for f in report.findings):
            code = EXIT_BUG
        if json_path:
            try:
                emit_json(json_path, data, "check")
            except (OSError, DoctorError) as exc:
                print(f"ddpdoctor: cannot write --json {json_path}: {exc}",
                      file=sys.stderr, flush=True)
                code = max(code, EXIT_PROBLEM)
        write_result_file(code, data)
        return code


def abort_half_made_groups(error: BaseException) -> list[str]:
    """Abort the process groups a failed ``init_process_group`` left in its exception's frames; their names.

    With ``device_id`` NCCL connects eagerly inside ``_new_process_group_helper``; when that raises (two
    ranks on one GPU, no socket interface) the group it made is never registered, and lives on in the
    traceback until the frames are freed -- then its destructor prints PyTorch's "destroy_process_group()
    was not called" warning (the H200 run's failure paths, issue 35). Aborted first (``abort()`` marks it
    terminated, so the destructor is quiet), within :data:`TEARDOWN_S`, and the frames cleared so it goes
    now. A group the world registered is not touched: :meth:`RankRun.close` owns that one.
    """
    import traceback

    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend  # the C++ base of ProcessGroupNCCL/Gloo (not c10d's names)

    registered = {id(pg) for pg in dist.distributed_c10d._world.pg_map}
    kinds = (dist.ProcessGroup, Backend)
    found: dict[int, Any] = {}
    chain: list[BaseException] = []
    exc: BaseException | None = error
    while exc is not None and all(exc is not e for e in chain):  # the exception and those it was raised from
        chain.append(exc)
        tb = exc.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                if isinstance(value, kinds) and id(value) not in registered:
                    found.setdefault(id(value), value)
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    groups = [g for g in found.values() if isinstance(g, dist.ProcessGroup)]
    # A group's abort() aborts its backends; a backend found without its group is aborted on its own.
    targets = groups or list(found.values())
    if not targets:
        return []

    def abort_all() -> None:
        for target in targets:
            with contextlib.suppress(Exception):  # a backend without abort(): its destructor is all there is
                target.abort()

    if run_with_deadline(abort_all, TEARDOWN_S, "ddpdoctor-abort").ok:
        targets_named = [type(t).__name__ for t in targets]
        found.clear()
        targets.clear()
        groups.clear()
        for raised in chain:
            traceback.clear_frames(raised.__traceback__)
        return targets_named
    return []  # still aborting after the deadline: left alive (os._exit runs no destructor)


def _phrase(ranks: list[int]) -> str:
    """'rank 3' / 'ranks 1,5' in full while short, else the count and the start of the list."""
    return rank_phrase(ranks) if len(ranks) <= MAX_SILENT_NAMED else f"{len(ranks)} ranks ({short_rank_list(ranks)})"


def _slowest_phases(results: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Each phase's longest time over the ranks (the job waits for the slowest), in phase order."""
    slowest: dict[str, float] = {}
    for res in results.values():
        for name, seconds in (res.get("phases") or {}).items():
            slowest[name] = max(slowest.get(name, 0.0), float(seconds))
    return slowest


def _backend_error(exc: BaseException) -> str:
    """The first line of a process-group error, and NCCL's "Last error:" line when there is one: its first
    line says only "internal error" or "invalid usage"; the cause ("Bootstrap : no socket interface found",
    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000") is the line after."""
    text = str(exc)
    first = short_error(exc)
    lines = [line.strip() for line in text.splitlines()]
    if "Last error:" in lines:
        last = next((line for line in lines[lines.index("Last error:") + 1:] if line), "")
        if last and last not in first:
            return f"{first}; last error: {last}"
    return first


def _is_peer_failure(exc: BaseException) -> bool:
    """A collective that breaks mid-check (a peer died, a link broke) is the job's problem, not ours."""
    text = f"{type(exc).__module__}.{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("torch.distributed", "gloo", "nccl", "connection", "timed out", "timeout"))


def _remedy_for_exception(exc: BaseException) -> str:
    if _is_peer_failure(exc):
        return ("a peer died or a link broke during this check: see the ranks that did not report and the "
                "connectivity findings")
    return "this is a ddpdoctor bug: please report it with the traceback (run with --verbose)"


def run_rank(info: LaunchInfo, config: RunConfig) -> int:
    """The whole run on one rank; returns the process exit code (the caller leaves with os._exit)."""
    run = RankRun(info, config)
    run.starting()  # shown while torch loads: seconds on a loaded node
    # Importing torch takes seconds on a loaded node; it must not eat into the rendezvous deadline.
    import torch.distributed  # noqa: F401

    run.start = time.monotonic()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
    try:
        if not run.join():
            return EXIT_PROBLEM
        run.run_checks(run.pg_problem)
        run.post()
        if info.rank != 0:
            return EXIT_OK
        return run.finish(run.collect(time.monotonic() + config.timeout_s))
    except Terminated as exc:
        # Signals stay raised as Terminated only once: a second one must not interrupt the report.
        _ignore_signals()
        run.pg_problem = run.pg_problem or f"stopped by {exc}"
        if info.rank != 0 or run.control is None:
            return EXIT_PROBLEM
        # Our own self-launching parent noted an interrupt (Ctrl-C, a scheduler's SIGTERM) before passing it on:
        # every rank was stopped by it, none "went silent". Else the launcher is tearing the job down after a
        # rank exited, and the ranks that did not report are where to look.
        interrupt = interrupted_by()
        if interrupt:
            run.runtime_findings.append(Finding(
                "barrier", ERROR, f"the run was interrupted ({interrupt} to ddpdoctor) before every rank reported: "
                "the checks below are the ones that had finished, and no rank was seen to fail", [],
                "run it again to completion to check the rest", {"kind": "interrupted", "signal": interrupt}))
        else:
            run.runtime_findings.append(Finding(
                "barrier", ERROR, f"rank 0 was stopped by {exc} before all ranks reported (the launcher tears the "
                "job down when a rank exits)", [0], "see the ranks that did not report: one of them died first"))
        with contextlib.suppress(Exception):  # the store may be gone with the launcher
            run.post()
        try:
            report = run.collect(time.monotonic() + min(2.0, config.timeout_s))
        except Exception:  # the launcher's store went away with it: report what this rank knows
            run.control = None
            report = run.collect(time.monotonic())
        if interrupt:  # the same signal stopped them: not ranks that died or hang
            report.findings = [f for f in report.findings if not (f.details or {}).get("unreported")]
        return run.finish(report)
    finally:
        _ignore_signals()  # the teardown is bounded; a signal must not turn it into a traceback
        run.close()
