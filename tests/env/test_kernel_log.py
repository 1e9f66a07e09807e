"""Xid events read from real kernel-log text, and the kernel-log reader bounded on this machine.

The text in ``tests/data/kernel_logs/`` is quoted from public reports (sources in its SOURCES.md): if the
parser missed one of these lines, ``ddpdoctor check`` would call a GPU healthy that the driver already
reported as fallen off the bus or hit by an ECC error.
"""

from __future__ import annotations

import time
from pathlib import Path

from ddpdoctor.env import bus_key, parse_xid_events, read_kernel_log

LOGS = Path(__file__).resolve().parent.parent / "data" / "kernel_logs"


def _events(name: str):
    return parse_xid_events((LOGS / name).read_text())


def test_journalctl_lines_with_pid_and_process() -> None:
    events = _events("journal_xid45_149.log")
    assert [(e.xid, e.bus, e.pid, e.process) for e in events[:2]] == [
        (45, "0000:dc:00", 1818990, "python3"), (45, "0000:ed:00", 1818992, "python3")]
    assert events[0].message == "Ch 00000001 caused by previous Xid 149"
    assert events[0].when == "Feb 14 05:03:41"
    assert events[0].origin == "application" and "earlier Xid" in events[0].meaning


def test_kmsg_records_of_nvlink_xids_without_pid() -> None:
    events = _events("nvlink_xid149.log")
    assert [(e.xid, e.bus, e.pid) for e in events] == [(149, "0000:00:00", None), (145, "0018:01:00", None)]
    assert events[0].message.startswith("NETIR_LINK_EVT Fatal XC0 i0 Link 00")
    assert events[0].when == "912.345678"  # /dev/kmsg's microseconds since boot, as seconds
    assert events[0].origin == "hardware" and "NVLink" in events[0].meaning


def test_multiline_fallen_off_the_bus_counts_as_xid_79() -> None:
    events = _events("dmesg_fallen_off_bus.log")
    assert len(events) == 1
    assert (events[0].xid, events[0].bus, events[0].when) == (79, "0000:b3:00", "1843.308145")
    assert events[0].origin == "hardware"


def test_dmesg_mixed_with_other_kernel_lines() -> None:
    events = _events("mixed.log")
    assert [(e.xid, e.bus, e.pid) for e in events] == [
        (94, "0000:9b:00", 1234), (64, "0000:65:00", None), (79, "0000:44:00", None)]
    assert events[1].message == "Row Remapper: Failed to remap row"
    assert events[2].message == "GPU has fallen off the bus"


def test_bus_ids_of_nvml_and_xid_compare_equal() -> None:
    # NVML prints 00000000:3B:00.0, the Xid line PCI:0000:3b:00, sysfs 0000:3b:00.0.
    assert bus_key("00000000:3B:00.0") == bus_key("0000:3b:00") == bus_key("0000:3b:00.0") == "0000:3b:00"


def test_reader_on_this_machine_is_bounded_and_says_where_it_read() -> None:
    log = read_kernel_log(deadline_s=2.0, max_bytes=1 << 20)
    assert log.source in ("/dev/kmsg", "journalctl", "dmesg") or log.reason.startswith("kernel log unreadable")
    assert all("NVRM" in line for line in log.text.splitlines())  # only the driver's lines are kept


def test_every_log_form_gives_the_time_since_boot() -> None:
    """dmesg and /dev/kmsg stamps are seconds since boot; journalctl/syslog dates (no year) and dmesg -T
    dates (with one) are placed on the boot clock, a syslog line's own dmesg stamp winning over its date."""
    boot, now = 1_700_000_000.0, 1_700_000_000.0 + 400 * 86400.0  # up 400 days: a date of any month fits
    dmesg = _events("dmesg_xid31_62_45_13_43.log")
    assert [e.since_boot_s(boot, now) for e in dmesg[:2]] == [14328.198504, 14370.687545]
    assert _events("nvlink_xid149.log")[0].since_boot_s(boot, now) == 912.345678
    gist = _events("syslog_xid79_gist.log")
    assert gist[1].when == "4909.922970"  # "May 6 00:38:27 alex kernel: [ 4909.922970] NVRM: Xid ..."
    syslog_79 = gist[0].since_boot_s(boot, now)
    assert gist[0].when == "Sep 09 15:53:19" and syslog_79 is not None
    assert time.strftime("%b %d %H:%M:%S", time.localtime(boot + syslog_79)) == "Sep 09 15:53:19"
    assert 0 < now - (boot + syslog_79) <= 366 * 86400  # the latest Sep 09 not after now
    ctime = _events("dmesg_ctime_xid13_109.log")
    assert [(e.xid, e.pid, e.process, e.when) for e in ctime[-1:]] == [
        (109, 1797828, "pt_main_thread", "Aug 30 11:43:14 2024")]
    at = ctime[-1].since_boot_s(0.0, time.time())
    assert at == time.mktime((2024, 8, 30, 11, 43, 14, 0, 0, -1))


def test_journalctl_short_monotonic_lines_carry_seconds_since_boot() -> None:
    # The form `journalctl -k -b -o short-monotonic` prints (journalctl(1)): "[  seconds] host kernel: msg",
    # here around real messages from mixed.log (this machine's journal holds no NVRM line).
    text = ("[ 5120.417001] gpu-node-1 kernel: NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, "
            "Contained ECC error\n[ 7301.000410] gpu-node-1 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has "
            "fallen off the bus\n")
    events = parse_xid_events(text)
    assert [(e.xid, e.pid, e.when, e.message) for e in events] == [
        (94, 1234, "5120.417001", "Contained ECC error"), (79, None, "7301.000410", "GPU has fallen off the bus")]
