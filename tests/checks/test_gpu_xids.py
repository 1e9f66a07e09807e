"""Xids judged, not counted: an old application fault is a note, a recent hardware fault fails with the action.

Every Xid line here is real kernel-log text from public reports (``tests/data/kernel_logs``, sources in its
SOURCES.md): a device-side assert's 13/13/43 sequence, an application's MMU fault (31) with its pid and
name, a micro-controller halt (62) followed by the cleanup Xid 45, a GPU fallen off the bus (79), the
``dmesg -T`` and syslog forms. Only the host's clock (its uptime when ``check`` runs) is the test's
choice, so the same line is judged as recent or as old. The other ranks' GPU facts come from the NVML TEST
DOUBLE (``tests/env/test_nvml.py``): there is no GPU here.
"""

from __future__ import annotations

import time
from typing import Any

from ddpdoctor.checks import gpu as gpu_check
from ddpdoctor.env import xid
from ddpdoctor.findings import FAIL, PASS, WARN, overall_status
from tests.checks.test_gpu import _preflight_for, combine, host_gpus, rank_facts

H = 3600.0


def _job(bus: str, log: str, uptime_s: float, job_started_s: float | None = None,
         pid: int | None = None) -> dict[int, dict[str, Any]]:
    """A one-host, two-GPU job whose rank 0 sits on the GPU at ``bus`` with that kernel log."""
    a = host_gpus("node-a")
    facts = {0: rank_facts(0, "node-a", 0, a), 1: rank_facts(1, "node-a", 1, a)}
    facts[0]["preflight"] = _preflight_for(bus, log, uptime_s, job_started_s)
    if pid is not None:
        facts[0]["pid"] = pid
    return facts


def _xids(findings: list[Any]) -> list[Any]:
    return [f for f in findings if "Xid" in f.summary]


def test_an_old_device_side_assert_is_a_note_and_the_gpu_still_passes() -> None:
    # The case: Xid 13, 13, 43 from an earlier job's device-side assert, 3 hours before this check.
    found = combine(_job("00000000:1B:00.0", "dmesg_xid31_62_45_13_43.log", uptime_s=263255.9 + 3 * H))
    xids = _xids(found)
    assert [(f.status, f.summary.split(" (")[0].split("] ")[1]) for f in xids] == [(PASS, "note: Xid 13"),
                                                                                 (PASS, "note: Xid 43")]
    assert "2 times since boot, last 3 h 0 min ago" in xids[0].summary
    assert "an application's fault, not the GPU's: nothing to do" in xids[1].summary and not xids[1].remedy
    assert overall_status(found) == PASS  # not a WARN forever after
    assert any(f.status == PASS and "2 ranks on 2 distinct GPUs" in f.summary for f in found)


def test_an_application_xid_during_this_run_warns_and_names_the_rank() -> None:
    # The MMU fault of pid 13332 happened after this run started, and 13332 is this job's rank 0 (the halt
    # and cleanup 40 s later belong to this run too).
    found = combine(_job("00000000:0A:00.0", "dmesg_xid31_62_45_13_43.log", uptime_s=14380.0,
                         job_started_s=14320.0, pid=13332))
    xid31 = next(f for f in _xids(found) if "Xid 31" in f.summary)
    assert xid31.status == WARN and xid31.ranks == [0]
    assert "Xid 31 (GPU memory page fault: a kernel used" in xid31.summary
    assert "1 time during this run, last 52 s ago" in xid31.summary
    assert "from pid 13332 (cuda_plot_k32_v), a rank of this job" in xid31.summary
    assert "compute-sanitizer" in xid31.remedy


def test_an_application_xid_of_another_process_during_this_run_is_a_note() -> None:
    # The same MMU fault during this run, but pid 13332 is not one of this job's ranks (rank 0 is pid 4242):
    # another program's fault on a shared GPU. The first H100 run of the GPU suite warned here: a test job
    # beside `check` hit a device-side assert (Xid 43 from its pid), and the README's check read WARN.
    found = combine(_job("00000000:0A:00.0", "dmesg_xid31_62_45_13_43.log", uptime_s=14380.0,
                         job_started_s=14320.0, pid=4242))
    xid31 = next(f for f in _xids(found) if "Xid 31" in f.summary)
    assert xid31.status == PASS and "note: Xid 31" in xid31.summary and not xid31.remedy
    assert "from pid 13332 (cuda_plot_k32_v)" in xid31.summary and "a rank of this job" not in xid31.summary


def test_a_recent_driver_xid_fails_with_the_action_and_its_cleanup_stays_a_note() -> None:
    # Ten minutes after a micro-controller halt (62) and the cleanup (45) it caused.
    found = combine(_job("00000000:0A:00.0", "dmesg_xid31_62_45_13_43.log", uptime_s=14370.7 + 600))
    by_xid = {f.summary.split("Xid ")[1].split(" ")[0]: f for f in _xids(found)}
    assert by_xid["62"].status == FAIL and "in the last hour, last 10 min ago" in by_xid["62"].summary
    assert by_xid["62"].remedy.startswith("drain the node, reset the GPU") and "RMA" in by_xid["62"].remedy
    assert by_xid["45"].status == PASS and by_xid["45"].summary.split("] ")[1].startswith("note: Xid 45")
    assert "from pid" not in by_xid["45"].summary  # pid='<unknown>': no process is named
    assert by_xid["31"].status == PASS and "from pid 13332 (cuda_plot_k32_v)" in by_xid["31"].summary
    assert overall_status(found) == FAIL


def test_an_old_hardware_xid_warns_until_the_gpu_was_reset() -> None:
    found = combine(_job("00000000:44:00.0", "mixed.log", uptime_s=7301.0 + 5 * H))
    [xid79] = _xids(found)
    assert xid79.status == WARN and "1 time since boot, last 5 h 0 min ago" in xid79.summary
    assert xid79.remedy.startswith("unless the GPU was reset or the node rebooted since: drain the node")


def test_a_line_without_a_time_is_judged_as_since_boot() -> None:
    # journalctl's date form of a GPU fallen off the bus, pid=0 (the kernel): no process named.
    facts = _job("00000000:10:00.0", "syslog_xid79_gist.log", uptime_s=1000.0)
    for event in facts[0]["preflight"]["xid_events"]:
        event["at_s"] = None  # as if the date could not be placed on this boot's clock
    [xid79] = _xids(combine(facts))
    assert xid79.status == WARN and "1 time since boot, last at Sep 09 15:53:19" in xid79.summary
    assert "from pid" not in xid79.summary


def test_dmesg_ctime_dates_are_placed_on_the_boot_clock() -> None:
    # `dmesg -T` lines of 2024-08-30, read half an hour after the last of them (local time, as dmesg prints).
    now = time.mktime((2024, 8, 30, 12, 13, 14, 0, 0, -1))
    boot_epoch = now - 100_000.0
    from ddpdoctor.env import parse_xid_events
    from tests.support import REPO

    events = parse_xid_events((REPO / "tests/data/kernel_logs/dmesg_ctime_xid13_109.log").read_text())
    at = [e.since_boot_s(boot_epoch, now) for e in events]
    assert [round(100_000.0 - a) for a in at if a is not None] == [1805, 1805, 1805, 1800]
    pre = {"uptime_s": 100_000.0, "boot_epoch": boot_epoch, "job_started_s": 99_990.0,
           "xid_events": [{"xid": e.xid, "pid": e.pid, "process": e.process, "message": e.message,
                           "when": e.when, "at_s": a} for e, a in zip(events, at, strict=True)]}
    judged = {p[1].split(" (")[0]: p for p in gpu_check.xid_problems(pre)}
    assert set(judged) == {"note: Xid 13", "note: Xid 109"}  # application Xids, not this run's
    assert "last 30 min ago (at 11:43:14) from pid 1797828 (pt_main_thread)" in judged["note: Xid 109"][1]
    assert judged["note: Xid 13"][1].startswith("note: Xid 13 (graphics engine exception")


def test_the_catalog_splits_application_from_hardware_and_driver() -> None:
    application = {13, 31, 43, 45}
    hardware_or_driver = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
    assert {x for x in application if xid.xid_info(x).application} == application
    assert not any(xid.xid_info(x).application for x in hardware_or_driver)
    assert {xid.xid_info(x).origin for x in hardware_or_driver} == {xid.HARDWARE, xid.DRIVER}
    unknown = xid.xid_info(999)
    assert unknown.origin == xid.UNKNOWN and "NVIDIA's Xid catalog" in unknown.action
    # An Xid the catalog does not list warns while recent and is a note when old.
    recent = {"uptime_s": 1000.0, "xid_events": [{"xid": 999, "pid": None, "when": "900.0", "at_s": 900.0}]}
    old = {"uptime_s": 10 * H, "xid_events": [{"xid": 999, "pid": None, "when": "900.0", "at_s": 900.0}]}
    assert gpu_check.xid_problems(recent)[0][0] == WARN
    assert gpu_check.xid_problems(old)[0][0] == PASS
