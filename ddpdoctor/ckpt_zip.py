"""The torch zip checkpoint format: list its records, and rewrite it with a new ``data.pkl``.

``torch.save`` (torch/serialization.py ``_save``, writer in caffe2/serialize/inline_container.cc, a
patched miniz) writes an uncompressed zip whose records all sit under one folder: ``<name>/data.pkl``
(the pickle), ``.format_version``, ``.storage_alignment``, ``byteorder``, ``data/<key>`` (one raw storage
each), ``version`` and ``.data/serialization_id``. Each record's payload starts on a 64-byte boundary
(``getPadding``: the local header carries an ``FB`` extra field of ``Z`` padding) so ``torch.load(mmap=True)``
can map tensors in place, and each non-empty record is followed by a data descriptor (flag bit 3).

:func:`rewrite` reproduces that layout exactly: records in their original order, every payload except
``data.pkl`` copied byte for byte by the kernel (CRCs reused from the source's central directory, so no
tensor byte is read by this process), and a zip64 end record as torch writes it. The reader's offset
arithmetic (``_get_offset`` in ``torch.serialization._load``) therefore holds for the output too.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ddpdoctor.ckpt_io import copy_range
from ddpdoctor.errors import DoctorError

_ALIGN = 64
# Tensor payloads keep their source offset modulo the page size: the kernel copies page-congruent ranges
# about twice as fast as shifted ones (measured on ext4: 1 GiB in 0.3 s against 0.5-0.6 s), and renaming
# keys always shifts everything after data.pkl by a few bytes. Costs at most one page of padding per file.
_PAGE = 4096
_U32 = 0xFFFFFFFF
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")


@dataclass(frozen=True)
class Record:
    """One zip member: where its payload lies in the file and its CRC (from the central directory)."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    crc: int


@dataclass(frozen=True)
class TorchZip:
    """The records of a torch zip checkpoint, in file order, and its archive folder name."""

    path: Path
    prefix: str
    records: list[Record]

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
        if zlib.crc32(data) != rec.crc:
            raise DoctorError(f"{self.path} is corrupt: record {rec.name} fails its CRC check")
        return data


def open_zip(path: Path) -> TorchZip:
    """Parse the central directory; DoctorError for a damaged zip or a zip that is not a torch checkpoint."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, struct.error,
            NotImplementedError, KeyError, IndexError) as exc:
        raise DoctorError(f"{path} is a damaged zip (truncated or corrupt: {exc}); "
                          "use another copy of the checkpoint") from None
    names = [i.filename for i in infos]
    if any(n.endswith("/constants.pkl") for n in names):
        raise DoctorError(f"{path} is a TorchScript archive (torch.jit.save), not a state_dict checkpoint; "
                          "load it with torch.jit.load")
    pkl = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if not pkl:
        raise DoctorError(f"{path} is a zip file but not a PyTorch checkpoint (no <name>/data.pkl record)")
    prefix = pkl[0].split("/", 1)[0]
    file_size = path.stat().st_size
    records = []
    with path.open("rb") as fh:
        for info in sorted(infos, key=lambda i: i.header_offset):
            if info.compress_type != zipfile.ZIP_STORED:
                raise DoctorError(f"{path}: record {info.filename} is compressed; torch checkpoints are "
                                  "stored uncompressed (was the file re-zipped?) — re-save it with torch.save")
            if not 0 <= info.header_offset < file_size:
                raise DoctorError(f"{path} is corrupt: record {info.filename} starts outside the file")
            fh.seek(info.header_offset)
            head = fh.read(_LOCAL.size)
            if len(head) != _LOCAL.size or head[:4] != b"PK\x03\x04":
                raise DoctorError(f"{path} is corrupt: bad local header for {info.filename}")
            fields = _LOCAL.unpack(head)
            data_offset = info.header_offset + _LOCAL.size + fields[9] + fields[10]
            if data_offset + info.file_size > file_size:
                raise DoctorError(f"{path} is truncated: record {info.filename} ends past the end of the file")
            records.append(Record(info.filename, info.header_offset, data_offset, info.file_size, info.CRC))
    return TorchZip(path, prefix, records)


def _local_header(name: bytes, size: int, cursor: int, residue: int | None = None) -> bytes:
    """A local header as PyTorch's miniz writes it, padded so the payload is 64-byte aligned.

    With ``residue`` (a multiple of 64), the payload starts at an offset equal to it modulo the page size.
    """
    big = size >= _U32 or cursor >= _U32
    zip64 = b""
    if big:
        body = b""
        if size >= _U32:
            # miniz writes the local header before the payload: compressed size 0 here, the real
            # value is in the data descriptor and the central directory.
            body += struct.pack("<QQ", size, 0)
        if cursor >= _U32:
            body += struct.pack("<Q", cursor)
        zip64 = struct.pack("<HH", 1, len(body)) + body
    # caffe2/serialize/inline_container.cc getPadding: 'FB' + u16 length + 'Z' * padding.
    start = cursor + _LOCAL.size + len(name) + len(zip64) + 4
    pad = (-start) % _ALIGN if residue is None else (residue - start) % _PAGE
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


def rewrite(src: TorchZip, out: BinaryIO, new_pickle: bytes) -> None:
    """Write ``src`` to ``out`` with ``data.pkl`` replaced by ``new_pickle``; tensors copied by the kernel."""
    pkl_name = f"{src.prefix}/data.pkl"
    central: list[bytes] = []
    cursor = 0
    realign = False
    with src.path.open("rb") as fin:
        if hasattr(os, "posix_fadvise"):
            # Same hint `cp` gives the kernel: read-ahead aggressively, the file is read once front to back.
            os.posix_fadvise(fin.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        for rec in src.records:
            name = rec.name.encode("utf-8")
            if rec.name == pkl_name:
                payload: bytes | None = new_pickle
                size, crc = len(new_pickle), zlib.crc32(new_pickle)
            else:
                payload, size, crc = None, rec.size, rec.crc
            residue = None
            if realign and payload is None and rec.data_offset % _ALIGN == 0:
                # Only the first record after data.pkl is padded further; the records after it then get
                # torch's own padding and stay page-congruent. torch reads a payload's offset from its
                # local header (getRecordOffset in inline_container.cc), and computes the later ones from
                # the one before with miniz's padding rule (_get_offset in torch.serialization._load,
                # used for map_location="meta"), which this keeps true.
                residue, realign = rec.data_offset % _PAGE, False
            if payload is not None:
                realign = True
            header = _local_header(name, size, cursor, residue)
            out.write(header)
            if payload is not None:
                out.write(payload)
            else:
                copy_range(fin, out, rec.data_offset, size)
            out.write(_descriptor(crc, size, cursor))
            central.append(_central_entry(name, crc, size, cursor))
            cursor += len(header) + size + len(_descriptor(crc, size, cursor))
    cd = b"".join(central)
    out.write(cd)
    out.write(_end_records(len(central), cursor, len(cd)))
