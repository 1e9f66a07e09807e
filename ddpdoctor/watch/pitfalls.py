"""Training-loop pitfalls `ddpdoctor watch` notices by wrapping the objects that cause them.

Each one trains "fine" and is wrong or wasteful in a multi-rank job:

- a DataLoader without a DistributedSampler: every rank iterates the whole dataset in the same order,
  so N ranks train on the same batches (https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler);
- a shuffling DistributedSampler whose ``set_epoch`` is never called: "it is necessary to make shuffling
  work properly across multiple epochs. Otherwise, the same ordering will be always used" (its docstring);
- ``torch.save`` to one path from several ranks: concurrent writers corrupt or race the file;
- ``DistributedDataParallel(find_unused_parameters=True)`` while no parameter was unused: an extra
  autograd-graph traversal every iteration for nothing (the reducer's own warning, reducer.cpp).

The rank reports what it saw (with the line that created the object); the supervisor merges ranks.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ddpdoctor.watch.recorder import Recorder, user_site


class PitfallLog:
    """What the wrapped constructors saw in this rank."""

    def __init__(self) -> None:
        self.loaders: list[dict[str, Any]] = []
        self.samplers: list[dict[str, Any]] = []
        self.saves: dict[str, str] = {}
        # Strong references: the model usually dies with main() before the end-of-run summary reads it.
        self.ddps: list[tuple[str, Any]] = []

    def findings(self) -> list[dict[str, Any]]:
        """This rank's raw observations; ``merge`` turns them into warnings across ranks."""
        out: list[dict[str, Any]] = []
        for loader in self.loaders:
            if loader["iterated"] and not loader["distributed"]:
                out.append({"kind": "dataloader_without_distributed_sampler", "site": loader["site"],
                            "key": loader["site"]})
        for sampler in self.samplers:
            epochs = sampler["epochs"]
            if sampler["shuffle"] and len(epochs) >= 2 and len(set(epochs)) == 1:
                out.append({"kind": "sampler_epoch_never_set", "site": sampler["site"], "key": sampler["site"],
                            "epochs": len(epochs)})
        for path, site in self.saves.items():
            out.append({"kind": "torch_save", "site": site, "key": path})
        for site, ddp in self.ddps:
            try:
                data = ddp._get_ddp_logging_data()
            except Exception:  # private API: absent or changed in this torch version
                continue
            if data.get("iteration", 0) > 0 and data.get("unused_parameter_size", 1) == 0:
                out.append({"kind": "find_unused_parameters_unneeded", "site": site, "key": site})
        return out


def _is_distributed(sampler: Any) -> bool:
    """DistributedSampler, or any sampler that shards by replica (lightning, timm, custom ones)."""
    if sampler is None:
        return False
    return hasattr(sampler, "num_replicas") or "Distributed" in type(sampler).__name__


def install(recorder: Recorder) -> PitfallLog:
    """Wrap DataLoader, DistributedSampler, torch.save and DDP; returns the log they fill."""
    import torch
    import torch.utils.data as data
    from torch.nn.parallel import DistributedDataParallel as DDP

    log = PitfallLog()

    loader_init, loader_iter = data.DataLoader.__init__, data.DataLoader.__iter__

    @functools.wraps(loader_init)
    def dataloader_init(self: Any, *args: Any, **kwargs: Any) -> None:
        loader_init(self, *args, **kwargs)
        iterable = isinstance(self.dataset, data.IterableDataset)
        batch_sampler = getattr(self, "batch_sampler", None)
        inner = getattr(batch_sampler, "sampler", None)
        distributed = iterable or _is_distributed(self.sampler) or _is_distributed(inner) or _is_distributed(
            batch_sampler)
        info = {"site": user_site(), "distributed": distributed, "iterated": False}
        self._ddpdoctor_info = info
        log.loaders.append(info)

    @functools.wraps(loader_iter)
    def dataloader_iter(self: Any) -> Any:
        info = getattr(self, "_ddpdoctor_info", None)
        if info is not None:
            info["iterated"] = True
        return loader_iter(self)

    data.DataLoader.__init__ = dataloader_init  # type: ignore[method-assign]
    data.DataLoader.__iter__ = dataloader_iter  # type: ignore[method-assign]

    sampler_cls = data.distributed.DistributedSampler
    sampler_init, sampler_iter = sampler_cls.__init__, sampler_cls.__iter__

    @functools.wraps(sampler_init)
    def distributed_sampler_init(self: Any, *args: Any, **kwargs: Any) -> None:
        sampler_init(self, *args, **kwargs)
        info = {"site": user_site(), "shuffle": bool(getattr(self, "shuffle", False)), "epochs": []}
        self._ddpdoctor_info = info
        log.samplers.append(info)

    @functools.wraps(sampler_iter)
    def distributed_sampler_iter(self: Any) -> Any:
        info = getattr(self, "_ddpdoctor_info", None)
        if info is not None:
            info["epochs"].append(getattr(self, "epoch", 0))
        return sampler_iter(self)

    sampler_cls.__init__ = distributed_sampler_init  # type: ignore[method-assign]
    sampler_cls.__iter__ = distributed_sampler_iter  # type: ignore[method-assign]

    save = torch.save

    @functools.wraps(save)
    def watched_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, (str, os.PathLike)):
            log.saves.setdefault(os.path.abspath(os.fspath(f)), user_site())
        return save(obj, f, *args, **kwargs)

    torch.save = watched_save

    ddp_init = DDP.__init__

    @functools.wraps(ddp_init)
    def ddp_watched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        site = user_site()
        ddp_init(self, *args, **kwargs)
        recorder.uses_ddp = True
        if getattr(self, "find_unused_parameters", False):
            log.ddps.append((site, self))

    DDP.__init__ = ddp_watched_init  # type: ignore[method-assign]
    return log


MESSAGES = {
    "dataloader_without_distributed_sampler": (
        "DataLoader without a DistributedSampler in a {world}-rank job: every rank trains on the same data",
        "pass sampler=DistributedSampler(dataset) (and shuffle=False to the DataLoader)"),
    "sampler_epoch_never_set": (
        "DistributedSampler(shuffle=True) iterated for {epochs} epochs with the same epoch: every epoch has the "
        "same order", "call sampler.set_epoch(epoch) at the start of each epoch"),
    "torch_save": ("torch.save to the same path from several ranks: {key}",
                   "save from rank 0 only: if dist.get_rank() == 0: torch.save(...)"),
    "find_unused_parameters_unneeded": (
        "DistributedDataParallel(find_unused_parameters=True) but no parameter was ever unused: an extra "
        "autograd graph traversal every iteration", "drop find_unused_parameters=True"),
}


def merge(per_rank: dict[int, list[dict[str, Any]]], world_size: int) -> list[dict[str, Any]]:
    """One warning per (kind, site/path) with the ranks that hit it; rank-local facts become job facts."""
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for rank in sorted(per_rank):
        for item in per_rank[rank]:
            entry = grouped.setdefault((item["kind"], item["key"]), {**item, "ranks": []})
            entry["ranks"].append(rank)
    warnings = []
    for (kind, key), entry in grouped.items():
        # Both are about several ranks doing the same thing: one rank alone (a rank-0-only evaluation
        # loader, rank 0 saving) is how it should be.
        if kind in ("dataloader_without_distributed_sampler", "torch_save") and len(entry["ranks"]) < 2:
            continue
        summary, remedy = MESSAGES[kind]
        warnings.append({"kind": kind, "site": entry["site"], "ranks": entry["ranks"],
                         "summary": summary.format(world=world_size, epochs=entry.get("epochs", 0), key=key),
                         "remedy": remedy})
    return warnings
