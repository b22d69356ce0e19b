"""What a report compares: outcome metrics per seed, accuracies as counts, and run costs kept apart.

- Outcomes are model properties (losses, accuracies); costs (`trainer.config.COST_METRICS`: tokens/s,
  MFU) are properties of the machine a cell ran on and are tabled separately, never tested.
- The seed is the unit: `seed_values` gives one value per (variant, θ, seed), averaging the cells that
  share a training seed (e.g. several random-basis seeds), so that comparisons pair by seed.
- Accuracies are counts: `passkey_acc` is k of n prompts (read from each cell's passkey.parquet), an
  lm-eval accuracy `lm_<task>_<acc|acc_norm|exact_match>` is k of `lm_<task>_n` documents, a synthetic task's
  `acc_<task>_x<f>` is k of `n_<task>_x<f>` prompts.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from trainer.config import COST_METRICS
from trainer.evals.passkey.table import read_passkey_table
from trainer.files.run_files import read_metrics

__all__ = ["COST_METRICS", "cost_table", "is_proportion", "outcome_metrics", "read_passkey", "seed_values"]

# an accuracy metric's pattern -> its count column: lm-eval documents, and synthetic-task prompts per length factor
_PROPORTIONS = ((re.compile(r"^lm_(?P<task>.+)_(acc|acc_norm|exact_match)$"), "lm_{task}_n"),
                (re.compile(r"^acc_(?P<task>.+)_x(?P<tag>[0-9.]+)$"), "n_{task}_x{tag}"),
                (re.compile(r"^passkey_acc$"), "passkey_n"))  # shipped results carry the prompt count (no tables)


def _lm_count_column(metric: str) -> str | None:
    """The column holding the trials a proportion metric counts (None for a metric that is not one)."""
    for pattern, count in _PROPORTIONS:
        if m := pattern.match(metric):
            return count.format(**m.groupdict())
    return None


def outcome_metrics(metrics: list[str]) -> list[str]:
    """The model-outcome metrics among a results table's metric columns (costs, counts and stderrs dropped)."""
    counts = {_lm_count_column(m) for m in metrics}
    return [m for m in metrics if m not in COST_METRICS and m not in counts and not m.endswith("_stderr")]


def is_proportion(cells: pd.DataFrame, metric: str) -> bool:
    """Whether metric is k of n trials in these cells (passkey prompts, or lm-eval documents with a count column)."""
    if metric == "passkey_acc" and "passkey_path" in cells:
        return True
    return (col := _lm_count_column(metric)) is not None and col in cells and cells[col].notna().any()


def read_passkey(path: Path) -> pd.DataFrame:
    """One cell's passkey table (a row per prompt); UserError naming the file when it is damaged or foreign."""
    return read_passkey_table(path).to_pandas()


def _counts(cells: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(k, n) per cell row for a proportion metric."""
    if metric == "passkey_acc" and "passkey_path" in cells:
        k, n = [], []
        for path, acc in zip(cells["passkey_path"], cells[metric], strict=True):
            if Path(path).is_file() and np.isfinite(acc):
                correct = read_passkey(Path(path))["correct"]
                k.append(int(correct.sum()))
                n.append(len(correct))
            else:
                k.append(0)
                n.append(0)
        return np.asarray(k), np.asarray(n)
    n = cells[_lm_count_column(metric)].fillna(0).to_numpy(dtype=float)
    k = np.round(cells[metric].fillna(0).to_numpy(dtype=float) * n)
    return k.astype(int), n.astype(int)


def seed_values(cells: pd.DataFrame, metric: str) -> pd.DataFrame:
    """variant, variant_rank, theta, seed, value (and k, n for a proportion): one row per (variant, θ, seed).

    Cells sharing a training seed within a variant and θ are averaged (counts are summed); non-finite values
    (a metric a cell did not compute) are dropped rather than shown."""
    df = cells[["variant", "variant_rank", "theta", "seed", metric]].copy()
    df["theta"] = df["theta"].astype(float).fillna(-1.0)  # groupable; θ-less encodings (NoPE) keep one group
    keys = ["variant", "variant_rank", "theta", "seed"]
    if is_proportion(cells, metric):
        df["k"], df["n"] = _counts(cells, metric)
        df = df[df["n"] > 0]
        out = df.groupby(keys, sort=True)[["k", "n"]].sum().reset_index()
        out["value"] = out["k"] / out["n"]
    else:
        df = df[np.isfinite(df[metric].astype(float))]
        out = df.groupby(keys, sort=True)[metric].mean().reset_index().rename(columns={metric: "value"})
    out["theta"] = out["theta"].where(out["theta"] >= 0)
    return out


def _history_median(run_dir: Path, metric: str) -> float:
    values = [r[metric] for r in read_metrics(Path(run_dir) / "metrics.jsonl")
              if isinstance(r.get(metric), (int, float)) and np.isfinite(r[metric])]
    return float(np.median(values)) if values else float("nan")


def cost_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per variant and θ: the median over each run's history of every cost metric, then the median (and range)
    over the variant's cells -> variant, variant_rank, theta, metric, median, lo, hi, n."""
    rows = []
    for metric in COST_METRICS:
        if metric not in cells:
            continue
        per_cell = cells.assign(_cost=[_history_median(d, metric) for d in cells["run_dir"]])
        per_cell = per_cell[np.isfinite(per_cell["_cost"])]
        for (variant, rank, theta), g in per_cell.groupby(["variant", "variant_rank", per_cell["theta"].fillna(-1)],
                                                           sort=True):
            v = g["_cost"].to_numpy()
            rows.append({"variant": variant, "variant_rank": rank, "theta": theta if theta >= 0 else np.nan,
                         "metric": metric, "median": float(np.median(v)), "lo": float(v.min()),
                         "hi": float(v.max()), "n": len(v)})
    return pd.DataFrame(rows, columns=["variant", "variant_rank", "theta", "metric", "median", "lo", "hi", "n"])
