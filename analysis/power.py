"""How many seeds a question needs: power at the per-seed spread a pilot sweep measured.

`seed_advice(pilot, planned, metric, difference)` reads a finished pilot sweep, takes the per-seed
spread of its comparisons (of the paired per-seed differences where the pilot paired seeds, else
pooled within variants, with √2·sd bounding an uncorrelated paired difference), and answers how many
seeds the planned sweep needs so that its report detects `difference` at 80% power after the Holm
correction over the planned table's comparisons (the Bonferroni level α/m bounds Holm's first step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.comparisons import arms, comparison_table, references
from analysis.lengthgen import (
    EFFECTIVE_PREFIXES,
    LEARNED_THRESHOLD,
    learned_table,
    loss_readings,
    task_metrics,
    with_effective_lengths,
)
from analysis.load import find_sweep_dir, load_results, sweep_cells
from analysis.outcomes import seed_values
from analysis.stats import seeds_needed
from analysis.variants import trained
from hdrope.errors import UserError

__all__ = ["SeedAdvice", "family_size", "no_spread_reason", "pilot_spread", "seed_advice"]


@dataclass(frozen=True)
class SeedAdvice:
    """Seeds needed for the planned sweep (None: more than the search limit), with the spreads behind them."""

    metric: str
    difference: float
    family: int
    alpha: float
    paired_sd: float
    unpaired_sd: float
    paired_seeds: int | None
    unpaired_seeds: int | None
    planned_seeds: int
    source: str  # which pilot comparisons the spreads come from

    def lines(self) -> list[str]:
        """The advice as text for `hdrope sweep plan --detect`."""
        def seeds(n: int | None) -> str:
            return "more than 10000" if n is None else str(n)

        verdict = ("enough" if self.paired_seeds is not None and self.planned_seeds >= self.paired_seeds
                   else "too few")
        return [
            f"seeds to detect a {self.difference:g} difference in {self.metric} at 80% power (two-sided, 5%, "
            f"Holm over the plan's {self.family} comparison{'s' * (self.family != 1)}: α = {self.alpha:.3g} for "
            f"the first):",
            f"  per-seed spread from the pilot ({self.source}): paired differences sd {self.paired_sd:.4g}, "
            f"within variants sd {self.unpaired_sd:.4g}",
            f"  paired (every variant on the same seeds, as `axes: {{seed: [...]}}` runs them): "
            f"{seeds(self.paired_seeds)} seeds",
            f"  unpaired (Welch): {seeds(self.unpaired_seeds)} seeds per variant",
            f"  this plan runs {self.planned_seeds} seed{'s' * (self.planned_seeds != 1)} per cell: {verdict}",
        ]


def family_size(planned: pd.DataFrame) -> int:
    """The comparisons a report of these planned cells draws per metric table: every (variant, θ) with a RoPE
    reference, a variant without θ once per θ of its reference (planned: a results-shaped frame of the plan's
    cells)."""
    cells = trained(planned)
    refs = references(cells)
    values = cells[["variant", "theta", "seed"]].assign(value=0.0)
    values["theta"] = values["theta"].astype(float)
    thetas = sorted({float(t) for t in values["theta"].dropna()})
    drawn = sum(1 for theta in thetas for variant, ref in refs.items()
                if all(len(arm) for arm in arms(values, variant, ref, theta)))
    return max(1, drawn)


def _pilot_cells(pilot: Path, metric: str) -> pd.DataFrame:
    """The pilot's cells, with their effective lengths when the metric is one (`efflen_<task>`, `efflen_loss`)."""
    results = load_results(pilot)
    cells = sweep_cells(pilot)
    if metric.startswith(EFFECTIVE_PREFIXES):
        cells = with_effective_lengths(cells)
    if metric == "efflen_loss" and metric in cells and cells[metric].isna().all():
        reasons = "; ".join(loss_readings(cells)["reason"].unique())
        raise UserError(f"--metric efflen_loss: no cell of the pilot {pilot} has a loss effective length ({reasons})")
    if metric not in cells:
        known = [c for c in [*results.columns, *cells.columns] if not c.endswith("_path")
                 and c.startswith(("val_", "passkey", "train_loss", "lm_", "acc_", *EFFECTIVE_PREFIXES))]
        raise UserError(f"--metric {metric}: the pilot {pilot} has no such column; choose one of "
                        f"{list(dict.fromkeys(known))}, or an effective length (efflen_<task>, efflen_loss) where "
                        "the pilot scored tasks or kept the loss by position")
    return cells


def no_spread_reason(cells: pd.DataFrame, pilot: Path, metric: str) -> str:
    """Why no variant of the pilot gives a per-seed spread of `metric`: too few seeds, or a metric left empty
    (an effective length of a task no variant learned)."""
    seeds = cells.groupby(["variant", cells["theta"].astype(float).fillna(-1.0)])["seed"].nunique()
    if seeds.empty or seeds.max() < 2:
        return (f"--pilot {pilot}: no variant of the pilot has 2 or more seeds of {metric}, so it measures no "
                "per-seed spread; run the pilot with at least 2 seeds (axes: {seed: [1, 2]})")
    task = metric.removeprefix("efflen_").removeprefix("poslen_")
    table = learned_table(cells)
    table = table[(table["task"] == task) & ~table["learned"]]
    if metric.startswith(EFFECTIVE_PREFIXES) and len(table):
        shortest = next(iter(task_metrics(list(cells)).get(task, {}).values()), "val_loss")
        said = ", ".join(f"{r.variant}{'' if pd.isna(r.theta) else f' at θ={r.theta:g}'} ({r.k}/{r.n} at 1x)"
                         for r in table.itertuples())
        return (f"--metric {metric}: empty in the pilot {pilot}: the task {task} was not learned (1x exact match "
                f"below {LEARNED_THRESHOLD:g}) by {said}, so it has no effective length and no per-seed spread; "
                f"size the plan on a metric the pilot measured (e.g. --metric {shortest}), or pilot with more steps "
                "so that the task is learned")
    return (f"--metric {metric}: empty in the pilot {pilot}: no cell of "
            f"{', '.join(map(str, cells['variant'].unique()))} has a finite value of it, so it measures no per-seed "
            "spread; choose a metric the pilot computed")


def pilot_spread(cells: pd.DataFrame, pilot: Path, metric: str) -> tuple[float, float, str]:
    """The per-seed spread of `metric` in a pilot's cells: the largest sd of a paired per-seed difference over the
    pilot's comparisons (each variant against its RoPE reference, paired as the report pairs it: a variant
    without θ with the reference at each of its θ), else √2 × the within-variant sd; the pooled within-variant
    sd; and which comparison set the first."""
    tests = comparison_table(cells, metric)
    tests = tests[tests["n"] >= 2] if len(tests) else tests  # 2 or more seeds: a spread (its interval may be ±∞)
    values = seed_values(cells, metric)
    within = values.groupby(["variant", "theta"], dropna=False)["value"].agg(["var", "count"]).dropna()
    within = within[within["count"] >= 2]
    if within.empty:
        raise UserError(no_spread_reason(cells, pilot, metric))
    pooled = float(math.sqrt(np.average(within["var"], weights=within["count"] - 1)))
    if values["value"].nunique() == 1:  # constant: a power calculation would answer its minimum for any difference
        raise UserError(f"--metric {metric}: every seed of every variant of the pilot {pilot} gave the same value "
                        f"({values['value'].iloc[0]:g}), so it measures nothing to size a plan from (a task not "
                        "learned scores flat); choose a metric that varies, e.g. val_loss")
    paired = tests[tests["paired"]] if len(tests) else tests
    diffs = [float((t - r).dropna().std(ddof=1))
             for t, r in (arms(values, row.variant, row.reference, row.theta) for row in paired.itertuples())]
    if any(np.isfinite(diffs)):
        worst = int(np.nanargmax(diffs))
        row = paired.iloc[worst]
        source = (f"the largest of {len(paired)} paired comparison(s): {row['variant']} − {row['reference']} at "
                  f"θ={row['theta']:g}, {row['n']} seeds")
        return float(diffs[worst]), pooled, source
    return math.sqrt(2) * pooled, pooled, "no paired comparison: √2 × the within-variant sd bounds a paired one"


def seed_advice(pilot: str | Path, planned: pd.DataFrame, metric: str, difference: float,
                power: float = 0.8, level: float = 0.95) -> SeedAdvice:
    """Seeds the planned sweep needs to detect `difference` in `metric`, from a finished pilot's per-seed spread."""
    if not (difference > 0 and math.isfinite(difference)):
        raise UserError(f"--detect {difference}: must be a positive, finite difference in the metric's units, "
                        "e.g. --detect 0.02")
    pilot_dir = find_sweep_dir(pilot)
    pilot_cells = _pilot_cells(pilot_dir, metric)
    paired_sd, unpaired_sd, source = pilot_spread(pilot_cells, pilot_dir, metric)
    family = family_size(planned)
    if metric.startswith(EFFECTIVE_PREFIXES):  # the effective-length table is one family over its columns (as the
        # pilot's)
        family *= sum(1 for c in pilot_cells if c.startswith(EFFECTIVE_PREFIXES) and pilot_cells[c].notna().any())
    alpha = (1 - level) / family
    cells = trained(planned)
    planned_seeds = int(cells.groupby(["variant", cells["theta"].fillna(-1.0)])["seed"].nunique().min())
    return SeedAdvice(metric, difference, family, alpha, paired_sd, unpaired_sd,
                      seeds_needed(difference, paired_sd, paired=True, alpha=alpha, power=power),
                      seeds_needed(difference, unpaired_sd, paired=False, alpha=alpha, power=power),
                      planned_seeds, f"{pilot_dir.name}: {source}")
