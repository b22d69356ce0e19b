"""A loss that is not finite on a run's first step: which parameters hold non-finite or extreme values, which config
fields set them, and a run directory that such a run leaves as it found it.

The first step's loss comes from the parameters the run started with (its init, or its checkpoint) before any
update, so the learning rate cannot have caused it: the message names what did instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from trainer.config import RunConfig
from trainer.files.dir_lock import LOCK_FILE
from trainer.files.run_files import RUN_FILE
from trainer.model.args import ModelArgs
from trainer.model.position import pe_config_class

__all__ = ["EXTREME", "first_step_message", "later_step_message", "leaving_no_stillborn_run", "suspect_parameters",
           "suspects_text"]

EXTREME = 1e6  # |value| above which a parameter is extreme (the lab's weights start near 0.02, angles near 1)
_PE_PREFIX = "pe."  # Llama's position encoding module (trainer.model.llama: self.pe)


def suspect_parameters(model: torch.nn.Module, limit: float = EXTREME) -> list[tuple[str, str]]:
    """(name, what is wrong) for each parameter or buffer holding a non-finite value or one larger than `limit`."""
    found = []
    tensors = [*model.named_parameters(), *model.named_buffers()]
    with torch.no_grad():
        for name, tensor in tensors:
            if not tensor.is_floating_point() or tensor.numel() == 0:
                continue
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                found.append((name, f"{bad} non-finite value(s)"))
                continue
            largest = float(tensor.abs().max())
            if largest > limit:
                found.append((name, f"values up to {largest:.3g} in size"))
    return found


def _setting_fields(cfg: RunConfig, name: str) -> str:
    """The config fields that set parameter `name`: the position encoding's settings that differ from its kind's
    defaults for its own parameters, else model.init_std."""
    if name.startswith(_PE_PREFIX):
        pe = cfg.model.pe
        default = pe_config_class(pe.kind)(kind=pe.kind)
        changed = [f"model.pe.{f.name}={getattr(pe, f.name)!r} (default {getattr(default, f.name)!r})"
                   for f in dataclasses.fields(pe) if getattr(pe, f.name) != getattr(default, f.name)]
        return ", ".join(changed) if changed else f"model.pe.kind={pe.kind} at its defaults"
    default_std = ModelArgs().init_std
    said = f"model.init_std={cfg.model.init_std!r}"
    return said if cfg.model.init_std == default_std else f"{said} (default {default_std!r})"


def suspects_text(cfg: RunConfig, suspects: list[tuple[str, str]]) -> str:
    """The suspects of `suspect_parameters` in words, each with the config fields that set it."""
    named = "; ".join(f"{name} has {what}, set by {_setting_fields(cfg, name)}" for name, what in suspects[:4])
    return named + (f" (and {len(suspects) - 4} more)" if len(suspects) > 4 else "")


def first_step_message(cfg: RunConfig, suspects: list[tuple[str, str]], loss: float, step: int,
                       resumed: bool) -> str:
    """Why the loss of the first step a process trains (`step`, 1-based) is `loss` (not finite), from the suspects
    among the parameters it started with (`suspect_parameters` before any update)."""
    start = "the checkpoint resumed" if resumed else "the initial parameters"
    head = f"loss is {loss} at step {step} (computed from {start}, before any update)"
    if not suspects:
        return (f"{head}, none of which is non-finite or larger than {EXTREME:g}: the forward itself overflows; use "
                f"train.dtype=fp32, or check the settings of model.pe (kind {cfg.model.pe.kind})")
    fix = ("lower optim.lr or resume an earlier checkpoint" if resumed
           else "optim.lr is not the cause; bring those fields back toward their defaults")
    return f"{head}: {suspects_text(cfg, suspects)}; {fix}"


def later_step_message(cfg: RunConfig, suspects: list[tuple[str, str]], loss: float, step: int, found: int) -> str:
    """Why the loss of a later step is `loss` (not finite): the run's starting suspects when it had any, else the
    usual causes of divergence."""
    head = f"loss is {loss} at step {step} (found at step {found})"
    if suspects:
        return (f"{head}; the run started from extreme parameters: {suspects_text(cfg, suspects)}; bring those "
                "fields back toward their defaults")
    return f"{head}; lower optim.lr, keep optim.grad_clip on, or use train.dtype=fp32"


@contextlib.contextmanager
def leaving_no_stillborn_run(run_dir: Path, stops: type[BaseException], active: bool = True) -> Iterator[None]:
    """Within the block, a new run (no run.json in `run_dir` yet) that stops with `stops` before its first
    checkpoint has every entry it added to run_dir removed but its lock file, so a rerun (with any config) starts
    clean; what was there before is kept, and so is a run that checkpointed."""
    run_dir = Path(run_dir)
    before = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    fresh = active and RUN_FILE not in before
    try:
        yield
    except stops:
        checkpoints = run_dir / "checkpoints"
        if fresh and not (checkpoints.is_dir() and any(checkpoints.iterdir())):
            for path in run_dir.iterdir() if run_dir.is_dir() else []:
                if path.name in before or path.name == LOCK_FILE:
                    continue
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        raise


def remove_stillborn_dir(run_dir: Path, parents: list[Path] | tuple[Path, ...] = ()) -> None:
    """Remove run_dir when `leaving_no_stillborn_run` left nothing in it but the (released) lock file (the run made
    it and died before its first checkpoint), then each of `parents` (the directories the run made above it, the
    nearest first) while it is empty."""
    run_dir = Path(run_dir)
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {LOCK_FILE}:
        (run_dir / LOCK_FILE).unlink(missing_ok=True)
        for path in (run_dir, *parents):
            try:
                path.rmdir()
            except OSError:  # not empty: another writer made something there meanwhile, and it is theirs
                break
