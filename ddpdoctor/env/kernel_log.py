"""NVIDIA Xid events in the kernel log: a bounded reader and a pure parser.

The NVIDIA driver reports GPU faults only to the kernel log, one ``NVRM: Xid`` line each::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149
    NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 ...)

(``pid=``/``name=`` are absent on link-level events, ``pid='N/A'`` or ``<unknown>`` on some). Newer drivers
also print a GPU falling off the bus as a multi-line message with no Xid number
(``NVRM: The NVIDIA GPU 0000:b3:00.0 / NVRM: (PCI ID: 10de:26b5) installed in this system has / NVRM:
fallen off the bus and is not responding to commands.``), which counts as Xid 79 here. What each Xid
means and whose fault it usually is: :mod:`ddpdoctor.env.xid`.

The log is read from ``/dev/kmsg``, else ``journalctl -k -b``, else ``dmesg``, whichever is readable
(``kernel.dmesg_restrict=1`` makes all three root-only); each has a deadline and a size cap.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass

from ddpdoctor.env.xid import XidInfo, xid_info

_PREFIX = re.compile(
    r"^(?:(?P<kmsg>\d+),\d+,(?P<usec>\d+),[^;]*;)"            # /dev/kmsg: prio,seq,usec,flags;message
    r"|^(?P<date>\w{3} +\d{1,2} \d\d:\d\d:\d\d) \S+ kernel: "  # journalctl -k / syslog: Feb 14 05:03:41 host kernel:
    r"|^\[\s*(?P<dmesg>\d+\.\d+)\]\s*(?:\S+ kernel: )?"        # dmesg, journalctl -o short-monotonic
    r"|^\[(?P<ctime>\w{3} (?P<cdate>\w{3} +\d{1,2} \d\d:\d\d:\d\d) (?P<year>\d{4}))\]\s*"  # dmesg -T
)
# A syslog line can carry both: "May 6 00:38:27 alex kernel: [ 4909.922970] NVRM: ...".
_INNER_STAMP = re.compile(r"^\[\s*(?P<dmesg>\d+\.\d+)\]\s*")
_MONTHS = {name: i for i, name in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                             "Nov", "Dec"), 1)}
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\): "
                  r"(?P<xid>\d+)(?P<rest>.*)$")
_PID = re.compile(r"^, pid=(?P<pid>'[^']*'|<[^>]*>|[^,]*)(?:, name=(?P<name><[^>]*>|[^,]*))?")
_FALLEN_HEAD = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class XidEvent:
    """One Xid from the kernel log (``bus`` as ``0000:3b:00``, lower case)."""

    xid: int
    bus: str
    pid: int | None
    process: str | None
    message: str
    # As the log gave it: seconds since boot ("1843.308145", dmesg and /dev/kmsg), a date without a year
    # ("Feb 14 05:03:41", journalctl's and syslog's default form) or with one ("Aug 30 11:43:09 2024",
    # dmesg -T); "" when the line had none.
    when: str

    @property
    def info(self) -> XidInfo:
        return xid_info(self.xid)

    @property
    def meaning(self) -> str:
        return self.info.meaning

    @property
    def origin(self) -> str:
        return self.info.origin

    def since_boot_s(self, boot_epoch: float, now_epoch: float) -> float | None:
        """When it happened, in seconds since boot (what ``time.monotonic()`` counts on Linux); None when
        the line says no time. A date is local time; one without a year is taken in the last twelve months."""
        return event_since_boot_s(self.when, boot_epoch, now_epoch)


def event_since_boot_s(when: str, boot_epoch: float, now_epoch: float) -> float | None:
    """``when`` of :class:`XidEvent` as seconds since boot (see there)."""
    if not when:
        return None
    if when[0].isdigit():
        try:
            return float(when)
        except ValueError:
            return None
    parts = when.split()
    if len(parts) not in (3, 4) or parts[0] not in _MONTHS or (len(parts) == 4 and not parts[3].isdigit()):
        return None
    try:
        day = int(parts[1])
        hour, minute, second = (int(x) for x in parts[2].split(":"))
        now = time.localtime(now_epoch)
        # Syslog dates have no year: the latest one not ahead of now. dmesg -T gives it.
        years = [int(parts[3])] if len(parts) == 4 else [now.tm_year, now.tm_year - 1]
        for year in years:
            epoch = time.mktime((year, _MONTHS[parts[0]], day, hour, minute, second, 0, 0, -1))
            if epoch <= now_epoch + 60:
                return epoch - boot_epoch
    except (ValueError, OverflowError):
        return None
    return None


def _strip_prefix(line: str) -> tuple[str, str]:
    """(message, when) without the dmesg/journal/kmsg prefix; a since-boot stamp wins over a date."""
    m = _PREFIX.match(line)
    if not m:
        return line.strip(), ""
    when = m.group("dmesg") or m.group("date") or ""
    if m.group("ctime"):  # dmesg -T: "Fri Aug 30 11:43:09 2024" -> "Aug 30 11:43:09 2024"
        when = f"{m.group('cdate')} {m.group('year')}"
    if m.group("usec"):
        when = f"{int(m.group('usec')) / 1e6:.6f}"
    rest = line[m.end():]
    if m.group("date") and (inner := _INNER_STAMP.match(rest)):
        when, rest = inner.group("dmesg"), rest[inner.end():]
    return rest.strip(), when


def bus_key(bus: str) -> str:
    """``00000000:3B:00.0`` (NVML), ``0000:3b:00`` (Xid) -> ``0000:3b:00``: domain as 4 digits, no function."""
    parts = bus.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    try:
        domain, b, dev = int(parts[-3], 16), int(parts[-2], 16), int(parts[-1].split(".")[0], 16)
    except (ValueError, IndexError):
        return bus.strip().lower()
    return f"{domain:04x}:{b:02x}:{dev:02x}"


def parse_xid_events(text: str) -> list[XidEvent]:
    """Every Xid in kernel-log text (dmesg, ``journalctl -k`` or ``/dev/kmsg`` form), oldest first."""
    events: list[XidEvent] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        msg, when = _strip_prefix(line)
        if m := _XID.search(msg):
            rest = m.group("rest")
            pid: int | None = None
            name: str | None = None
            if p := _PID.match(rest):
                raw = p.group("pid").strip("'")
                pid = int(raw) if raw.isdigit() else None
                name = (p.group("name") or "").strip() or None
                if name and name.startswith("<"):
                    name = None
                rest = rest[p.end():]
            events.append(XidEvent(xid=int(m.group("xid")), bus=bus_key(m.group("bus")), pid=pid, process=name,
                                   message=rest.lstrip(", ").strip(), when=when))
        elif m := _FALLEN_HEAD.search(msg):
            tail = " ".join(_strip_prefix(x)[0] for x in lines[i + 1:i + 4])
            if "fallen off the bus" in tail:
                events.append(XidEvent(xid=79, bus=bus_key(m.group("bus")), pid=None, process=None,
                                       message="GPU has fallen off the bus (reported without an Xid number)",
                                       when=when))
    return events


@dataclass(frozen=True)
class KernelLog:
    """NVRM lines of this boot's kernel log, where they came from, or why none could be read."""

    text: str
    source: str  # "/dev/kmsg", "journalctl", "dmesg" or "" when unreadable
    reason: str = ""
    truncated: bool = False


def read_kernel_log(deadline_s: float = 2.0, max_bytes: int = 8 * 2**20) -> KernelLog:
    """The ``NVRM:`` lines of the kernel log since boot, from the first readable source; never blocks past
    ``deadline_s`` and never holds more than ``max_bytes`` of log."""
    deadline = time.monotonic() + deadline_s
    reasons = []
    log = _read_kmsg(deadline, max_bytes)
    if log.source:
        return log
    reasons.append(log.reason)
    # short-monotonic: "[ 1843.308145] host kernel: ..." -- seconds since boot, like dmesg and /dev/kmsg,
    # so an Xid's age is known without guessing the year of a syslog date.
    for name, argv in (("journalctl", ["journalctl", "-k", "-b", "--no-pager", "-q", "-o", "short-monotonic"]),
                       ("dmesg", ["dmesg"])):
        exe = shutil.which(name)
        if exe is None:
            reasons.append(f"{name} not installed")
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            reasons.append(f"{name}: no time left")
            break
        log = _read_command(name, [exe, *argv[1:]], left, max_bytes)
        if log.source:
            return log
        reasons.append(log.reason)
    return KernelLog("", "", "kernel log unreadable: " + "; ".join(r for r in reasons if r))


def _keep(lines: list[str]) -> str:
    return "\n".join(x for x in lines if "NVRM" in x)


def _read_kmsg(deadline: float, max_bytes: int) -> KernelLog:
    """/dev/kmsg opened non-blocking: each read() is one record; EAGAIN means the end of the buffer."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return KernelLog("", "", f"/dev/kmsg: {exc.strerror}")
    kept: list[str] = []
    total = 0
    truncated = False
    try:
        while True:
            if time.monotonic() > deadline or total > max_bytes:
                truncated = True
                break
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the record was overwritten while we read: skip it
                    continue
                if exc.errno == errno.EINVAL and not kept:
                    return KernelLog("", "", "/dev/kmsg: records not readable here")
                break
            if not record:
                break
            total += len(record)
            line = record.decode(errors="replace").split("\n", 1)[0]
            if "NVRM" in line:
                kept.append(line)
    finally:
        os.close(fd)
    if total == 0:
        return KernelLog("", "", "/dev/kmsg: empty or not readable")
    return KernelLog(_keep(kept), "/dev/kmsg", truncated=truncated)


def _read_command(name: str, argv: list[str], timeout_s: float, max_bytes: int) -> KernelLog:
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False,
                              env={**os.environ, "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        return KernelLog("", "", f"{name} took longer than {timeout_s:.1f} s")
    except OSError as exc:
        return KernelLog("", "", f"{name}: {exc.strerror}")
    out = proc.stdout[-max_bytes:]
    text = out.decode(errors="replace")
    if proc.returncode != 0 or (name == "journalctl" and not text.strip()):
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        return KernelLog("", "", f"{name}: {err[0] if err else f'exit {proc.returncode}'}")
    return KernelLog(_keep(text.splitlines()), name, truncated=len(proc.stdout) > max_bytes)
