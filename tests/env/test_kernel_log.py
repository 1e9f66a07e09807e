"""Xid events read from real kernel-log text, and the kernel-log reader bounded on this machine.

The text in ``tests/data/kernel_logs/`` is quoted from public reports (sources in its SOURCES.md): if the
parser missed one of these lines, ``ddpdoctor check`` would call a GPU healthy that the driver already
reported as fallen off the bus or hit by an ECC error.
"""

from __future__ import annotations

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
    assert events[0].severity == "warn" and "previous error" in events[0].meaning


def test_kmsg_records_of_nvlink_xids_without_pid() -> None:
    events = _events("nvlink_xid149.log")
    assert [(e.xid, e.bus, e.pid) for e in events] == [(149, "0000:00:00", None), (145, "0018:01:00", None)]
    assert events[0].message.startswith("NETIR_LINK_EVT Fatal XC0 i0 Link 00")
    assert events[0].when == "912.345678"  # /dev/kmsg's microseconds since boot, as seconds
    assert events[0].severity == "fail" and "NVLink" in events[0].meaning


def test_multiline_fallen_off_the_bus_counts_as_xid_79() -> None:
    events = _events("dmesg_fallen_off_bus.log")
    assert len(events) == 1
    assert (events[0].xid, events[0].bus, events[0].when) == (79, "0000:b3:00", "1843.308145")
    assert events[0].severity == "fail"


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
