"""Data-parallel training across W processes: the world (rank, size, device) and the strategies' registry.

A run is the same function of (seed, step) for any W: every worker trains on its disjoint rows of the
step's global batch (`trainer.data.batches.TrainBatches`), gradients are averaged across the workers by the
strategy's wrapper, and only rank 0 writes files and talks to the reporter. Checkpoints keep the
single-process format, so a run resumes on any W. The training loop never starts a process group: Ray
Train (`sweeps.trainable`), `hdrope train` under torchrun (`join_torchrun_group`) or a test does, and
`current_world` reads it. torchrun's environment is checked first (WORLD_SIZE, RANK, MASTER_ADDR,
MASTER_PORT), and the rendezvous waits at most $HDROPE_RENDEZVOUS_TIMEOUT_S seconds (default 300) for the
other workers, then names what is missing instead of hanging.

Strategies: `ddp` wraps the model itself (a whole replica per worker: rank 0's model is the run's model).
`fsdp` (FSDP2, `torch.distributed.fsdp.fully_shard`) trains a sharded copy; the plain model and its
optimizer on rank 0 are then the run's evaluation and checkpoint copy, filled from the shards
(`gather_to_main`, a collective) before each evaluation and checkpoint, and the shards are filled from
them on resume (`load_from_main`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hdrope.errors import UserError

__all__ = ["RENDEZVOUS_TIMEOUT_ENV", "STRATEGIES", "Strategy", "TorchrunEnv", "World", "broadcast_from_main",
           "check_gpu_per_worker", "current_world", "gather_to_main", "join_torchrun_group", "load_from_main",
           "main_first", "mean_across", "no_sync", "rendezvous_timeout", "torchrun_env", "waiting_line",
           "wrap_model"]

RENDEZVOUS_TIMEOUT_ENV = "HDROPE_RENDEZVOUS_TIMEOUT_S"
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0
_UNSET = "run the workers with `torchrun --nproc-per-node N -m sweeps.console train …`, or unset WORLD_SIZE"


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


@dataclass(frozen=True)
class Strategy:
    """How W workers train one model: `wrap` returns the module the workers train; `shards` says whether it
    holds its own (sharded) copy of the parameters, so that rank 0's plain model must be gathered from it."""

    wrap: Callable[[nn.Module, torch.device], nn.Module]
    shards: bool = False


def _ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel: a whole replica per worker, gradients all-reduced (averaged) in backward."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def _fsdp(model: nn.Module, device: torch.device) -> nn.Module:
    """FSDP2 on a copy of the model: each transformer block (`model.layers`, when it has them) and the rest
    sharded over the workers; gradients reduce-scattered (averaged)."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    sharded = copy.deepcopy(model)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in getattr(sharded, "layers", []):
        fully_shard(block, mesh=mesh)
    return fully_shard(sharded, mesh=mesh)


# strategy name -> Strategy; the sweep spec's `resources.strategy` is checked against these keys.
STRATEGIES: dict[str, Strategy] = {"ddp": Strategy(_ddp), "fsdp": Strategy(_fsdp, shards=True)}


def wrap_model(model: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """The module the workers train for `model` under `strategy` (a key of STRATEGIES)."""
    if strategy not in STRATEGIES:
        raise UserError(f"strategy={strategy!r} is not a data-parallel strategy; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[strategy].wrap(model, device)


def _full(**kw: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def gather_to_main(trained: nn.Module, trained_opt: torch.optim.Optimizer | None, model: nn.Module,
                   optimizer: torch.optim.Optimizer | None, world: World) -> None:
    """Fill rank 0's plain `model` (and `optimizer`, when given) from the sharded module the workers train
    (and its optimizer). A collective: every worker calls it at the same step."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    weights = get_model_state_dict(trained, options=_full(cpu_offload=True))
    state = None
    if optimizer is not None and trained_opt is not None:
        state = get_optimizer_state_dict(trained, trained_opt, options=_full(cpu_offload=True))
    if world.main:
        model.load_state_dict(weights)
        if state is not None:
            set_optimizer_state_dict(model, optimizer, state, options=_full())


def load_from_main(trained: nn.Module, trained_opt: torch.optim.Optimizer, model: nn.Module,
                   optimizer: torch.optim.Optimizer) -> None:
    """Fill the sharded module and its optimizer from the plain `model` and `optimizer` every worker loaded
    (a resumed checkpoint)."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    set_model_state_dict(trained, model.state_dict(), options=_full())
    set_optimizer_state_dict(trained, trained_opt, get_optimizer_state_dict(model, optimizer, options=_full()),
                             options=_full())


def no_sync(wrapped: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce of a micro-batch that is not the step's last (when the wrapper allows it)."""
    if sync or not hasattr(wrapped, "no_sync"):
        return contextlib.nullcontext()
    return wrapped.no_sync()


def mean_across(value: torch.Tensor, world: World) -> torch.Tensor:
    """The mean of a scalar tensor over the world's workers, all-reduced where it lives (gloo on CPU, NCCL on
    CUDA; nothing is read back to the host); the value itself in a world of one."""
    if world.size == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total)
    return total / world.size


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


@dataclass(frozen=True)
class TorchrunEnv:
    """The worker torchrun's environment variables describe."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int


def _env_int(environ: Mapping[str, str], name: str, low: int, high: int, what: str) -> int:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        raise UserError(f"{name} is not set but WORLD_SIZE={environ['WORLD_SIZE']} is: every worker needs {what}; "
                        f"{_UNSET}")
    try:
        value = int(raw)
    except ValueError:  # int() of a str raises ValueError alone, for text that is no integer
        value = None
    if value is None or not low <= value <= high:
        raise UserError(f"{name}={raw!r}: must be {what}; {_UNSET}")
    return value


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """The worker described by torchrun's variables when WORLD_SIZE > 1, None for one process; UserError naming
    a variable that is missing or malformed."""
    environ = os.environ if environ is None else environ
    raw = environ.get("WORLD_SIZE", "").strip()
    if not raw:
        return None
    world = _env_int(environ, "WORLD_SIZE", 1, 1 << 20, "a positive integer, the number of workers")
    if world == 1:
        return None
    rank = _env_int(environ, "RANK", 0, world - 1, f"an integer in [0, {world - 1}], its rank")
    addr = environ.get("MASTER_ADDR", "").strip()
    if not addr:
        raise UserError(f"MASTER_ADDR is not set but WORLD_SIZE={world} is: the workers meet at MASTER_ADDR:"
                        f"MASTER_PORT; {_UNSET}")
    port = _env_int(environ, "MASTER_PORT", 1, 65535, "a port number in [1, 65535]")
    return TorchrunEnv(rank, world, addr, port)


def rendezvous_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds the workers wait for each other to join: $HDROPE_RENDEZVOUS_TIMEOUT_S, default 300."""
    environ = os.environ if environ is None else environ
    raw = environ.get(RENDEZVOUS_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_RENDEZVOUS_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:  # float() of a str raises ValueError alone, for text that is no number
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{RENDEZVOUS_TIMEOUT_ENV}={raw!r}: must be a positive number of seconds, e.g. 300")
    return value


def check_gpu_per_worker(environ: Mapping[str, str], gpus: int) -> None:
    """UserError unless each of this machine's workers (torchrun's LOCAL_WORLD_SIZE, else LOCAL_RANK + 1) has a
    CUDA device of its own among `gpus` (NCCL refuses two workers on one GPU: "Duplicate GPU detected")."""
    try:
        workers = max(int(environ.get("LOCAL_WORLD_SIZE", "0")), int(environ.get("LOCAL_RANK", "0")) + 1)
    except ValueError:  # int() of a str raises ValueError alone; torchrun writes these, a hand-made one may not
        raise UserError(f"LOCAL_WORLD_SIZE={environ.get('LOCAL_WORLD_SIZE')!r} / LOCAL_RANK="
                        f"{environ.get('LOCAL_RANK')!r}: must be integers; start the workers with torchrun") from None
    if workers > gpus:
        raise UserError(f"{workers} workers on this machine (LOCAL_WORLD_SIZE) but it shows {gpus} CUDA device(s), "
                        f"and NCCL needs one per worker; start at most {gpus} per machine (torchrun --nproc-per-node "
                        f"{gpus}), or train on the CPU with train.device=cpu (gloo)")


def waiting_line(env: TorchrunEnv, timeout: float) -> str:
    """What a worker prints as it starts to wait for the others: whom, where and for how long."""
    others = [r for r in range(env.world_size) if r != env.rank]
    whom = f"rank {others[0]}" if len(others) == 1 else (
        f"ranks {others[0]}–{others[-1]}" if others == list(range(others[0], others[-1] + 1))
        else f"ranks {', '.join(map(str, others))}")
    host = "hosting the rendezvous" if env.rank == 0 else "meeting rank 0"
    return (f"rank {env.rank} of WORLD_SIZE={env.world_size} waits for {whom} at {env.master_addr}:{env.master_port} "
            f"({host}) for at most {timeout:g} s ({RENDEZVOUS_TIMEOUT_ENV})")


@contextlib.contextmanager
def join_torchrun_group(device: str) -> Iterator[int]:
    """This process's rank in the process group torchrun's environment describes (WORLD_SIZE > 1), set up for
    the block and torn down after it (gloo on CPU, NCCL on CUDA); rank 0 with no group outside torchrun.

    The workers must all join within `rendezvous_timeout()` seconds; else UserError names the address, the
    count and the fix. Each worker says on stderr at once whom it waits for, where and for how long, so a peer
    that never comes is visible before the timeout. Collectives keep torch's own (longer) timeout."""
    env = torchrun_env()
    if env is None:
        yield 0
        return
    from torch.distributed.constants import default_pg_timeout

    timeout = rendezvous_timeout()
    if device != "cpu" and torch.cuda.is_available():  # every worker of the machine refuses alike, before meeting
        check_gpu_per_worker(os.environ, torch.cuda.device_count())
    print(waiting_line(env, timeout), file=sys.stderr, flush=True)
    try:
        store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout)))
    except dist.DistError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"torch.distributed rendezvous at {env.master_addr}:{env.master_port} (rank {env.rank} of "
                        f"WORLD_SIZE={env.world_size}): the other workers did not all join within {timeout:g} s "
                        f"({first}); start every worker, check MASTER_ADDR/MASTER_PORT, or give them longer with "
                        f"{RENDEZVOUS_TIMEOUT_ENV}") from None
    store.set_timeout(default_pg_timeout)  # the rendezvous is bounded; what follows keeps torch's timeout
    cuda = device != "cpu" and torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo", store=store, rank=rank, world_size=world)
    try:
        yield dist.get_rank()
    finally:
        dist.destroy_process_group()
