"""The optimiser-mechanism comparison: is the Paley-vs-identity gap an optimiser effect?

A fixed basis Q is a re-parameterisation of W_q/W_k (NOTES §2), so any gain of Q = Paley over Q = I
must come from an optimiser (or init) that is not rotation-invariant. With an optimiser axis in the
sweep, this compares, at each θ, the gap val(4D identity) − val(4D Paley) under each optimiser, and
the difference of the gaps between the first optimiser (AdamW in the shipped spec) and each other
one, with 95% bootstrap CIs over seeds. `experiments/tables/mechanism_compact.yaml` is the study.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.stats import contrast_ci, excludes_zero
from analysis.variants import theta_text, value_text

__all__ = ["mechanism_lines", "optimizer_axis"]


def optimizer_axis(cells: pd.DataFrame) -> str | None:
    """The axis column that varies the optimiser (optim.name, or a whole `optim` mapping), if the sweep has one."""
    for key in cells.attrs.get("axes", []):
        if (key == "optim" or key.startswith("optim.name")) and key in cells and cells[key].nunique() > 1:
            return key
    return None


def _ci_text(c: dict[str, float]) -> str:
    if not np.isfinite(c["lo"]):
        return f"{c['value']:+.4f} (no CI: fewer than 2 seeds)"
    return f"{c['value']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}]"


def mechanism_lines(cells: pd.DataFrame, metric: str = "val_loss") -> list[str]:
    """Markdown bullet lines of the comparison (empty when the sweep has no optimiser axis or no 4D pair)."""
    axis = optimizer_axis(cells)
    if axis is None or metric not in cells:
        return []
    four = cells[cells["rotation_dim"] == 4]
    ident, paley = four[four["basis"] == "identity"], four[four["basis"] == "paley"]
    if ident.empty or paley.empty:
        return []
    labels = cells[axis].map(value_text)
    opts = list(dict.fromkeys(labels))
    lines = []
    for theta in sorted({float(t) for t in four["theta"].dropna()}):
        def values(frame: pd.DataFrame, opt: str, theta: float = theta) -> np.ndarray:
            at = frame[np.isclose(frame["theta"].astype(float), theta) & (frame[axis].map(value_text) == opt)]
            return at[metric].to_numpy(dtype=float)

        gaps = {o: contrast_ci([values(ident, o), values(paley, o)], [1.0, -1.0]) for o in opts}
        text = "; ".join(f"under {o}: {_ci_text(g)}" for o, g in gaps.items())
        lines.append(f"- {theta_text(theta)}, {metric}(4D identity) − {metric}(4D Paley), 95% CI: {text}")
        first = opts[0]
        for other in opts[1:]:
            d = contrast_ci([values(ident, first), values(paley, first), values(ident, other), values(paley, other)],
                            [1.0, -1.0, -1.0, 1.0])
            verdict = ("the gap under {a} exceeds the gap under {b}" if excludes_zero(d) and d["value"] > 0 else
                       "the gap under {a} is smaller than under {b}" if excludes_zero(d) else
                       "no difference between the gaps can be concluded")
            lines.append(f"  - gap({first}) − gap({other}) = {_ci_text(d)}: "
                         + verdict.format(a=first, b=other))
    return lines
