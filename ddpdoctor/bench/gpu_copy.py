"""One GPU's own bandwidths, as DCGM's PCIe diagnostic and STREAM-like tests measure them: host-to-device and
device-to-host copies from pinned memory, and a device-to-device copy (device memory read and written).

Timed with CUDA events around a loop of copies after a warmup, so only the copies count (no Python, no launch
gaps between them). Sizes are chosen to be far larger than any GPU's L2 (50 MB on H100) and small enough to
finish each figure in well under a second on any PCIe generation. torch is imported when measuring.
"""

from __future__ import annotations

from typing import Any

MIB = 1 << 20
# Host-device copies: 256 MiB per copy (5 ms at Gen5, 80 ms at Gen3 x4); device memory: up to 1 GiB.
HOST_DEVICE_BYTES = 256 * MIB
DEVICE_BYTES = 1024 * MIB
ITERS, WARMUP = 8, 2


def _timed(copy: Any, device: Any, iters: int, warmup: int) -> float:
    """Seconds per call of ``copy`` (CUDA events, after ``warmup`` untimed calls)."""
    import torch

    # The events and the copies on the same stream: the current one of ``device`` (a rank bound to cuda:3
    # whose current device were cuda:0 would otherwise time an idle stream).
    with torch.cuda.device(device):
        for _ in range(warmup):
            copy()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(iters):
            copy()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters


def host_device(device: Any, size: int = HOST_DEVICE_BYTES, iters: int = ITERS, warmup: int = WARMUP) -> dict[str, float]:
    """GB/s of host-to-device and device-to-host copies between pinned host memory and ``device``."""
    import torch

    h2d, d2h = _host_device_times(size, device, iters, warmup)
    torch.cuda.empty_cache()  # the buffers are gone: give their memory back to the job that follows
    return {"h2d_gbps": size / h2d / 1e9, "d2h_gbps": size / d2h / 1e9, "bytes": size}


def _host_device_times(size: int, device: Any, iters: int, warmup: int) -> tuple[float, float]:
    import torch

    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(size, dtype=torch.uint8, device=device)
    return (_timed(lambda: gpu.copy_(host, non_blocking=True), device, iters, warmup),
            _timed(lambda: host.copy_(gpu, non_blocking=True), device, iters, warmup))


def device_memory(device: Any, size: int = DEVICE_BYTES, iters: int = ITERS * 2,
                  warmup: int = WARMUP) -> dict[str, float]:
    """GB/s of a device-to-device copy, counting the bytes read and written (2 x size, as STREAM's Copy).

    The size is cut to a quarter of the free memory when the GPU is busy, so the check never makes the job
    run out of memory.
    """
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    size = max(64 * MIB, min(size, free // 4))
    seconds = _copy_time(size, device, iters, warmup)
    torch.cuda.empty_cache()
    return {"copy_gbps": 2 * size / seconds / 1e9, "bytes": size}


def _copy_time(size: int, device: Any, iters: int, warmup: int) -> float:
    import torch

    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return _timed(lambda: dst.copy_(src), device, iters, warmup)
