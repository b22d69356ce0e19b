"""Which machines a sweep's cells ran on, and which comparisons mix machines, as lines of the report.

The results table carries each cell's machine (`trainer.files.machine.MACHINE_COLUMNS`, from run.json). Float kernels
differ between CPU capabilities, GPUs and torch versions (`KERNEL_KEYS`), so a cell repeats to the last bit only on
its own machine; a comparison whose cells ran on several is said to, with the machines named.
"""

from __future__ import annotations

import pandas as pd

from analysis.comparisons import references
from trainer.files.machine import KERNEL_KEYS, MACHINE_COLUMNS, machine_label

__all__ = ["machine_lines"]


def _labels(cells: pd.DataFrame) -> pd.Series:
    """Each cell's machine as a phrase (None where none is recorded)."""
    have = [k for k in MACHINE_COLUMNS if k in cells]
    recorded = cells[have].notna().any(axis=1) if have else pd.Series(False, index=cells.index)
    rows = cells[have].astype(object).where(cells[have].notna(), None)  # a table's NaN is "not recorded"
    return pd.Series([machine_label(row.to_dict()) if ok else None
                      for (_, row), ok in zip(rows.iterrows(), recorded, strict=True)], index=cells.index, dtype=object)


def _kernels(cells: pd.DataFrame) -> pd.Series:
    """Each cell's kernel key: the machine fields its float results depend on (None where none is recorded)."""
    have = [k for k in KERNEL_KEYS if k in cells]
    return pd.Series([None if not row.notna().any() else " | ".join("" if pd.isna(v) else str(v) for v in row)
                      for _, row in cells[have].iterrows()], index=cells.index, dtype=object)


def _counted(labels: pd.Series) -> str:
    counts = labels.value_counts(dropna=True)
    return "; ".join(f"{n} cell{'s' if n != 1 else ''} on {label}" for label, n in counts.items())


def machine_lines(cells: pd.DataFrame) -> list[str]:
    """The report's lines on machines: where the trained cells ran, and a warning naming each group of comparisons
    (variant vs its RoPE reference) whose cells ran on machines with different float kernels."""
    labels = _labels(cells)
    missing = int(labels.isna().sum())
    if missing == len(cells):
        return ["Machines: not recorded (run.json before the machine record); numbers repeat to the last bit only "
                "on the machine that made them."]
    lines = [f"Machines: {_counted(labels)}" + (f"; {missing} cells with no machine recorded" if missing else "")
             + ". The same seeds and config repeat to the last bit only on the same machine (CPU capability or "
               "GPU, torch version)."]
    kernels = _kernels(cells)
    mixed: dict[str, list[str]] = {}
    for variant, ref in references(cells).items():
        mine = cells["variant"].isin([variant, ref])
        if kernels[mine].dropna().nunique() > 1:
            mixed.setdefault(_counted(labels[mine]), []).append(f"{variant} vs {ref}")
    for where, pairs in mixed.items():
        lines.append(f"**Warning**: the cells of {', '.join(pairs)} ran on different machines ({where}); their "
                     "float kernels differ, so part of a difference may be the machines'. Rerun them on one machine "
                     "to compare like with like.")
    return lines
