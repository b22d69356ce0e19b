"""Optimizers (AdamW, SGD, Adafactor) and the warmup-then-decay learning-rate schedule.

Importing it loads no torch (the config tree reads `OptimConfig` and the names of `OPTIMIZERS`); a builder imports
torch when it builds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hdrope.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["OPTIMIZERS", "OptimConfig", "build_optimizer", "lr_at"]


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (the paper: AdamW, warmup 1e-6 -> 1e-4, then decay)."""

    name: str = "adamw"  # a key of OPTIMIZERS below: adamw | sgd | adafactor
    lr: float = 1e-4
    warmup_start_lr: float = 1e-6
    final_lr: float = 1e-6
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine | linear | constant
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    momentum: float = 0.0  # sgd only
    grad_clip: float = 1.0  # 0 disables


def _adamw(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    import torch

    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, foreach=True)


def _sgd(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    import torch

    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True)


def _adafactor(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    import torch

    return torch.optim.Adafactor(groups, lr=cfg.lr, foreach=True)


# optim.name -> builder. Which are rotation-invariant matters for HD-RoPE (NOTES §2): SGD (with momentum,
# L2 decay and norm clipping) commutes with an orthogonal change of the W_q/W_k basis, so a fixed-Q model
# trains exactly as its folded identity-basis twin; AdamW's per-coordinate and Adafactor's per-row/column
# second moments do not.
OPTIMIZERS: dict[str, Callable[[list[dict], OptimConfig], torch.optim.Optimizer]] = {
    "adamw": _adamw,
    "sgd": _sgd,
    "adafactor": _adafactor,
}


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer `cfg.name` names; weight decay applies to weight matrices only, never to norm gains or to the
    position encoding's own parameters (`pe.*`: a learned basis or FoPE coefficients must not decay towards zero)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in params if p.dim() >= 2 and not n.startswith("pe.")]
    no_decay = [p for n, p in params if p.dim() < 2 or n.startswith("pe.")]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.name not in OPTIMIZERS:
        raise UserError(f"optim.name={cfg.name!r}: choose one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[cfg.name](groups, cfg)


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup from warmup_start_lr to lr,
    then cosine or linear decay to final_lr at total_steps (or constant)."""
    if step < cfg.warmup_steps:
        return cfg.lr - (cfg.lr - cfg.warmup_start_lr) * (1 - (step + 1) / cfg.warmup_steps)
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, total_steps - cfg.warmup_steps)
    frac = min(1.0, (step - cfg.warmup_steps) / span)
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if cfg.schedule == "cosine" else 1 - frac
    return cfg.final_lr + (cfg.lr - cfg.final_lr) * shape
