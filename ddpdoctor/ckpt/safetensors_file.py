"""The safetensors format: validate its header, and rewrite it with renamed keys.

A ``.safetensors`` file is an 8-byte little-endian header length N, N bytes of JSON
(``{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, offsets relative
to the end of the header), then the raw bytes (https://github.com/huggingface/safetensors#format). Renaming
keys only rewrites the JSON; the data block is copied as is by the kernel. The header is padded with
spaces (as the reference writer pads it to a multiple of 8) so the data block keeps its offset modulo the
page size, and tensors stay aligned.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ddpdoctor.ckpt.filecopy import copy_range
from ddpdoctor.errors import DoctorError
from ddpdoctor.safejson import UntrustedJSONError, loads_untrusted

# The reference implementation refuses headers above 100 MB (safetensors/src/tensor.rs MAX_HEADER_SIZE).
MAX_HEADER = 100_000_000

DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

# safetensors dtype -> torch dtype name, for reports that mix formats.
TORCH_DTYPE = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
               "F8_E4M3": "float8_e4m3fn", "I16": "int16", "U16": "uint16", "F16": "float16",
               "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
               "U64": "uint64", "F64": "float64"}


@dataclass
class SafeTensors:
    """A parsed safetensors header: tensor entries in file order, metadata, where the data starts."""

    path: Path
    tensors: dict[str, dict[str, Any]]
    metadata: dict[str, str] | None
    data_start: int
    data_size: int


def looks_like_safetensors(head: bytes, *, named: bool = False) -> bool:
    """8-byte length then '{': the only thing that starts a safetensors file. Unless the file is ``named`` so
    (``*.safetensors``: then a damaged one is said to be damaged), the length must also be one a safetensors writer
    can produce (at most :data:`MAX_HEADER`): one byte in 256 of any file is a '{', and random bytes with a '{' in
    the ninth place read as "a corrupt safetensors header: header length 17490436423742058388" (a flaky test found
    it). A truncated safetensors file keeps its plausible length and is still read as one."""
    if len(head) < 9 or head[8:9] != b"{":
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return named or 2 <= n <= MAX_HEADER


def open_safetensors(path: Path) -> SafeTensors:
    """Parse and validate the header; DoctorError naming what is wrong with a damaged one."""
    size = path.stat().st_size
    bad = f"{path} has a corrupt safetensors header"
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise DoctorError(f"{bad}: the file is shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise DoctorError(f"{bad}: header length {n} does not fit in the {size}-byte file (truncated?)")
        raw = fh.read(n)
    try:
        # Infinity, a 5,000-digit number or JSON nested thousands deep: refused here, in one line.
        header = loads_untrusted(raw)
    except (UnicodeDecodeError, UntrustedJSONError) as exc:
        raise DoctorError(f"{bad}: the JSON header does not parse ({str(exc)[:200]})") from None
    if not isinstance(header, dict):
        raise DoctorError(f"{bad}: the JSON header is not an object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not isinstance(metadata, dict):
        raise DoctorError(f"{bad}: __metadata__ is not an object")
    data_size = size - 8 - n
    ranges: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        try:
            begin, end = (_count(x) for x in entry["data_offsets"])
            numel = 1
            for dim in entry["shape"]:
                numel *= _count(dim)
            expected = numel * DTYPE_SIZES[entry["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise DoctorError(f"{bad}: entry {name!r} lacks a valid dtype, shape or data_offsets") from None
        if not 0 <= begin <= end <= data_size or end - begin != expected:
            raise DoctorError(f"{bad}: entry {name!r} points outside the data block or has the wrong size "
                              "(truncated file?)")
        ranges.append((begin, end, name))
    _check_tiling(bad, ranges, data_size)
    return SafeTensors(path, header, metadata, 8 + n, data_size)


def _check_tiling(bad: str, ranges: list[tuple[int, int, str]], data_size: int) -> None:
    """The tensors' byte ranges, sorted by offset, must tile the data block: from 0, no overlap, no gap, to its end.

    The reference reader's rule (safetensors/src/tensor.rs: ``Metadata::validate`` sorts the entries by
    ``data_offsets`` and refuses any whose start is not the previous end, "invalid offset for tensor";
    ``read_metadata`` then refuses a data block longer than the tensors, "incomplete metadata, file not
    fully covered"). A header that breaks it loads nowhere, so it is corrupt here too: accepting it would
    let ``strip`` write a copy that ``safetensors.torch.load_file`` refuses.
    """
    at = 0
    for begin, end, name in sorted(ranges, key=lambda r: (r[0], r[1])):  # stable: ties keep header order
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves a gap of {begin - at} bytes before it"
            raise DoctorError(f"{bad}: entry {name!r} (data_offsets [{begin}, {end}]) {what}; "
                              "the reference reader refuses it (invalid offset)")
        at = end
    if at != data_size:
        raise DoctorError(f"{bad}: the tensors cover {at} of the {data_size} bytes after the header; the reference "
                          "reader refuses a data block the header does not fully describe")


def _count(value: Any) -> int:
    """A size or offset: a non-negative integer, as the reference reader (``usize``) requires."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{value!r} is not a size")
    return value


def rewrite(src: SafeTensors, out: BinaryIO, renamed: dict[str, str], *, start_writeback: bool = False) -> None:
    """Write ``src`` with keys renamed (``renamed`` maps old -> new), data copied unchanged."""
    header: dict[str, Any] = {}
    if src.metadata is not None:
        header["__metadata__"] = src.metadata
    for name, entry in src.tensors.items():
        header[renamed.get(name, name)] = entry
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if src.data_start % 8 == 0:
        # Spaces are valid JSON padding; keeping the data block's page offset lets the kernel copy
        # page-congruent ranges (about twice as fast as shifted ones) at the cost of < 4 KiB.
        raw += b" " * ((src.data_start - 8 - len(raw)) % 4096)
    else:
        raw += b" " * ((-len(raw)) % 8)
    out.write(struct.pack("<Q", len(raw)) + raw)
    with src.path.open("rb") as fin:
        copy_range(fin, out, src.data_start, src.data_size, start_writeback=start_writeback)
