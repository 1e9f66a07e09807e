"""The torch zip checkpoint format: list its records, and rewrite it with a new ``data.pkl``.

``torch.save`` (torch/serialization.py ``_save``, writer in caffe2/serialize/inline_container.cc, a
patched miniz) writes an uncompressed zip whose records all sit under one folder: ``<name>/data.pkl``
(the pickle), ``.format_version``, ``.storage_alignment``, ``byteorder``, ``data/<key>`` (one raw storage
each), ``version`` and ``.data/serialization_id``. Each record's payload starts on a boundary of the
storage alignment (64 bytes unless ``config.save.storage_alignment`` says otherwise; ``getPadding``: the
local header carries an ``FB`` extra field of ``Z`` padding) so ``torch.load(mmap=True)`` can map tensors
in place, and each non-empty record is followed by a data descriptor (flag bit 3).

:func:`rewrite` keeps that layout: records in their original order, every payload except ``data.pkl``
copied byte for byte by the kernel (CRCs reused from the source's central directory, so no tensor byte is
read by this process), and a zip64 end record as torch writes it. In a file torch wrote, everything after
``data.pkl`` is copied as one range (see :func:`_tail_shift`). The reader's offset arithmetic
(``_get_offset`` in ``torch.serialization._load``) therefore holds for the output too.
"""

from __future__ import annotations

import functools
import io
import itertools
import math
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ddpdoctor.ckpt.filecopy import copy_range
from ddpdoctor.errors import DoctorError

# Payload alignment when the checkpoint has no .storage_alignment record (torch's default, and before 2.6
# the only value): torch.utils.serialization.config.save.storage_alignment may set another.
_DEFAULT_ALIGN = 64
# Tensor payloads keep their source offset modulo the page size: the kernel copies page-congruent ranges
# about twice as fast as shifted ones (measured on ext4: 1 GiB in 0.3 s against 0.5-0.6 s), and renaming
# keys changes the length of data.pkl, before every tensor. Costs at most one header's padding per file.
_PAGE = 4096
_U32 = 0xFFFFFFFF
# The most padding one local header can carry: its extra field (zip64 part <= 28 bytes, 'FB' + length,
# padding) must fit the header's 16-bit extra length.
_MAX_PAD = 0xFFFF - 32
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")


@dataclass(frozen=True)
class Record:
    """One zip member: where its payload lies in the file, its CRC (from the central directory) and its flags."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    crc: int
    flags: int = 0


@dataclass(frozen=True)
class TorchZip:
    """The records of a torch zip checkpoint, in file order, and its archive folder name."""

    path: Path
    prefix: str
    records: list[Record]

    @functools.cached_property
    def alignment(self) -> int:
        """Where torch aligns payloads in this file: the ``.storage_alignment`` record, else 64."""
        if self.record(".storage_alignment") is None:
            return _DEFAULT_ALIGN
        text = self.read(".storage_alignment").decode("ascii", "replace").strip()
        if not text.isdigit() or int(text) <= 0:
            raise DoctorError(f"{self.path} is corrupt: its .storage_alignment record is {text[:20]!r}")
        return int(text)

    def record(self, short: str) -> Record | None:
        """The record ``<prefix>/<short>``, if present."""
        for rec in self.records:
            if rec.name == f"{self.prefix}/{short}":
                return rec
        return None

    def read(self, short: str) -> bytes:
        """A small record's bytes (the pickle, version strings); never used for tensor data."""
        rec = self.record(short)
        if rec is None:
            raise DoctorError(f"{self.path}: record {short} is missing from the checkpoint zip")
        with self.path.open("rb") as fh:
            fh.seek(rec.data_offset)
            data = fh.read(rec.size)
        if len(data) != rec.size:
            raise DoctorError(f"{self.path} is truncated: record {rec.name} ends past the end of the file")
        # torch.utils.serialization.config.save.compute_crc32 = False writes 0 for every record.
        if rec.crc != 0 and zlib.crc32(data) != rec.crc:
            raise DoctorError(f"{self.path} is corrupt: record {rec.name} fails its CRC check")
        return data


class _Window(io.RawIOBase):
    """``length`` bytes at ``offset`` of a file, seen as a whole file (a zip embedded in a DCP ``.distcp``)."""

    def __init__(self, fh: BinaryIO, offset: int, length: int) -> None:
        self._fh, self._offset, self._length, self._pos = fh, offset, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        left = max(0, self._length - self._pos)
        n = left if n is None or n < 0 else min(n, left)
        self._fh.seek(self._offset + self._pos)
        data = self._fh.read(n)
        self._pos += len(data)
        return data

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)


def open_zip(path: Path, offset: int = 0, length: int | None = None) -> TorchZip:
    """Parse the central directory; DoctorError for a damaged zip or a zip that is not a torch checkpoint.

    ``offset``/``length``: a zip stored inside a larger file (each tensor of a ``torch.distributed.checkpoint``
    ``.distcp`` file is one ``torch.save`` archive); record offsets are then offsets in ``path``.
    """
    file_size = path.stat().st_size
    where = str(path) if length is None else f"{path} (bytes {offset}-{offset + length})"
    if length is None:
        length = file_size - offset
    if offset + length > file_size:
        raise DoctorError(f"{where} is truncated: the file has only {file_size} bytes")
    try:
        raw = path.open("rb")
    except OSError as exc:  # unreadable is not damaged: say which, or the user replaces a good file
        raise DoctorError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        with raw, zipfile.ZipFile(_Window(raw, offset, length)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, struct.error,
            NotImplementedError, KeyError, IndexError) as exc:
        raise DoctorError(f"{where} is a damaged zip (truncated or corrupt: {exc}); "
                          "use another copy of the checkpoint") from None
    names = [i.filename for i in infos]
    if any(n.endswith("/constants.pkl") for n in names):
        raise DoctorError(f"{where} is a TorchScript archive (torch.jit.save), not a state_dict checkpoint; "
                          "load it with torch.jit.load")
    pkl = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if not pkl:
        raise DoctorError(f"{where} is a zip file but not a PyTorch checkpoint (no <name>/data.pkl record)")
    prefix = pkl[0].split("/", 1)[0]
    records = []
    with path.open("rb") as fh:
        for info in sorted(infos, key=lambda i: i.header_offset):
            if info.compress_type != zipfile.ZIP_STORED:
                raise DoctorError(f"{where}: record {info.filename} is compressed; torch checkpoints are "
                                  "stored uncompressed (was the file re-zipped?) — re-save it with torch.save")
            if not 0 <= info.header_offset < length:
                raise DoctorError(f"{where} is corrupt: record {info.filename} starts outside the file")
            fh.seek(offset + info.header_offset)
            head = fh.read(_LOCAL.size)
            if len(head) != _LOCAL.size or head[:4] != b"PK\x03\x04":
                raise DoctorError(f"{where} is corrupt: bad local header for {info.filename}")
            fields = _LOCAL.unpack(head)
            data_offset = info.header_offset + _LOCAL.size + fields[9] + fields[10]
            if data_offset + info.file_size > length:
                raise DoctorError(f"{where} is truncated: record {info.filename} ends past the end of the file")
            records.append(Record(info.filename, offset + info.header_offset, offset + data_offset,
                                  info.file_size, info.CRC, fields[2]))
    return TorchZip(path, prefix, records)


def _zip64_local_extra(size: int, cursor: int) -> bytes:
    """The zip64 extra field of a local header, or nothing when neither size nor offset needs it."""
    if size < _U32 and cursor < _U32:
        return b""
    body = b""
    if size >= _U32:
        # miniz writes the local header before the payload: compressed size 0 here, the real
        # value is in the data descriptor and the central directory.
        body += struct.pack("<QQ", size, 0)
    if cursor >= _U32:
        body += struct.pack("<Q", cursor)
    return struct.pack("<HH", 1, len(body)) + body


def _unpadded_payload_start(name: bytes, size: int, cursor: int) -> int:
    """Where the payload of a record whose header starts at ``cursor`` begins with zero padding."""
    return cursor + _LOCAL.size + len(name) + len(_zip64_local_extra(size, cursor)) + 4


def _local_header(name: bytes, size: int, cursor: int, data_at: int | None = None,
                  align: int = _DEFAULT_ALIGN) -> bytes:
    """A local header as PyTorch's miniz writes it, padded so the payload is ``align``-byte aligned.

    With ``data_at``, the padding puts the payload exactly there instead (at most ``_MAX_PAD`` further).
    """
    zip64 = _zip64_local_extra(size, cursor)
    # caffe2/serialize/inline_container.cc getPadding: 'FB' + u16 length + 'Z' * padding.
    start = _unpadded_payload_start(name, size, cursor)
    pad = (-start) % align if data_at is None else data_at - start
    if not 0 <= pad <= _MAX_PAD:
        raise DoctorError(f"cannot place record {name.decode('utf-8', 'replace')} at offset {start + pad} "
                          f"(storage alignment {align}): a zip header pads at most {_MAX_PAD} bytes")
    extra = zip64 + b"FB" + struct.pack("<H", pad) + b"Z" * pad
    flags = 0x0808 if size > 0 else 0x0800
    # CRC and sizes live in the data descriptor and the central directory; torch leaves them 0 here,
    # zip64 records included.
    return _LOCAL.pack(b"PK\x03\x04", 0, flags, 0, 0, 0, 0, 0, 0, len(name), len(extra)) + name + extra


def _descriptor(crc: int, size: int, cursor: int) -> bytes:
    """The data descriptor after a non-empty payload (zip64-sized when torch's reader expects it)."""
    if size == 0:
        return b""
    if size >= _U32 or cursor >= _U32:
        return struct.pack("<4sIQQ", b"PK\x07\x08", crc, size, size)
    return struct.pack("<4sIII", b"PK\x07\x08", crc, size, size)


def _central_entry(name: bytes, crc: int, size: int, offset: int) -> bytes:
    body = b""
    if size >= _U32:
        body += struct.pack("<QQ", size, size)
    if offset >= _U32:
        body += struct.pack("<Q", offset)
    extra = struct.pack("<HH", 1, len(body)) + body if body else b""
    flags = 0x0808 if size > 0 else 0x0800
    small_size = _U32 if size >= _U32 else size
    small_off = _U32 if offset >= _U32 else offset
    return _CENTRAL.pack(b"PK\x01\x02", 0, 0, flags, 0, 0, 0, crc, small_size, small_size,
                         len(name), len(extra), 0, 0, 0, 0, small_off) + name + extra


def _end_records(count: int, cd_offset: int, cd_size: int) -> bytes:
    """zip64 end record + locator + classic end record, as torch always writes them."""
    eocd64_offset = cd_offset + cd_size
    eocd64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 0x031E, 45, 0, 0, count, count, cd_size, cd_offset)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, eocd64_offset, 1)
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
                       min(cd_size, _U32), min(cd_offset, _U32), 0)
    return eocd64 + locator + eocd


def _record_end(rec: Record) -> int:
    """Where the record after ``rec`` starts in a torch-written zip: payload, then data descriptor."""
    return rec.data_offset + rec.size + len(_descriptor(rec.crc, rec.size, rec.header_offset))


def _tail_shift(src: TorchZip, new_pickle: bytes) -> int | None:
    """How far everything after ``data.pkl`` moves if it is copied as one range, or None if it cannot be.

    torch writes ``data.pkl`` first and every record after it back to back. The new pickle's length
    differs from the old one's, and the padding field of the next record's header (up to 64 KiB) absorbs
    the difference: the rest of the file then keeps its offsets (shift 0) and is copied byte for byte,
    local headers and descriptors included, in one page-aligned kernel copy (as fast as ``cp``; per-record
    copies at the same offsets measured 30-40% slower). When the padding cannot absorb it, the rest moves by
    whole pages (and whole multiples of the file's storage alignment, which torch's offset arithmetic
    relies on), as long as no offset in it needs zip64 fields (whose bytes hold the offset itself). None
    for any other layout: the caller then rewrites record by record.
    """
    recs = src.records
    if len(recs) < 2 or recs[0].name != f"{src.prefix}/data.pkl" or recs[0].header_offset != 0:
        return None
    for rec, nxt in itertools.pairwise(recs):
        if _record_end(rec) != nxt.header_offset:
            return None
    if any(rec.flags & 0x08 != (0x08 if rec.size > 0 else 0) for rec in recs):
        return None  # no data descriptors (not written by torch): the byte-copied headers would disagree
    first = recs[1]
    pkl_end = len(_local_header(recs[0].name.encode("utf-8"), len(new_pickle), 0, align=src.alignment)) + \
        len(new_pickle) + len(_descriptor(zlib.crc32(new_pickle), len(new_pickle), 0))
    start = _unpadded_payload_start(first.name.encode("utf-8"), first.size, pkl_end)
    pad = first.data_offset - start
    if 0 <= pad <= _MAX_PAD:
        return 0
    step = math.lcm(_PAGE, src.alignment)
    shift = -(pad // step) * step  # the padding becomes pad % step
    if pad % step > _MAX_PAD or _record_end(recs[-1]) + max(shift, 0) >= _U32:
        return None
    return shift


def rewrite(src: TorchZip, out: BinaryIO, new_pickle: bytes, *, start_writeback: bool = False) -> None:
    """Write ``src`` to ``out`` with ``data.pkl`` replaced by ``new_pickle``; tensors copied by the kernel.

    ``start_writeback``: push copied data to disk as the copy goes (for an output that will be fsynced).
    """
    with src.path.open("rb") as fin:
        if hasattr(os, "posix_fadvise"):
            # Same hint `cp` gives the kernel: read-ahead aggressively, the file is read once front to back.
            os.posix_fadvise(fin.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        shift = _tail_shift(src, new_pickle)
        if shift is None:
            _rewrite_by_record(src, fin, out, new_pickle, start_writeback)
        else:
            _rewrite_with_tail(src, fin, out, new_pickle, shift, start_writeback)


def _rewrite_with_tail(src: TorchZip, fin: BinaryIO, out: BinaryIO, new_pickle: bytes, shift: int,
                       start_writeback: bool) -> None:
    """New ``data.pkl`` record, then the rest of the source copied as one range, moved by ``shift``."""
    pkl, first, recs = src.records[0], src.records[1], src.records
    crc = zlib.crc32(new_pickle)
    out.write(_local_header(pkl.name.encode("utf-8"), len(new_pickle), 0, align=src.alignment))
    out.write(new_pickle)
    out.write(_descriptor(crc, len(new_pickle), 0))
    first_name, first_header_at = first.name.encode("utf-8"), out.tell()
    out.write(_local_header(first_name, first.size, first_header_at, data_at=first.data_offset + shift))
    tail_start, tail_end = first.data_offset, _record_end(recs[-1])
    copy_range(fin, out, tail_start, tail_end - tail_start, start_writeback=start_writeback)
    central = [_central_entry(pkl.name.encode("utf-8"), crc, len(new_pickle), 0),
               _central_entry(first_name, first.crc, first.size, first_header_at)]
    central += [_central_entry(rec.name.encode("utf-8"), rec.crc, rec.size, rec.header_offset + shift)
                for rec in recs[2:]]
    _write_central_directory(out, central, tail_end + shift)


def _rewrite_by_record(src: TorchZip, fin: BinaryIO, out: BinaryIO, new_pickle: bytes,
                       start_writeback: bool) -> None:
    """Any other record order: every record rewritten in torch's layout, payloads copied one by one."""
    pkl_name = f"{src.prefix}/data.pkl"
    align = src.alignment
    step = math.lcm(_PAGE, align)
    central: list[bytes] = []
    cursor = 0
    realign = False
    for rec in src.records:
        name = rec.name.encode("utf-8")
        if rec.name == pkl_name:
            payload: bytes | None = new_pickle
            size, crc = len(new_pickle), zlib.crc32(new_pickle)
        else:
            payload, size, crc = None, rec.size, rec.crc
        data_at = None
        if realign and payload is None and rec.data_offset % align == 0:
            # Only the first record after data.pkl is padded further, so its payload keeps its source
            # offset within a page; the records after it then get torch's own padding and stay
            # page-congruent. torch reads a payload's offset from its local header (getRecordOffset in
            # inline_container.cc), and computes the later ones from the one before with miniz's padding
            # rule (_get_offset in torch.serialization._load, used for map_location="meta"), which this
            # keeps true.
            start = _unpadded_payload_start(name, size, cursor)
            if (rec.data_offset - start) % step <= _MAX_PAD:
                data_at = start + (rec.data_offset - start) % step
            realign = False
        if payload is not None:
            realign = True
        header = _local_header(name, size, cursor, data_at, align)
        out.write(header)
        if payload is not None:
            out.write(payload)
        else:
            copy_range(fin, out, rec.data_offset, size, start_writeback=start_writeback)
        out.write(_descriptor(crc, size, cursor))
        central.append(_central_entry(name, crc, size, cursor))
        cursor += len(header) + size + len(_descriptor(crc, size, cursor))
    _write_central_directory(out, central, cursor)


def _write_central_directory(out: BinaryIO, central: list[bytes], cd_offset: int) -> None:
    cd = b"".join(central)
    out.write(cd)
    out.write(_end_records(len(central), cd_offset, len(cd)))


@dataclass(frozen=True)
class Piece:
    """Bytes for a new archive's record: in memory (``data``), or ``size`` bytes at ``offset`` in ``path``.

    ``crc`` is the CRC-32 of a file range when its source already recorded it (then no byte of it is read
    here); None makes :func:`write_archive` compute it while copying.
    """

    data: bytes | None = None
    path: Path | None = None
    offset: int = 0
    size: int = 0
    crc: int | None = None

    @property
    def length(self) -> int:
        return len(self.data) if self.data is not None else self.size


def _crc_of_range(path: Path, offset: int, size: int, crc: int = 0) -> int:
    with path.open("rb") as fh:
        fh.seek(offset)
        left = size
        while left:
            chunk = fh.read(min(left, 8 << 20))
            if not chunk:
                raise DoctorError(f"{path} ended early: it is truncated")
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
    return crc


def write_archive(out: BinaryIO, prefix: str, records: list[tuple[str, Piece | list[Piece]]],
                  align: int = _DEFAULT_ALIGN) -> None:
    """Write a new torch zip (``prefix/name`` records in the given order) as ``torch.save`` lays it out.

    Every payload starts on an ``align`` boundary, each non-empty one is followed by a data descriptor,
    and the end is a zip64 end record, so the file loads with ``torch.load(weights_only=True)`` and
    ``mmap=True``. File ranges are copied by the kernel. A record given as several pieces is their
    concatenation (a tensor assembled from DCP chunks); its CRC is computed over the pieces in turn.
    """
    central: list[bytes] = []
    cursor = 0
    handles: dict[Path, BinaryIO] = {}
    try:
        for short, given in records:
            pieces = given if isinstance(given, list) else [given]
            name = f"{prefix}/{short}".encode()
            size = sum(piece.length for piece in pieces)
            if len(pieces) == 1 and pieces[0].crc is not None:
                crc = pieces[0].crc
            else:
                crc = 0
                for piece in pieces:
                    if piece.data is not None:
                        crc = zlib.crc32(piece.data, crc)
                    else:
                        assert piece.path is not None
                        crc = _crc_of_range(piece.path, piece.offset, piece.size, crc)
            header = _local_header(name, size, cursor, None, align)
            out.write(header)
            for piece in pieces:
                if piece.data is not None:
                    out.write(piece.data)
                else:
                    assert piece.path is not None
                    if piece.path not in handles:
                        handles[piece.path] = piece.path.open("rb")
                    copy_range(handles[piece.path], out, piece.offset, piece.size)
            descriptor = _descriptor(crc, size, cursor)
            out.write(descriptor)
            central.append(_central_entry(name, crc, size, cursor))
            cursor += len(header) + size + len(descriptor)
        _write_central_directory(out, central, cursor)
    finally:
        for fh in handles.values():
            fh.close()
