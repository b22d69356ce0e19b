"""Evaluations: validation loss and bits per byte, length extrapolation, loss by position, passkey retrieval."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from trainer.config import EvalConfig, sliding_metric, validation_windows
from trainer.data.batches import val_windows
from trainer.data.passkey_prompt import PasskeyPrompter, first_integer, stop_after_number
from trainer.evals.paired_loss import unigram_surprisal
from trainer.evals.position_loss import PositionLoss
from trainer.model.generate import greedy_generate
from trainer.model.llama import Llama

__all__ = ["Autocast", "PasskeyResult", "Validation", "evaluate_passkey", "evaluate_validation", "position_loss",
           "sliding_position_loss"]

Autocast = Callable[[], contextlib.AbstractContextManager]  # makes a fresh precision context per use


def position_loss(model: Llama, windows: torch.Tensor, batch_size: int, autocast: Autocast) -> PositionLoss:
    """Next-token cross-entropy (nats) of windows of (count, seq + 1) tokens, summed per position in one pass, with
    each target's surprisal under the windows' own unigram distribution beside it."""
    seq = windows.shape[1] - 1
    full = sliding_position_loss(model, windows, seq, seq, batch_size, autocast)  # one chunk: the full context
    return dataclasses.replace(full, unigram=unigram_surprisal(windows[:, 1:].numpy()))


@torch.no_grad()
def sliding_position_loss(model: Llama, windows: torch.Tensor, context: int, stride: int, batch_size: int,
                          autocast: Autocast) -> PositionLoss:
    """Next-token loss of windows of (count, seq + 1) tokens, summed per position, when no prediction sees more than
    `context` tokens: the strided (sliding-window) loss. Chunks of `context` tokens start every `stride` tokens; each
    scores only the positions its predecessor did not, so position p sees between context - stride + 1 and
    context tokens (all p + 1 tokens while p < context)."""
    device = next(model.parameters()).device
    seq = windows.shape[1] - 1
    sums = torch.zeros(seq, dtype=torch.float64, device=device)
    per_window = torch.zeros(len(windows), seq, dtype=torch.float64)
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size].to(device)
        done = 0
        for begin in range(0, seq, stride):
            end = min(begin + context, seq)
            with autocast():
                logits = model(batch[:, begin:end])[:, done - begin :]
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, done + 1 : end + 1].flatten(),
                                   reduction="none")
            loss = loss.view(len(batch), end - done).double()
            sums[done:end] += loss.sum(0)
            per_window[i : i + len(batch), done:end] = loss.cpu()
            done = end
            if end == seq:
                break
    return PositionLoss(sums.cpu().numpy(), np.full(seq, len(windows), dtype=np.int64), per_window.numpy())


@dataclass
class Validation:
    """The validation metrics and, per length factor, the loss by position they were averaged from; `limited`: per
    extrapolation factor, the same windows' loss when no prediction sees more than the train length (with
    eval.sliding_stride set)."""

    metrics: dict[str, float]
    by_position: dict[int, PositionLoss] = field(default_factory=dict)
    limited: dict[int, PositionLoss] = field(default_factory=dict)


def evaluate_validation(
    model: Llama,
    val_tokens: np.ndarray,
    seq_len: int,
    cfg: EvalConfig,
    bytes_per_token: float,
    autocast: Autocast,
    extrapolate: bool = True,
) -> Validation:
    """val_loss and val_bpb at the train length, val_loss_x{f} at f times it when extrapolate; each the
    token-weighted mean of the loss by position of the same windows (`validation_windows` of them). With
    eval.sliding_stride set, also val_loss_sw_x{f}: the same windows' loss when no prediction sees more than the
    train length (`sliding_position_loss`)."""
    was_training = model.training
    model.eval()
    try:
        by_position = {1: position_loss(model, val_windows(val_tokens, seq_len, validation_windows(cfg, 1)),
                                        cfg.batch_size, autocast)}
        loss = by_position[1].mean
        out = {"val_loss": loss, "val_bpb": loss / math.log(2) / bytes_per_token}
        limited: dict[int, PositionLoss] = {}
        if extrapolate and cfg.extrapolation_batches > 0:
            for f in cfg.extrapolation:
                windows = val_windows(val_tokens, seq_len * f, validation_windows(cfg, f))
                by_position[f] = position_loss(model, windows, max(1, cfg.batch_size // f), autocast)
                out[f"val_loss_x{f}"] = by_position[f].mean
                if cfg.sliding_stride:
                    limited[f] = sliding_position_loss(model, windows, seq_len, cfg.sliding_stride, cfg.batch_size,
                                                       autocast)
                    out[sliding_metric(f)] = limited[f].mean
    finally:
        model.train(was_training)
    return Validation(out, by_position, limited)


@dataclass
class PasskeyResult:
    """Accuracy over the grid plus one row per prompt."""

    accuracy: float
    rows: list[dict]


@torch.no_grad()
def evaluate_passkey(
    model: Llama,
    prompter: PasskeyPrompter,
    seq_len: int,
    length_factors: list[float],
    depths: int,
    samples: int,
    max_new_tokens: int,
    seed: int,
    autocast: Autocast,
) -> PasskeyResult:
    """Greedy passkey retrieval over (length x depth), scored by exact match of the first integer."""
    was_training = model.training
    model.eval()
    rng = np.random.default_rng([seed, 7919])
    fmt = prompter.fmt
    stop = stop_after_number(prompter.tok)
    rows = []
    try:
        for factor in length_factors:
            length = round(seq_len * factor)
            for depth in np.linspace(0.0, 1.0, depths):
                for sample in range(samples):
                    key = int(rng.integers(fmt.min_key, fmt.max_key + 1))
                    p = prompter.build(length, float(depth), key)
                    with autocast():
                        gen = greedy_generate(model, p.prompt, max_new_tokens, stop)
                    text = prompter.tok.decode(gen)
                    rows.append({
                        "length": len(p.prompt), "target_length": length, "length_factor": float(factor),
                        "depth": p.depth, "depth_target": float(depth), "sample": sample, "passkey": key,
                        "generated": text, "correct": first_integer(text) == str(key),
                    })
    finally:
        model.train(was_training)
    acc = sum(r["correct"] for r in rows) / len(rows) if rows else float("nan")
    return PasskeyResult(acc, rows)
