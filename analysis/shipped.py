"""Shipped results: a study's per-seed results kept in the repository, and its report rebuilt from them alone.

`hdrope report NAME --ship experiments/results/<study>` writes a folder per study:

- `cells.csv`: one row per cell of results.parquet (every axis value, the encoding label columns, seed, status,
  config hash, every final metric, the machine fields where the results have them), without the run directory;
  plus what the report reads from run files, per trained cell: `efflen_*` (effective lengths, from the loss by
  position and the task accuracies) and `passkey_n` (prompts behind `passkey_acc`).
- `comparisons.csv`: the report's comparison table (`analysis.comparisons.COLUMNS`).
- `study.json`: the study's name, axes, seed axes, declared questions and the column types of cells.csv.

`rebuild(folder)` (`hdrope report --from-results FOLDER`) gives the study's report tables and verdicts from these
files alone: no run directories, no MLflow, no Ray. `drift(folder)` says where comparisons.csv and what cells.csv
gives disagree.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from analysis.comparisons import COLUMNS
from analysis.variants import trained
from hdrope.errors import UserError

__all__ = ["CELLS_FILE", "COMPARISONS_FILE", "STUDY_FILE", "Study", "drift", "load_study", "rebuild", "ship"]

CELLS_FILE, COMPARISONS_FILE, STUDY_FILE = "cells.csv", "comparisons.csv", "study.json"
_DROPPED = ("run_dir",)  # where the cell ran: meaningless outside the machine that ran it


@dataclass
class Study:
    """A shipped study read back: its results table (attrs: axes, seed axes), questions and comparisons."""

    name: str
    folder: Path
    results: pd.DataFrame
    questions: list[Any] = field(default_factory=list)
    comparisons: pd.DataFrame | None = None

    @property
    def cells(self) -> pd.DataFrame:
        """The trained cells with their variants, as the report groups them."""
        return trained(self.results)


def _run_file_columns(sweep_dir: Path) -> pd.DataFrame:
    """cell_id plus what the report reads from run files, per trained cell: efflen_*, the loss reading's reason
    and passkey_n."""
    from analysis.lengthgen import LOSS_REASON, with_effective_lengths
    from analysis.load import sweep_cells
    from analysis.outcomes import read_passkey

    cells = with_effective_lengths(sweep_cells(sweep_dir))
    out = cells[["cell_id", *(c for c in cells if c.startswith("efflen_") or c == LOSS_REASON)]].copy()
    out["passkey_n"] = [len(read_passkey(p)) if Path(p).is_file() else math.nan for p in cells["passkey_path"]]
    return out if out["passkey_n"].notna().any() else out.drop(columns="passkey_n")


def ship(sweep_dir: str | Path, folder: str | Path) -> list[Path]:
    """Write a finished sweep's cells.csv, comparisons.csv and study.json into folder; returns the files."""
    from analysis.load import find_sweep_dir, load_results
    from analysis.report import report_tables
    from sweeps.plan_file import PLAN_FILE, load_plan

    sweep_dir, folder = find_sweep_dir(sweep_dir), Path(folder)
    results = load_results(sweep_dir)
    plan = load_plan(sweep_dir) if (sweep_dir / PLAN_FILE).is_file() else None
    questions = [dict(variant=q.variant, reference=q.reference, metric=q.metric)
                 for q in (plan.spec.questions if plan else [])]
    extra = _run_file_columns(sweep_dir)
    table = results.drop(columns=[c for c in _DROPPED if c in results]).merge(extra, on="cell_id", how="left")
    table.attrs = dict(results.attrs)
    study = {"name": plan.spec.name if plan else sweep_dir.name, "axes": results.attrs.get("axes", []),
             "seed_axes": results.attrs.get("seed_axes", []), "questions": questions,
             "columns": {c: str(t) for c, t in table.dtypes.items()}}
    back = _read_cells(_csv(table), study)  # what a reader will get: the report is computed from exactly that
    _, tests = report_tables(back, trained(back), _questions(questions))
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / CELLS_FILE, folder / COMPARISONS_FILE, folder / STUDY_FILE]
    written[0].write_text(_csv(table))
    written[1].write_text(_comparisons_csv(tests))
    written[2].write_text(json.dumps(study, indent=1) + "\n")
    return written


def _csv(table: pd.DataFrame) -> str:
    return table.to_csv(index=False, float_format="%.17g", lineterminator="\n")


def _comparisons_csv(tests: list[pd.DataFrame]) -> str:
    frames = [t for t in tests if len(t)]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    return table[COLUMNS].to_csv(index=False, float_format="%.17g", lineterminator="\n")


def _questions(raw: list[dict]) -> list[Any]:
    return [SimpleNamespace(variant=q["variant"], reference=q["reference"], metric=q["metric"]) for q in raw]


def _read_cells(text: str, study: dict) -> pd.DataFrame:
    """cells.csv as the results table it was written from: each column's type restored, empty text as missing."""
    from io import StringIO

    types = study["columns"]
    strings = [c for c, t in types.items() if t in ("object", "string", "str")]
    df = pd.read_csv(StringIO(text), dtype={c: str for c in strings}, keep_default_na=False, na_values=[""])
    for c, t in types.items():
        if c in df and c not in strings:
            df[c] = df[c].astype(t)
    for c in strings:
        if c in df:
            df[c] = df[c].astype(object).where(df[c].notna(), None)
    df.attrs = {"axes": list(study["axes"]), "seed_axes": list(study["seed_axes"])}
    return df


def load_study(folder: str | Path) -> Study:
    """A shipped study's files read back; UserError naming the folder and what is missing or damaged."""
    folder = Path(folder)
    missing = [f for f in (CELLS_FILE, COMPARISONS_FILE, STUDY_FILE) if not (folder / f).is_file()]
    if missing:
        raise UserError(f"{folder}: not a shipped study (missing {', '.join(missing)}); write one with "
                        "`hdrope report NAME --ship FOLDER`")
    try:
        study = json.loads((folder / STUDY_FILE).read_text())
        results = _read_cells((folder / CELLS_FILE).read_text(), study)
        comparisons = pd.read_csv(folder / COMPARISONS_FILE) if (folder / COMPARISONS_FILE).stat().st_size else None
    except (ValueError, KeyError, TypeError) as err:  # json/pandas parse errors, a study.json without its keys
        raise UserError(f"{folder}: a shipped file is damaged ({type(err).__name__}: {str(err)[:120]}); write it "
                        "again with `hdrope report NAME --ship FOLDER`") from None
    return Study(study["name"], folder, results, _questions(study.get("questions", [])), comparisons)


def study_tests(study: Study) -> list[pd.DataFrame]:
    """The comparison tables the report draws from the study's cells."""
    from analysis.report import report_tables

    return report_tables(study.results, study.cells, study.questions)[1]


def rebuild(folder: str | Path) -> str:
    """The study's report (outcome and length tables, declared and exploratory comparisons, verdicts) as Markdown,
    from its shipped files alone."""
    from analysis.report import report_tables, verdict_markdown

    study = load_study(folder)
    cells = study.cells
    if cells.empty:
        raise UserError(f"{folder}: no finished cell in {CELLS_FILE}")
    variants = list(dict.fromkeys(cells.sort_values("variant_rank")["variant"]))
    md = [f"# Study report: {study.name}", "",
          f"Rebuilt from the shipped results in {folder} ({CELLS_FILE}: {len(study.results)} cells, {len(cells)} "
          f"trained; no run directories). {len(variants)} variants: {', '.join(variants)}. Averaged over: "
          f"{', '.join(study.results.attrs['seed_axes']) or 'nothing (no seed axis)'}; the seed is the unit of "
          "every interval and test.", ""]
    tables, tests = report_tables(study.results, cells, study.questions)
    return "\n".join([*md, *tables, *verdict_markdown(tests)])


def drift(folder: str | Path) -> list[str]:
    """Where the shipped comparisons.csv and the comparisons its cells.csv gives disagree ([] when they agree)."""
    study = load_study(folder)
    frames = [t for t in study_tests(study) if len(t)]
    fresh = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    shipped = study.comparisons if study.comparisons is not None else pd.DataFrame(columns=COLUMNS)
    if len(fresh) != len(shipped):
        return [f"{COMPARISONS_FILE} has {len(shipped)} rows, {CELLS_FILE} gives {len(fresh)}"]
    problems = []
    for i, (a, b) in enumerate(zip(shipped[COLUMNS].to_dict("records"), fresh[COLUMNS].to_dict("records"),
                                   strict=True)):
        for c in COLUMNS:
            x, y = a[c], b[c]
            same = (np.isclose(float(x), float(y), rtol=1e-9, atol=1e-12, equal_nan=True)
                    if isinstance(y, (int, float, np.number)) and not isinstance(y, (bool, np.bool_))
                    else str(x) == str(y))
            if not same:
                problems.append(f"{COMPARISONS_FILE} row {i + 2}, {c}: shipped {x!r}, {CELLS_FILE} gives {y!r}")
    return problems
