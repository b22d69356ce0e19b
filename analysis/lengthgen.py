"""Length generalisation from stored results: task accuracy by length, "not learned" marks and effective lengths.

- Task metrics: a run reports `acc_<task>_x<tag>` (exact match) with `n_<task>_x<tag>` prompts, where the tag is the
  length factor written `f"{f:g}"`; `task_metrics` finds them in a results table.
- Learned: a (variant, task) whose 1x accuracy, pooled over its seeds (k/n), is below LEARNED_THRESHOLD is *not
  learned*: an instrument flat at 1x reads the same for every encoding, so it gets no length verdict.
- Effective length (per seed, so it gets intervals and paired comparisons like every outcome):
  - accuracy, where the cell's tasks.parquet records distances: on distance (`analysis.distance`), in multiples of
    the longest distance trained on, the bins held against their binomial noise;
  - accuracy of older runs (no distances): in multiples of the train length, the longest evaluated factor up to
    which the accuracy stays at or above the rule's threshold (`AccuracyRule`; default: half the seed's own 1x
    accuracy);
  - loss: `analysis.loss_length`: from position_loss.parquet at the longest factor, the first bin past the train
    length where the same tokens' full-context loss exceeds their train-length-context loss by more than the
    tolerance beyond its noise; censored at the window length when none does; nan when the model never learned to
    use context or the file predates the paired columns. `loss_effective_length` is the unpaired rule it replaced
    (issue 33: it reads text noise), kept to show what it returned.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.loss_length import loss_reading
from trainer.evals.position_loss import PAIRED_COLUMNS, POSITION_LOSS_FILE, POSITION_LOSS_SCHEMA, read_position_loss

__all__ = ["ACC_METRIC", "DEFAULT_RULE", "EFFECTIVE_PREFIXES", "LEARNED_THRESHOLD", "LOSS_REASON", "LOSS_TOLERANCE",
           "AccuracyRule", "accuracy_counts", "effective_length", "is_task_metric", "learned_table",
           "loss_effective_length", "loss_readings", "position_losses", "task_metrics", "with_effective_lengths"]

ACC_METRIC = re.compile(r"^acc_(?P<task>.+)_x(?P<tag>[0-9]+(?:\.[0-9]+)?)$")
LEARNED_THRESHOLD = 0.9  # 1x exact match a task must reach before its lengths say anything (issue 25)
LOSS_REASON = "loss_length_reason"  # the column that says why a cell's efflen_loss is what it is (or missing)
LOSS_TOLERANCE = 0.1  # nats the full context may cost over the train length's on the same tokens
# the columns `with_effective_lengths` derives: efflen_<task> (on distance) and efflen_loss, poslen_<task> (by window)
EFFECTIVE_PREFIXES = ("efflen_", "poslen_")


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
    """Whether a metric belongs to the synthetic tasks (exact match, prompt count, per-token accuracy, or exact
    match on the examples a shortcut cannot answer)."""
    return bool(ACC_METRIC.match(metric)) or metric.startswith(("tokacc_", "tokskill_", *EFFECTIVE_PREFIXES, "hardacc_",
                                                                "hardn_")) or \
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
    """The unpaired rule (replaced by `analysis.loss_length`; it reads text noise, issue 33). In multiples of
    train_length L: where the binned loss (bins by first position, over windows of `length`
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
    """The loss-by-position rows of every cell that has them, with the cell's row index as `cell` (the paired
    columns nan where a file predates them)."""
    frames = []
    for idx, run_dir in (cells["run_dir"].items() if "run_dir" in cells else []):  # shipped results: no run dirs
        path = Path(run_dir) / POSITION_LOSS_FILE
        if path.is_file():
            t = read_position_loss(path).to_pandas()
            t = t.reindex(columns=[*POSITION_LOSS_SCHEMA.names, *PAIRED_COLUMNS])  # version 1 files: paired nan
            frames.append(t.assign(cell=idx))
    cols = [*POSITION_LOSS_SCHEMA.names, *PAIRED_COLUMNS, "cell"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def loss_readings(cells: pd.DataFrame, tolerance: float = LOSS_TOLERANCE) -> pd.DataFrame:
    """value (the loss effective length, × train length) and reason per cell that kept a loss by position, indexed
    like cells (`analysis.loss_length.loss_reading`)."""
    rows = {idx: loss_reading(g, tolerance) for idx, g in position_losses(cells).groupby("cell")}
    return pd.DataFrame({"value": pd.Series([r.value for r in rows.values()], index=list(rows), dtype=float),
                         "reason": pd.Series([r.reason for r in rows.values()], index=list(rows), dtype=object)})


def with_effective_lengths(cells: pd.DataFrame, rule: AccuracyRule = DEFAULT_RULE,
                           tolerance: float = LOSS_TOLERANCE, threshold: float = LEARNED_THRESHOLD,
                           learned: pd.DataFrame | None = None) -> pd.DataFrame:
    """cells with `efflen_<task>` (per cell, so per seed; nan where the (variant, task) is not learned; on distance
    where the cell's tasks.parquet records it, see `analysis.distance`, with `poslen_<task>` beside it; by length
    factor for an older run without distances; as shipped for a cell without run files) and `efflen_loss` columns,
    ready for
    `analysis.comparisons`, and LOSS_REASON (why each cell's loss reading is what it is); `learned` is these
    cells' `learned_table` at `threshold` when the caller has it already."""
    from analysis.distance import distance_effective_length, position_effective_length, task_rows

    out = cells.copy()
    learned = learned_table(cells, threshold) if learned is None else learned
    by_distance = task_rows(cells)
    for task, by_factor in task_metrics(list(cells.columns)).items():
        ok = learned[(learned["task"] == task) & learned["learned"]]
        keep = {(v, t if np.isfinite(t) else -1.0) for v, t in zip(ok["variant"], ok["theta"], strict=True)}
        values, positions = [], []
        for _, row in cells.iterrows():
            theta = float(row["theta"]) if pd.notna(row["theta"]) else -1.0
            accs = [row.get(m, math.nan) for m in by_factor.values()]
            mine = by_distance[(by_distance["cell"] == row.name) & (by_distance["task"] == task)]
            if len(mine):
                value, position = distance_effective_length(mine), position_effective_length(mine)
            elif isinstance(row.get("run_dir"), str) and Path(row["run_dir"]).is_dir():  # older: no distances
                value, position = effective_length(list(by_factor), accs, rule), math.nan
            else:  # shipped results: no run files; what was shipped (validated), or nothing, never recomputed
                value = row.get(f"efflen_{task}", math.nan)
                position = row.get(f"poslen_{task}", math.nan)
            learned_here = (row["variant"], theta) in keep
            values.append(value if learned_here else math.nan)
            positions.append(position if learned_here else math.nan)
        out[f"efflen_{task}"] = values
        if not np.isnan(positions).all():
            out[f"poslen_{task}"] = positions
    readings = loss_readings(cells, tolerance)
    if len(readings):
        out["efflen_loss"] = readings["value"].reindex(cells.index)
        out[LOSS_REASON] = readings["reason"].reindex(cells.index)
    return out
