"""Length generalisation from stored results: task accuracy by length, "not learned" marks and effective lengths.

- Task metrics: a run reports `acc_<task>_x<tag>` (exact match) with `n_<task>_x<tag>` prompts, where the tag is the
  length factor written `f"{f:g}"`; `task_metrics` finds them in a results table.
- Learned: a (variant, task) whose 1x accuracy, pooled over its seeds (k/n), is below LEARNED_THRESHOLD is *not
  learned*: an instrument flat at 1x reads the same for every encoding, so it gets no length verdict.
- Effective length (per seed, so it gets intervals and paired comparisons like every outcome), in multiples of the
  train length:
  - accuracy: the longest evaluated factor up to which the accuracy stays at or above the rule's threshold
    (`AccuracyRule`; default: half the seed's own 1x accuracy);
  - loss: from position_loss.parquet at the longest factor, the first position past the train length whose binned
    loss exceeds the in-distribution level (the token-weighted mean over positions [L/2, L)) by more than the
    tolerance; a curve that never does is censored at its window length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from trainer.evals.position_loss import POSITION_LOSS_FILE, read_position_loss

__all__ = ["ACC_METRIC", "DEFAULT_RULE", "LEARNED_THRESHOLD", "LOSS_TOLERANCE", "AccuracyRule", "accuracy_counts",
           "effective_length", "is_task_metric", "learned_table", "loss_effective_length", "position_losses",
           "task_metrics", "with_effective_lengths"]

ACC_METRIC = re.compile(r"^acc_(?P<task>.+)_x(?P<tag>[0-9]+(?:\.[0-9]+)?)$")
LEARNED_THRESHOLD = 0.9  # 1x exact match a task must reach before its lengths say anything (issue 25)
LOSS_TOLERANCE = 0.1  # nats above the in-distribution level: ~7x the compact seed spread of val_loss (NOTES §10)


@dataclass(frozen=True)
class AccuracyRule:
    """When an accuracy counts as kept: `relative` compares it with threshold × the seed's own 1x accuracy,
    `absolute` with threshold itself (RULER-style)."""

    kind: str = "relative"
    threshold: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in ("relative", "absolute") or not 0 < self.threshold <= 1:
            raise ValueError(f"AccuracyRule({self.kind!r}, {self.threshold}): need kind relative or absolute and a "
                             "threshold in (0, 1]")

    def text(self) -> str:
        """The rule in words, for captions."""
        if self.kind == "relative":
            return f"accuracy at least {self.threshold:g} × the seed's own 1x accuracy"
        return f"accuracy at least {self.threshold:g}"


DEFAULT_RULE = AccuracyRule()


def is_task_metric(metric: str) -> bool:
    """Whether a metric belongs to the synthetic tasks (exact match, prompt count or per-token accuracy)."""
    return bool(ACC_METRIC.match(metric)) or metric.startswith(("tokacc_", "efflen_")) or \
        bool(re.match(r"^n_.+_x[0-9.]+$", metric))


def task_metrics(columns: Sequence[str]) -> dict[str, dict[float, str]]:
    """task -> {length factor: its acc_<task>_x<tag> column}, factors ascending, for the columns present."""
    out: dict[str, dict[float, str]] = {}
    for c in columns:
        if m := ACC_METRIC.match(c):
            out.setdefault(m["task"], {})[float(m["tag"])] = c
    return {t: dict(sorted(f.items())) for t, f in sorted(out.items())}


def effective_length(factors: Sequence[float], accuracies: Sequence[float], rule: AccuracyRule = DEFAULT_RULE) -> float:
    """The longest factor up to which every evaluated accuracy stays at or above the rule's threshold (the reference
    for a relative rule is the accuracy at the shortest factor); 0 when even the shortest falls below, nan when
    nothing was evaluated. Unevaluated (nan) factors are skipped."""
    pairs = sorted((float(f), float(a)) for f, a in zip(factors, accuracies, strict=True) if np.isfinite(a))
    if not pairs:
        return math.nan
    bar = rule.threshold * pairs[0][1] if rule.kind == "relative" else rule.threshold
    if pairs[0][1] <= 0 or pairs[0][1] < bar:
        return 0.0
    reached = 0.0
    for f, a in pairs:
        if a < bar:
            break
        reached = f
    return reached


def loss_effective_length(positions: Sequence[int], losses: Sequence[float], tokens: Sequence[int],
                          train_length: int, length: int, tolerance: float = LOSS_TOLERANCE) -> float:
    """In multiples of train_length L: where the binned loss (bins by first position, over windows of `length`
    positions) first exceeds its in-distribution level (token-weighted mean over bins starting in [L/2, L)) by more
    than tolerance, past the train length; length / L (censored) when it never does; nan without in-distribution
    bins."""
    p = np.asarray(positions, dtype=np.int64)
    order = np.argsort(p)
    p, v, n = p[order], np.asarray(losses, dtype=float)[order], np.asarray(tokens, dtype=float)[order]
    inside = (p >= train_length // 2) & (p < train_length)
    if not inside.any():
        return math.nan
    level = float((v[inside] * n[inside]).sum() / n[inside].sum())
    for start, loss in zip(p[p >= train_length], v[p >= train_length], strict=True):
        if loss > level + tolerance:
            return float(start) / train_length
    return max(1.0, length / train_length)


def accuracy_counts(cells: pd.DataFrame, metric: str) -> tuple[int, int]:
    """k correct of n prompts of one accuracy metric, pooled over the cells (k = round(acc × n) per cell)."""
    count = "n_" + metric.removeprefix("acc_")
    if metric not in cells or count not in cells:
        return 0, 0
    ok = cells[metric].notna() & cells[count].notna()
    n = cells.loc[ok, count].to_numpy(dtype=float)
    return int(np.round(cells.loc[ok, metric].to_numpy(dtype=float) * n).sum()), int(n.sum())


def learned_table(cells: pd.DataFrame, threshold: float = LEARNED_THRESHOLD) -> pd.DataFrame:
    """variant, theta, task, k, n, accuracy, learned: the 1x (shortest factor) accuracy pooled over each variant's
    seeds at each θ, and whether it reaches the threshold."""
    rows = []
    for task, by_factor in task_metrics(list(cells.columns)).items():
        metric = by_factor[min(by_factor)]
        for (variant, theta), g in cells.groupby(["variant", cells["theta"].astype(float).fillna(-1.0)], sort=False):
            k, n = accuracy_counts(g, metric)
            rows.append({"variant": variant, "theta": theta if theta >= 0 else math.nan, "task": task, "k": k,
                         "n": n, "accuracy": k / n if n else math.nan, "learned": bool(n and k / n >= threshold)})
    return pd.DataFrame(rows, columns=["variant", "theta", "task", "k", "n", "accuracy", "learned"])


def position_losses(cells: pd.DataFrame) -> pd.DataFrame:
    """The loss-by-position rows of every cell that has them, with the cell's row index as `cell`."""
    frames = []
    for idx, run_dir in (cells["run_dir"].items() if "run_dir" in cells else []):  # shipped results: no run dirs
        path = Path(run_dir) / POSITION_LOSS_FILE
        if path.is_file():
            t = read_position_loss(path).to_pandas()[["length_factor", "length", "position", "loss", "tokens"]]
            frames.append(t.assign(cell=idx))
    cols = ["length_factor", "length", "position", "loss", "tokens", "cell"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def with_effective_lengths(cells: pd.DataFrame, rule: AccuracyRule = DEFAULT_RULE,
                           tolerance: float = LOSS_TOLERANCE, threshold: float = LEARNED_THRESHOLD,
                           learned: pd.DataFrame | None = None) -> pd.DataFrame:
    """cells with `efflen_<task>` (per cell, so per seed; nan where the (variant, task) is not learned) and
    `efflen_loss` columns, ready for `analysis.comparisons`; `learned` is these cells' `learned_table` at
    `threshold` when the caller has it already."""
    out = cells.copy()
    learned = learned_table(cells, threshold) if learned is None else learned
    for task, by_factor in task_metrics(list(cells.columns)).items():
        ok = learned[(learned["task"] == task) & learned["learned"]]
        keep = {(v, t if np.isfinite(t) else -1.0) for v, t in zip(ok["variant"], ok["theta"], strict=True)}
        values = []
        for _, row in cells.iterrows():
            theta = float(row["theta"]) if pd.notna(row["theta"]) else -1.0
            accs = [row.get(m, math.nan) for m in by_factor.values()]
            values.append(effective_length(list(by_factor), accs, rule) if (row["variant"], theta) in keep
                          else math.nan)
        out[f"efflen_{task}"] = values
    rows = position_losses(cells)
    loss = pd.Series(math.nan, index=cells.index)
    for idx, g in rows.groupby("cell"):
        longest = g[g["length_factor"] == g["length_factor"].max()]
        train_length = round(int(longest["length"].iloc[0]) / float(longest["length_factor"].iloc[0]))
        loss[idx] = loss_effective_length(longest["position"], longest["loss"], longest["tokens"], train_length,
                                          int(longest["length"].iloc[0]), tolerance)
    if len(rows):
        out["efflen_loss"] = loss
    return out
