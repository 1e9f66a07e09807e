"""The zip writer reproduces torch.save's layout byte for byte, zip64 records included.

torch.save under ``torch.serialization.skip_data()`` writes every header but seeks over tensor bytes, so a
>4 GiB checkpoint costs a few KB of disk (a sparse file): its headers are the reference for ours.
"""

from __future__ import annotations

import contextlib
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ddpdoctor.ckpt import open_checkpoint, strip_file, unpickler, zip_rewrite
from ddpdoctor.ckpt.locate import mapping_pairs
from ddpdoctor.ckpt.prefixes import rename_node
from tests.support import load_checking_offsets


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.pt"
    # torch.empty does not touch its pages: 4 GiB of address space, no RAM.
    sd = {"module.huge": torch.empty(2**30 + 16, dtype=torch.float32), "module.after": torch.empty(100),
          "module.empty": torch.empty(0)}
    with torch.serialization.skip_data():
        torch.save(sd, path)
    assert path.stat().st_size > 2**32
    if path.stat().st_blocks * 512 > 2**30:
        pytest.skip("this filesystem does not keep the file sparse")
    return path


def _raw(path: Path, offset: int, size: int) -> bytes:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read(size)


def test_local_headers_and_descriptors_match_torch(big: Path) -> None:
    zf = zip_rewrite.open_zip(big)
    assert any(r.size >= 2**32 for r in zf.records) and any(r.header_offset >= 2**32 for r in zf.records)
    for rec in zf.records:
        name = rec.name.encode()
        mine = zip_rewrite._local_header(name, rec.size, rec.header_offset)
        assert mine == _raw(big, rec.header_offset, len(mine)), rec.name
        assert rec.header_offset + len(mine) == rec.data_offset and rec.data_offset % 64 == 0
        desc = zip_rewrite._descriptor(rec.crc, rec.size, rec.header_offset)
        assert desc == _raw(big, rec.data_offset + rec.size, len(desc)), rec.name


def test_central_directory_and_end_records_match_torch(big: Path) -> None:
    zf = zip_rewrite.open_zip(big)
    with zipfile.ZipFile(big) as z:
        infos = sorted(z.infolist(), key=lambda i: i.header_offset)
    size = big.stat().st_size
    tail = _raw(big, size - 22, 22)
    (_, _, _, _, count, cd_size, cd_offset_small, _) = struct.unpack("<4sHHHHIIH", tail)
    locator = _raw(big, size - 22 - 20, 20)
    eocd64 = _raw(big, struct.unpack("<4sIQI", locator)[2], 56)
    cd_offset = struct.unpack("<4sQHHIIQQQQ", eocd64)[9]
    central = b"".join(zip_rewrite._central_entry(r.name.encode(), r.crc, r.size, r.header_offset)
                       for r in zf.records)
    assert len(infos) == count == len(zf.records)
    assert central == _raw(big, cd_offset, cd_size)
    ends = zip_rewrite._end_records(count, cd_offset, cd_size)
    assert ends == _raw(big, cd_offset + cd_size, len(ends))
    assert cd_offset_small == min(cd_offset, 0xFFFFFFFF)


def test_rewrite_with_the_same_pickle_reproduces_the_file_byte_for_byte(tmp_path: Path) -> None:
    src = tmp_path / "ckpt.pt"
    torch.save({"module.w": torch.randn(100, 3), "module.e": torch.empty(0), "epoch": 2,
                "module.b": torch.ones(7, dtype=torch.bfloat16)}, src)
    zf = zip_rewrite.open_zip(src)
    out = tmp_path / "out.pt"
    with out.open("w+b") as fh:
        zip_rewrite.rewrite(zf, fh, zf.read("data.pkl"))
    assert out.read_bytes() == src.read_bytes()


@pytest.mark.parametrize("broken", ["copy_file_range", "copy_file_range+sendfile"])
def test_copy_falls_back_when_the_kernel_copy_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         broken: str) -> None:
    """Old kernels, FUSE or cross-device copies refuse copy_file_range (EXDEV, EOPNOTSUPP...)."""
    import errno
    import os

    from ddpdoctor.ckpt import filecopy

    def refuser(code: int) -> object:
        def refuse(*_args: object) -> int:
            raise OSError(code, os.strerror(code))
        return refuse

    monkeypatch.setattr(os, "copy_file_range", refuser(errno.EXDEV))
    if "sendfile" in broken:
        monkeypatch.setattr(os, "sendfile", refuser(errno.EINVAL))
    src = tmp_path / "src.bin"
    payload = os.urandom(3 * (1 << 20) + 123)
    src.write_bytes(payload)
    out = tmp_path / "out.bin"
    with src.open("rb") as fin, out.open("w+b") as fout:
        fout.write(b"head")
        filecopy.copy_range(fin, fout, 10, len(payload) - 10)
        fout.write(b"tail")
    assert out.read_bytes() == b"head" + payload[10:] + b"tail"


# ------------------------------------------------------------------------ strip's layout: copy the rest whole


def _state_dict(prefix: str, keys: int) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((f"{prefix}layer{i}.weight", torch.full((1000 + i,), float(i))) for i in range(keys))


def _data_offsets(path: Path) -> dict[str, int]:
    """Payload offset of every record but data.pkl, by its name inside the archive folder."""
    return {r.name.split("/", 1)[1]: r.data_offset for r in zip_rewrite.open_zip(path).records
            if not r.name.endswith("/data.pkl")}


def _load_checked(path: Path) -> dict[str, torch.Tensor]:
    """Load a flat state_dict with torch's offset arithmetic asserted, and check every CRC."""
    loaded, meta = load_checking_offsets(path)
    assert {k: v.shape for k, v in meta.items()} == {k: v.shape for k, v in loaded.items()}
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None  # every CRC matches
    return dict(loaded)


def test_strip_leaves_every_record_after_data_pkl_where_it_was(tmp_path: Path) -> None:
    """The shorter pickle is absorbed by padding: tensors keep their offsets, copied as one range."""
    src, out = tmp_path / "ddp.pt", tmp_path / "out.pt"
    torch.save(_state_dict("module.", 20), src)
    strip_file(src, out)
    assert _data_offsets(out) == _data_offsets(src)
    loaded = _load_checked(out)
    assert list(loaded) == [f"layer{i}.weight" for i in range(20)]
    assert all(torch.equal(loaded[f"layer{i}.weight"], torch.full((1000 + i,), float(i))) for i in range(20))


def test_a_longer_pickle_moves_the_rest_by_whole_pages(tmp_path: Path) -> None:
    """More than 64 KiB longer (keys renamed to longer ones): everything after data.pkl moves by pages."""
    src, out = tmp_path / "plain.pt", tmp_path / "out.pt"
    torch.save(_state_dict("", 40), src)
    opened = open_checkpoint(src, for_rewrite=True)
    longer = "wrapper" * 300 + "."
    rename_node(opened.root, {k: longer + k for k, _ in mapping_pairs(opened.root) or []}, (), longer)
    new_pickle = unpickler.dumps(opened.root)
    assert len(new_pickle) > len(zip_rewrite.open_zip(src).read("data.pkl")) + 0xFFFF
    assert opened.zip is not None
    with out.open("w+b") as fh:
        zip_rewrite.rewrite(opened.zip, fh, new_pickle)
    before, after = _data_offsets(src), _data_offsets(out)
    shifts = {after[name] - before[name] for name in before if name != ".format_version"}
    assert len(shifts) == 1 and next(iter(shifts)) > 0 and next(iter(shifts)) % 4096 == 0
    loaded = _load_checked(out)
    assert list(loaded) == [f"{longer}layer{i}.weight" for i in range(40)]
    assert torch.equal(loaded[f"{longer}layer39.weight"], torch.full((1039,), 39.0))


def test_stripping_a_long_prefix_moves_the_rest_back_by_whole_pages(tmp_path: Path) -> None:
    src, out = tmp_path / "long.pt", tmp_path / "out.pt"
    prefix = "p" * 1000 + "."
    torch.save(_state_dict(prefix, 100), src)
    strip_file(src, out, prefixes=[prefix])
    before, after = _data_offsets(src), _data_offsets(out)
    shifts = {after[name] - before[name] for name in before if name != ".format_version"}
    assert len(shifts) == 1 and next(iter(shifts)) < 0 and next(iter(shifts)) % 4096 == 0
    loaded = _load_checked(out)
    assert list(loaded) == [f"layer{i}.weight" for i in range(100)]
    assert out.stat().st_size < src.stat().st_size - 90_000


def test_a_zip_not_laid_out_by_torch_is_rewritten_record_by_record(tmp_path: Path) -> None:
    """Re-zipped with Python's zipfile (no data descriptors, no alignment): torch's layout comes back."""
    src, rezipped, out = tmp_path / "ddp.pt", tmp_path / "rezipped.pt", tmp_path / "out.pt"
    torch.save(_state_dict("module.", 5), src)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(rezipped, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    strip_file(rezipped, out)
    assert zip_rewrite._tail_shift(zip_rewrite.open_zip(rezipped), b"") is None
    assert any(offset % 64 for offset in _data_offsets(rezipped).values())
    assert all(offset % 64 == 0 for offset in _data_offsets(out).values())
    loaded = _load_checked(out)
    assert list(loaded) == [f"layer{i}.weight" for i in range(5)]
    assert torch.equal(loaded["layer4.weight"], torch.full((1004,), 4.0))


def test_the_largest_padding_a_header_can_carry_still_loads(tmp_path: Path) -> None:
    """At the edge: a pickle exactly short enough for the most padding stays in place; one byte less moves."""
    src, out = tmp_path / "long.pt", tmp_path / "out.pt"
    torch.save(_state_dict("q" * 1000 + ".", 100), src)
    opened = open_checkpoint(src, for_rewrite=True)
    assert opened.zip is not None
    zf = opened.zip
    rename_node(opened.root, {k: k[1001:] for k, _ in mapping_pairs(opened.root) or []}, (), "")
    stripped = unpickler.dumps(opened.root)
    assert zip_rewrite._tail_shift(zf, stripped) != 0  # ~100 KB shorter: more than any header can pad

    def shift_for(length: int) -> int | None:
        return zip_rewrite._tail_shift(zf, b"\0" * length)

    shortest = next(n for n in range(len(stripped), len(stripped) + 0x20000, 8) if shift_for(n) == 0)
    while shift_for(shortest - 1) == 0:
        shortest -= 1
    assert shift_for(shortest - 1) not in (0, None)
    # The pickle ends at its STOP opcode; torch's unpickler ignores the filler after it.
    with out.open("w+b") as fh:
        zip_rewrite.rewrite(zf, fh, stripped + b"\0" * (shortest - len(stripped)))
    assert _data_offsets(out) == _data_offsets(src)
    loaded = _load_checked(out)
    assert list(loaded) == [f"layer{i}.weight" for i in range(100)]


@contextlib.contextmanager
def _save_config(**settings: object) -> Iterator[None]:
    """torch.utils.serialization.config.save settings for one torch.save (documented since torch 2.6)."""
    from torch.utils.serialization import config

    old = {name: getattr(config.save, name) for name in settings}
    for name, value in settings.items():
        setattr(config.save, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(config.save, name, value)


@pytest.mark.parametrize(("alignment", "prefix"), [(65536, "module."), (8192, "p" * 1000 + ".")])
def test_a_custom_storage_alignment_survives_strip(tmp_path: Path, alignment: int, prefix: str) -> None:
    """torch computes later offsets from .storage_alignment: moving by pages alone would read wrong bytes."""
    src, out = tmp_path / "aligned.pt", tmp_path / "out.pt"
    with _save_config(storage_alignment=alignment):
        torch.save(_state_dict(prefix, 100), src)
    assert zip_rewrite.open_zip(src).alignment == alignment
    strip_file(src, out, prefixes=[prefix])
    offsets = _data_offsets(out)
    assert all(offsets[name] % alignment == 0 for name in offsets if name.startswith("data/"))
    loaded = _load_checked(out)
    assert all(torch.equal(loaded[f"layer{i}.weight"], torch.full((1000 + i,), float(i))) for i in range(100))


def test_record_by_record_keeps_the_storage_alignment(tmp_path: Path) -> None:
    src, rezipped, out = tmp_path / "aligned.pt", tmp_path / "rezipped.pt", tmp_path / "out.pt"
    with _save_config(storage_alignment=4096):
        torch.save(_state_dict("module.", 30), src)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(rezipped, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    strip_file(rezipped, out)
    assert all(offset % 4096 == 0 for offset in _data_offsets(out).values())
    loaded = _load_checked(out)
    assert torch.equal(loaded["layer29.weight"], torch.full((1029,), 29.0))


def test_a_checkpoint_saved_without_crcs_is_stripped(tmp_path: Path) -> None:
    """config.save.compute_crc32 = False writes CRC 0 everywhere; torch loads it, so must strip."""
    src, out = tmp_path / "nocrc.pt", tmp_path / "out.pt"
    with _save_config(compute_crc32=False):
        torch.save(_state_dict("module.", 3), src)
    assert {r.crc for r in zip_rewrite.open_zip(src).records} == {0}
    strip_file(src, out)
    loaded = torch.load(out, weights_only=True, mmap=True)
    assert list(loaded) == ["layer0.weight", "layer1.weight", "layer2.weight"]
    assert torch.equal(loaded["layer2.weight"], torch.full((1002,), 2.0))


def _kernel_copy_refused(src_dir: Path, dst_dir: Path) -> str | None:
    """The errno name when copy_file_range refuses to copy from ``src_dir`` to ``dst_dir``; None if it copies."""
    import errno
    import os

    probe_in, probe_out = src_dir / ".probe-in", dst_dir / ".probe-out"
    probe_in.write_bytes(b"x" * 4096)
    try:
        with probe_in.open("rb") as fin, probe_out.open("wb") as fout:
            os.copy_file_range(fin.fileno(), fout.fileno(), 4096)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    finally:
        probe_in.unlink()
        probe_out.unlink(missing_ok=True)
    return None


def test_strip_across_filesystems_where_the_kernel_copy_is_refused(tmp_path: Path) -> None:
    """A checkpoint on tmpfs stripped to a folder on another filesystem: Linux >= 5.19 refuses
    copy_file_range between filesystems of different types (EXDEV), so the copy falls back for real
    (no mock), and the output is still torch's layout with every tensor equal."""
    import os

    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm (tmpfs) here")
    if os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("the test's temp folder is on /dev/shm itself")
    src_dir = shm / f"ddpdoctor-test-{os.getpid()}"
    src_dir.mkdir()
    try:
        refused = _kernel_copy_refused(src_dir, tmp_path)
        if refused is None:
            pytest.skip("this kernel copies between tmpfs and the temp folder's filesystem: no fallback to test")
        src = src_dir / "ddp.pt"
        sd = _state_dict("module.", 40)
        torch.save({"model": sd}, src)
        out = tmp_path / "plain.pt"
        report = strip_file(src, out)
        assert report.renamed_keys == 40 and report.phases_s["copy"] >= 0
        loaded = torch.load(out, weights_only=True, mmap=True)["model"]
        assert list(loaded) == [k.removeprefix("module.") for k in sd]
        assert all(torch.equal(loaded[k.removeprefix("module.")], v) for k, v in sd.items())
        assert _data_offsets(out) == _data_offsets(src)  # the same layout as the kernel copy gives
    finally:
        for child in src_dir.iterdir():
            child.unlink()
        src_dir.rmdir()
