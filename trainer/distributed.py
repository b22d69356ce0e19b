"""Data-parallel training across W processes: the world (rank, size, device) and the strategies' registry.

A run is the same function of (seed, step) for any W: every worker trains on its disjoint rows of the
step's global batch (`trainer.batches.TrainBatches`), gradients are averaged across the workers by the
strategy's wrapper, and only rank 0 writes files and talks to the reporter. Checkpoints keep the
single-process format (rank 0 holds the whole model), so a run resumes on any W. The trainer never starts a
process group: Ray Train (`sweeps.trainable`) or a test does, and `current_world` reads it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hdrope.errors import UserError

__all__ = ["STRATEGIES", "World", "broadcast_from_main", "current_world", "main_first", "mean_across", "no_sync",
           "wrap_model"]


@dataclass(frozen=True)
class World:
    """This process's place among the workers of one run."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0  # index among the workers on this machine (picks the CUDA device)

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the only writer of files and the only caller of the reporter."""
        return self.rank == 0


def current_world() -> World:
    """The process group torch.distributed was initialised with, or a world of one."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def _ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel: a whole replica per worker, gradients all-reduced (averaged) in backward."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


# strategy name -> wrapper of a model whose gradients it averages across the world; the sweep spec's
# `resources.strategy` is checked against these keys.
STRATEGIES: dict[str, Callable[[nn.Module, torch.device], nn.Module]] = {"ddp": _ddp}


def wrap_model(model: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """The model wrapped for data-parallel training by `strategy` (a key of STRATEGIES)."""
    if strategy not in STRATEGIES:
        raise UserError(f"strategy={strategy!r} is not a data-parallel strategy; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[strategy](model, device)


def no_sync(wrapped: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce of a micro-batch that is not the step's last (when the wrapper allows it)."""
    if sync or not hasattr(wrapped, "no_sync"):
        return contextlib.nullcontext()
    return wrapped.no_sync()


def mean_across(value: float, world: World) -> float:
    """The mean of `value` over the world's workers (float64 all-reduce); the value itself in a world of one."""
    if world.size == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total.item()) / world.size


def broadcast_from_main(obj: Any, world: World) -> Any:
    """Rank 0's `obj` (picklable) on every worker."""
    if world.size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def main_first(world: World) -> Iterator[None]:
    """Rank 0 runs the block before the others (e.g. it fills a cache the others then read)."""
    if world.size > 1 and not world.main:
        dist.barrier()
    yield
    if world.size > 1 and world.main:
        dist.barrier()
