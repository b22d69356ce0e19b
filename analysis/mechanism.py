"""The optimiser-mechanism comparison: is the Paley-vs-identity gap an optimiser effect?

A fixed basis Q is a re-parameterisation of W_q/W_k (NOTES §2), so any gain of Q = Paley over Q = I
must come from an optimiser (or init) that is not rotation-invariant. With an optimiser axis in the
sweep, this compares, at each θ, the gap val(4D identity) − val(4D Paley) under each optimiser, and
the difference of the gaps between the first optimiser (AdamW in the shipped spec) and each other
one, with 95% Student-t intervals over seeds, paired by seed where the cells share seeds (one planned
contrast per θ, uncorrected). `experiments/tables/mechanism_compact.yaml` is the study.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.outcomes import seed_values
from analysis.stats import Comparison, compare
from analysis.variants import theta_text, value_text

__all__ = ["mechanism_lines", "optimizer_axis"]


def optimizer_axis(cells: pd.DataFrame) -> str | None:
    """The axis column that varies the optimiser (optim.name, or a whole `optim` mapping), if the sweep has one."""
    for key in cells.attrs.get("axes", []):
        if (key == "optim" or key.startswith("optim.name")) and key in cells and cells[key].nunique() > 1:
            return key
    return None


def _ci_text(c: Comparison) -> str:
    if np.isnan(c.lo):
        return f"{c.delta:+.4f} (no CI: fewer than 2 seeds)"
    if not np.isfinite(c.lo):
        return f"{c.delta:+.4f} (CI unbounded: {c.n} paired seeds are too few to test, p ≥ {c.min_p:.3g})"
    design = f"paired over {c.n} seeds" if c.paired else f"Welch, ≥{c.n} seeds per arm"
    return f"{c.delta:+.4f} [{c.lo:+.4f}, {c.hi:+.4f}] ({design}, p = {c.p:.3g})"


def _gap(ident: pd.Series, paley: pd.Series) -> pd.Series:
    """Per seed: identity − Paley over the seeds both ran (empty when they share none)."""
    return (ident - paley).dropna()


def mechanism_lines(cells: pd.DataFrame, metric: str = "val_loss") -> list[str]:
    """Markdown bullet lines of the comparison (empty when the sweep has no optimiser axis or no 4D pair)."""
    axis = optimizer_axis(cells)
    if axis is None or metric not in cells:
        return []
    four = cells[cells["rotation_dim"] == 4]
    if not ({"identity", "paley"} <= set(four["basis"])):
        return []
    opts = list(dict.fromkeys(cells[axis].map(value_text)))
    lines = []
    for theta in sorted({float(t) for t in four["theta"].dropna()}):
        def values(basis: str, opt: str, theta: float = theta) -> pd.Series:
            at = four[np.isclose(four["theta"].astype(float), theta) & (four["basis"] == basis)
                      & (four[axis].map(value_text) == opt)]
            return seed_values(at, metric).set_index("seed")["value"] if len(at) else pd.Series(dtype=float)

        def gap(opt: str) -> Comparison:
            i, p = values("identity", opt), values("paley", opt)
            same = set(i.index) == set(p.index)
            return compare(i.sort_index().to_numpy(), p.sort_index().to_numpy(), paired=same) if same else \
                compare(i.to_numpy(), p.to_numpy(), paired=False)

        gaps = {o: gap(o) for o in opts}
        text = "; ".join(f"under {o}: {_ci_text(g)}" for o, g in gaps.items())
        lines.append(f"- {theta_text(theta)}, {metric}(4D identity) − {metric}(4D Paley), 95% t-interval over "
                     f"seeds: {text}")
        first = opts[0]
        for other in opts[1:]:
            a = _gap(values("identity", first), values("paley", first))
            b = _gap(values("identity", other), values("paley", other))
            same = set(a.index) == set(b.index) and len(a) > 0
            d = compare(a.sort_index().to_numpy(), b.sort_index().to_numpy(), paired=True) if same else \
                compare(a.to_numpy(), b.to_numpy(), paired=False)
            verdict = ("too few seeds to test" if not d.testable else
                       "the gap under {a} exceeds the gap under {b}" if d.p < 0.05 and d.delta > 0 else
                       "the gap under {a} is smaller than under {b}" if d.p < 0.05 else
                       "no difference between the gaps can be concluded")
            lines.append(f"  - gap({first}) − gap({other}) = {_ci_text(d)}: " + verdict.format(a=first, b=other))
    return lines
