"""Inputs as the scanner wants them: torchrun error files read as their traceback, UTF-16 logs as UTF-8, gzip'd
logs decompressed."""

from __future__ import annotations

import codecs
import gzip
import io
import zlib
from collections.abc import Iterable
from typing import IO, Any, cast

from ddpdoctor.errors import DoctorError
from ddpdoctor.explain.knowledge import Signature
from ddpdoctor.explain.model import ExplainResult
from ddpdoctor.explain.scanner import Scanner
from ddpdoctor.safejson import loads_untrusted

# A torchrun worker's error file (TORCHELASTIC_ERROR_FILE, written by @record / ErrorHandler) is one small JSON
# document; anything larger is not one and is scanned as a log.
MAX_ERROR_FILE_BYTES = 16 << 20

def error_file_text(data: bytes) -> str | None:
    """The log lines a torchrun worker error file stands for, or None if ``data`` is not one.

    torchrun gives each worker TORCHELASTIC_ERROR_FILE ({log_dir}/attempt_N/RANK/error.json); a worker whose
    entry point is decorated with ``torch.distributed.elastic.multiprocessing.errors.record`` writes its
    exception there as ``{"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack":
    "Traceback ...", "timestamp": "..."}}}`` (errors/error_handler.py). The traceback is the worker's real
    failure; torchrun's own summary only says the rank exited with code 1. Parsed by
    ``ddpdoctor.safejson.loads_untrusted`` (no code runs; NaN, 1e400, huge numbers and deep nesting are refused:
    torchrun never writes them, so such a file is scanned as plain text instead).
    """
    try:
        doc = loads_untrusted(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # UntrustedJSONError is a ValueError
        return None
    if not isinstance(doc, dict) or "message" not in doc:
        return None
    message = doc["message"]
    lines: list[str] = []
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        text = message.get("message")
        if isinstance(stack, str):
            lines.append(stack.rstrip("\n"))
        if isinstance(text, str) and not (isinstance(stack, str) and text in stack):
            lines.append(text)
    elif isinstance(message, str):
        lines.append(message)
    return "\n".join(lines) + "\n" if lines else None


class _Prefixed(io.RawIOBase):
    """``head`` (bytes already read while sniffing the input) followed by the rest of ``stream``."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self._head = memoryview(head)
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head.nbytes:
            n = min(len(buffer), self._head.nbytes)
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        readinto = getattr(self._stream, "readinto", None)
        if readinto is not None:  # straight into the scanner's buffer: no copy per chunk
            return cast(int, readinto(buffer) or 0)
        data = self._stream.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class _Utf16AsUtf8(io.RawIOBase):
    """A UTF-16 stream (its byte-order mark first) read as UTF-8, a piece at a time (memory stays flat).

    Windows PowerShell 5 writes ``python train.py > log.txt`` as UTF-16LE with a BOM: every other byte is
    NUL, so no keyword would ever match. Undecodable code units become U+FFFD, as in a UTF-8 log.
    """

    def __init__(self, stream: IO[bytes], encoding: str = "utf-16") -> None:
        self._stream = stream
        # "utf-16" reads and drops the BOM; "utf-16-le"/"-be" for a stream without one.
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._pending = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending and not self._eof:
            data = self._stream.read(1 << 20)
            self._eof = not data
            self._pending = self._decoder.decode(data, final=self._eof).encode("utf-8", errors="replace")
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def _read_up_to(stream: IO[bytes], limit: int) -> bytes:
    """Up to ``limit`` bytes: a raw stream's read() may return less than asked before its end."""
    parts, have = [], 0
    while have < limit:
        data = stream.read(limit - have)
        if not data:
            break
        parts.append(data)
        have += len(data)
    return b"".join(parts)


class _Gunzipped(io.RawIOBase):
    """A gzip'd log (``train.log.gz``, as logrotate and many job schedulers keep them) read decompressed, a piece
    at a time. A file that cannot be read to its end (cut short, damaged) is one line, exit 2: scanned as bytes it
    gave "no known error found", an all-clear for a log that was never read."""

    def __init__(self, stream: IO[bytes], name: str) -> None:
        self._gz = gzip.GzipFile(fileobj=stream, mode="rb")
        self._name = name

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._gz.readinto(buffer)
        except (OSError, EOFError, zlib.error) as exc:
            raise DoctorError(f"{self._name}: a gzip file that cannot be read to its end ({exc}); "
                              "decompress what is left with `zcat -f` and give that") from None


# UTF-16 with no byte-order mark: at least this share of NULs, nearly all on one side of each code unit.
UTF16_NUL_SHARE = 0.4
UTF16_NUL_SIDE = 0.95


_TEXT_BYTES = frozenset(b"\t\n\r" + bytes(range(0x20, 0x7F)))


def _utf16_without_bom(head: bytes) -> str | None:
    """"utf-16-le" or "utf-16-be" when ``head`` reads as BOM-less UTF-16 text, else None: mostly ASCII, so every
    other byte is a NUL, always the same one of the two, and the other bytes are nearly all printable ASCII. A
    binary file's NULs fall on both sides, or beside bytes that are no text (``\\x00\\xff`` repeated)."""
    if len(head) < 64 or head.count(0) < UTF16_NUL_SHARE * len(head):
        return None
    odd, even = head[1::2], head[0::2]
    for nuls, other, encoding in ((odd, even, "utf-16-le"), (even, odd, "utf-16-be")):
        if (nuls.count(0) >= UTF16_NUL_SIDE * len(nuls) and other.count(0) == 0
                and sum(b in _TEXT_BYTES for b in other) >= UTF16_NUL_SIDE * len(other)):
            return encoding
    return None


def _sniffed(stream: IO[bytes], name: str = "<input>") -> IO[bytes]:
    """The stream as UTF-8-compatible bytes: a gzip'd one is decompressed, a UTF-16 one transcoded.

    UTF-16 is recognised by its byte-order mark and NULs in at least a quarter of the next bytes (log text
    is mostly ASCII, whose UTF-16 high bytes are NUL): a UTF-8 log that merely starts with the bytes FF FE
    (garbage) is not taken for one; without a mark, by NULs on one side of every code unit and none on the
    other (``_utf16_without_bom``). Gzip by its magic bytes (RFC 1952) and a header gzip reads.
    """
    head = _read_up_to(stream, 4096)
    rest = cast(IO[bytes], _Prefixed(head, stream))
    if head[:3] == b"\x1f\x8b\x08":  # gzip's magic and its one compression method, deflate
        return _sniffed(cast(IO[bytes], io.BufferedReader(_Gunzipped(rest, name))), name)
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) and head[2:].count(0) * 4 >= len(head) - 2:
        return cast(IO[bytes], _Utf16AsUtf8(rest))
    encoding = _utf16_without_bom(head)
    if encoding is not None:
        return cast(IO[bytes], _Utf16AsUtf8(rest, encoding))
    return rest


def explain_streams(streams: Iterable[tuple[str, IO[bytes], int | None]],
                    kb: list[Signature] | None = None) -> ExplainResult:
    """Scan (name, binary stream, rank-or-None) inputs in order and return the ordered diagnoses.

    An input named ``*.json`` that is a torchrun worker error file is read as the traceback it holds; a
    UTF-16 input with a byte-order mark is read as text.
    """
    scanner = Scanner(kb)
    for name, stream, rank in streams:
        stream = _sniffed(stream, name)
        if name.endswith(".json"):
            head = _read_up_to(stream, MAX_ERROR_FILE_BYTES + 1)
            text = error_file_text(head) if len(head) <= MAX_ERROR_FILE_BYTES else None
            stream = io.BytesIO(text.encode("utf-8")) if text is not None else cast(IO[bytes], _Prefixed(head, stream))
        scanner.scan(name, stream, rank)
    return scanner.result()


def explain_text(text: str | bytes, name: str = "<text>", file_rank: int | None = None) -> ExplainResult:
    """Convenience for tests and the Python API: explain an in-memory log."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return explain_streams([(name, io.BytesIO(data), file_rank)])
