"""Every variant against its RoPE reference, per metric and θ: the calibrated comparisons a report marks.

For one metric the family is every (variant, θ) comparison of its table; p-values are corrected over
that family (Holm by default). A variant without θ (NoPE, ALiBi) is compared with the RoPE reference at every θ.
A comparison is paired by seed when both variants ran the same seeds
(same data order and initialisation), else Welch. Each row also carries the smallest difference the
comparison could have detected at 80% power from its own per-seed spread, and a one-line verdict.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.outcomes import seed_values
from analysis.stats import CORRECTIONS, adjust, compare, detectable_difference, seeds_to_reach
from analysis.variants import theta_text, variant_axes
from trainer.model.position import identity_is_rope

__all__ = ["COLUMNS", "EXPLORATORY", "arms", "comparison_family", "comparison_table", "corrected",
           "correction_text", "fmt", "is_rope", "pair_row", "references", "verdict"]

COLUMNS = ["metric", "theta", "variant", "reference", "delta", "lo", "hi", "p", "p_adj", "n", "paired", "method",
           "testable", "significant", "mde", "family", "correction", "level"]
EXPLORATORY = "exploratory"  # the correction of a comparison outside a study's declared family: never marked


def is_rope(cells: pd.DataFrame) -> pd.Series:
    """Cells that are RoPE itself, as the encoding registry says from their identity columns (kind rope, hdrope
    at N = 2 with any basis: NOTES §1, partial RoPE and p-RoPE at fraction 1)."""
    return pd.Series([identity_is_rope(row) for _, row in cells.iterrows()], index=cells.index, dtype=bool)


def references(cells: pd.DataFrame) -> dict[str, str]:
    """variant -> the RoPE variant with the same other axes, which the tables test it against."""
    axes = variant_axes(cells)
    refs: dict[str, str] = {}
    for _, g in cells.groupby(axes, dropna=False) if axes else [(None, cells)]:
        rope = g[is_rope(g)].sort_values("variant_rank")
        if not rope.empty:
            ref = rope["variant"].iloc[0]
            refs.update({v: ref for v in g["variant"].unique() if v != ref})
    return refs


def _at(values: pd.DataFrame, variant: str, theta: float) -> pd.Series:
    """A variant's per-seed values at θ; a variant without θ (NoPE, ALiBi) has the same values at every θ."""
    mine = values[values["variant"] == variant]
    if mine["theta"].isna().all():
        return mine.set_index("seed")["value"]
    at = mine[np.isclose(mine["theta"].astype(float), theta)] if np.isfinite(theta) else mine[mine["theta"].isna()]
    return at.set_index("seed")["value"]


def arms(values: pd.DataFrame, variant: str, reference: str, theta: float) -> tuple[pd.Series, pd.Series]:
    """The per-seed values (seed_values rows) of a variant and of its reference at θ, as a comparison pairs them:
    a variant without θ against the reference at each of the reference's θ."""
    return _at(values, variant, theta), _at(values, reference, theta)


def pair_row(values: pd.DataFrame, metric: str, variant: str, reference: str, theta: float,
             level: float = 0.95) -> dict | None:
    """The uncorrected comparison variant − reference at θ from `seed_values` rows (paired by seed when both ran
    the same seeds, else Welch), as a row of COLUMNS before correction (plus sd); None when either did not run."""
    t, r = arms(values, variant, reference, theta)
    if t.empty or r.empty:
        return None
    paired = set(t.index) == set(r.index)
    c = (compare(t.sort_index().to_numpy(), r.sort_index().to_numpy(), paired=True, level=level) if paired
         else compare(t.to_numpy(), r.to_numpy(), paired=False, level=level))
    return {"metric": metric, "theta": theta, "variant": variant, "reference": reference,
            "delta": c.delta, "lo": c.lo, "hi": c.hi, "p": c.p, "n": c.n, "paired": c.paired,
            "method": c.method, "testable": c.testable, "sd": c.sd}


def _rows(cells: pd.DataFrame, metric: str, level: float) -> list[dict]:
    """The uncorrected comparisons of one metric: a row per (θ, variant with a RoPE reference) that both ran."""
    values = seed_values(cells, metric)
    refs = references(cells)
    rows = []
    thetas = sorted({float(t) for t in values["theta"].dropna()})
    for theta in thetas:
        for variant in sorted(refs, key=lambda v: values.loc[values["variant"] == v, "variant_rank"].min()):
            if (row := pair_row(values, metric, variant, refs[variant], theta, level)) is not None:
                rows.append(row)
    return rows


def comparison_family(cells: pd.DataFrame, metrics: list[str], level: float = 0.95,
                      correction: str = "holm") -> pd.DataFrame:
    """The comparisons of several metrics corrected as one family (a table whose columns are metrics, such as
    accuracy by length or effective lengths): the rows of `comparison_table` for each metric, with p_adj,
    significance and the detectable difference taken over all of them."""
    return corrected([r for m in metrics for r in _rows(cells, m, level)], level, correction)


def corrected(rows: list[dict], level: float = 0.95, correction: str = "holm", unanswered: int = 0) -> pd.DataFrame:
    """Uncorrected comparison rows (`pair_row`) as one family: p_adj by `correction`, significance, and the
    80%-power detectable difference at the Bonferroni level of the family. `unanswered`: comparisons the family
    declared but found no data for; they stay in it (as p = 1), so a lost question never loosens the others."""
    table = pd.DataFrame(rows, columns=[*COLUMNS, "sd"])
    alpha = 1 - level
    family = int(table["p"].notna().sum()) + unanswered
    padded = table["p"].tolist() + [1.0] * unanswered
    table["p_adj"] = adjust(padded, correction)[:len(table)] if len(table) else []
    table["significant"] = table["testable"].astype(bool) & (table["p_adj"] < alpha)
    table["mde"] = [detectable_difference(sd, n, paired=bool(pr), alpha=alpha / max(family, 1))
                    for sd, n, pr in zip(table["sd"], table["n"], table["paired"], strict=True)]
    table["family"], table["correction"], table["level"] = family, correction, level
    return table[COLUMNS]


def comparison_table(cells: pd.DataFrame, metric: str, level: float = 0.95, correction: str = "holm") -> pd.DataFrame:
    """One row per (θ, variant with a RoPE reference) that both ran: the difference variant − reference over
    seeds, its interval, p, the family-corrected p, whether it is significant, and the 80%-power detectable
    difference at the corrected level (Bonferroni bound of the family)."""
    return comparison_family(cells, [metric], level, correction)


def fmt(x: float, digits: int = 4) -> str:
    """A number for a table: fixed decimals, ±∞ for an unbounded end, '—' for no number (never 'nan')."""
    if x is None or not np.isfinite(x):
        return "—" if x is None or np.isnan(x) else ("∞" if x > 0 else "−∞")
    return f"{x:.{digits}f}"


def _p_text(p: float) -> str:
    return "—" if not np.isfinite(p) else f"{p:.3g}"


def verdict(row: pd.Series) -> str:
    """One honest line for a comparison row: the estimate, the test, and what may (not) be concluded."""
    design = f"{row['n']} paired seeds" if row["paired"] else f"unpaired (Welch), ≥{row['n']} seeds per arm"
    head = (f"{row['metric']}, {theta_text(row['theta'])}: {row['variant']} − {row['reference']} = "
            f"{fmt(row['delta'])}")
    if not np.isnan(row["lo"]):  # unbounded (±∞) where the exact test over these seeds can reject no shift
        head += f" [{fmt(row['lo'])}, {fmt(row['hi'])}]"
    enough = seeds_to_reach(1 - row["level"], True)
    if row["correction"] == EXPLORATORY:
        return (f"{head} (exploratory, not a declared question: uncorrected p = {_p_text(row['p'])}, "
                f"{row['n']} {'paired seeds' if row['paired'] else 'seeds per arm (Welch)'}): no mark, no conclusion.")
    if row["n"] < 2:
        return f"{head}; one seed per arm: nothing can be concluded (run at least {enough} paired seeds)."
    test = f"{design}, {row['method']} p = {_p_text(row['p'])}, {row['correction'].capitalize()} p = " \
           f"{_p_text(row['p_adj'])} over {row['family']}"
    if not row["testable"]:
        return (f"{head} ({design}): too few seeds to test — the exact sign-flip test cannot go below "
                f"p = {2 / 2 ** int(row['n']):.3g}; run at least {enough} paired seeds.")
    if row["significant"]:
        side = "lower" if row["delta"] < 0 else "higher"
        return f"{head} ({test}): {row['variant']} is {side} than {row['reference']}."
    if row["mde"] == 0:  # every seed gave the same difference: the spread that power is computed from is 0
        return f"{head} ({test}): no difference shown; every seed gave the same difference."
    return (f"{head} ({test}): no difference shown; differences under {fmt(row['mde'])} would likely go unseen "
            f"(80% power).")


def correction_text(correction: str) -> str:
    """The caption's name of a correction."""
    return CORRECTIONS[correction]
