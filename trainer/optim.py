"""Optimizers (AdamW, SGD) and the warmup-then-decay learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from hdrope.errors import UserError
from trainer.config import OptimConfig

__all__ = ["build_optimizer", "lr_at"]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW or SGD; weight decay applies to matrices only, never to norm gains."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, foreach=True)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True)
    raise UserError(f"optim.name={cfg.name!r}: choose 'adamw' or 'sgd'")


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
