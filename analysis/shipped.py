"""Shipped results: a study's per-seed results kept in the repository, and its report rebuilt from them alone.

`hdrope report NAME --ship experiments/results/<study>` writes a folder per study:

- `cells.csv`: one row per cell of results.parquet (every axis value, the encoding label columns, seed, status,
  config hash, every final metric, the machine fields where the results have them), without the run directory;
  plus what the report reads from run files, per trained cell: `efflen_*` (effective lengths, from the loss by
  position and the task accuracies) and `passkey_n` (prompts behind `passkey_acc`).
- `comparisons.csv`: the report's comparison table (`analysis.comparisons.COLUMNS`).
- `study.json`: the study's name, axes, seed axes, declared questions, the column types of cells.csv, and its row
  count and sha256, so a cut or edited cells.csv is refused; `rules`, the version of each derived definition its
  columns follow (`task_effective_length`: `analysis.distance.RULE_VERSION`). A study shipped under another
  version (or before versions were recorded: 1) is read without those columns, and says so (`Study.stale`), until
  it is shipped again from its runs; `restamp` rewrites its folder without them.

Every read of a shipped folder checks study.json against its schema, cells.csv against what study.json records
(whole, the same columns, the same study, types that keep every value, no infinite metric, each cell once), and
names the file, the field or cell and the fix when something does not hold: a silent wrong number is worse than a
refusal.

`rebuild(folder)` (`hdrope report --from-results FOLDER`) gives the study's report tables and verdicts from these
files alone: no run directories, no MLflow, no Ray. `drift(folder)` says where comparisons.csv and what cells.csv
gives disagree.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from analysis.comparisons import COLUMNS
from analysis.variants import trained
from hdrope.errors import UserError

__all__ = ["CELLS_FILE", "COMPARISONS_FILE", "STUDY_FILE", "Study", "add_stage", "drift", "load_study", "rebuild",
           "refuse_overwrite", "restamp", "rules", "ship"]

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
    stale: list[str] = field(default_factory=list)  # derived columns dropped: shipped under another rule

    @property
    def cells(self) -> pd.DataFrame:
        """The trained cells with their variants, as the report groups them."""
        return trained(self.results)


def rules() -> dict[str, int]:
    """The version of each derived definition a study shipped now follows."""
    from analysis.distance import RULE_VERSION

    return {"task_effective_length": RULE_VERSION}


def _stale_columns(study: dict, columns: list[str]) -> list[str]:
    """The derived columns of cells.csv its study.json says follow another rule than this code's."""
    from analysis.lengthgen import EFFECTIVE_PREFIXES

    shipped = study.get("rules", {}).get("task_effective_length", 1)
    if shipped == rules()["task_effective_length"]:
        return []
    return [c for c in columns if c.startswith(EFFECTIVE_PREFIXES) and c != "efflen_loss"]


def _run_file_columns(sweep_dir: Path) -> pd.DataFrame:
    """cell_id plus what the report reads from run files, per trained cell: efflen_*, the loss reading's reason
    and passkey_n."""
    from analysis.lengthgen import EFFECTIVE_PREFIXES, LOSS_REASON, with_effective_lengths
    from analysis.load import sweep_cells
    from analysis.outcomes import read_passkey

    cells = with_effective_lengths(sweep_cells(sweep_dir))
    out = cells[["cell_id", *(c for c in cells if c.startswith(EFFECTIVE_PREFIXES) or c == LOSS_REASON)]].copy()
    out["passkey_n"] = [len(read_passkey(p)) if Path(p).is_file() else math.nan for p in cells["passkey_path"]]
    return out if out["passkey_n"].notna().any() else out.drop(columns="passkey_n")


def refuse_overwrite(out: str | Path, folder: str | Path) -> Path:
    """`out` as a path the report may be written to: UserError when it is one of the shipped folder's own files (or
    the folder), or its directory does not exist."""
    out, folder = Path(out), Path(folder)
    inputs = {folder.resolve(), *((folder / f).resolve() for f in (CELLS_FILE, COMPARISONS_FILE, STUDY_FILE))}
    if out.resolve() in inputs:
        raise UserError(f"--out {out}: that is {'the folder' if out.resolve() == folder.resolve() else 'a file'} the "
                        f"report is rebuilt from ({folder}); write the report elsewhere, e.g. --out report.md")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: the directory {out.parent} does not exist; create it or give another path")
    return out


def ship(sweep_dir: str | Path, folder: str | Path, force: bool = False, add: bool = False) -> list[Path]:
    """Write a finished sweep's cells.csv, comparisons.csv and study.json into folder; returns the files. A folder
    that holds another study's shipped results is refused unless `force`. With `add`, the sweep is a later stage of
    the study shipped there (more seeds of the same design): its cells join the shipped ones (`add_stage`)."""
    from analysis.load import find_sweep_dir, load_results
    from sweeps.plan_file import PLAN_FILE, load_plan

    sweep_dir, folder = find_sweep_dir(sweep_dir), Path(folder)
    results = load_results(sweep_dir)
    plan = load_plan(sweep_dir) if (sweep_dir / PLAN_FILE).is_file() else None
    name = plan.spec.name if plan else sweep_dir.name
    held = _held_study(folder)
    if held is not None and held != name and not force:
        raise UserError(f"--ship {folder}: the folder holds the shipped results of study {held!r}, not {name!r}; "
                        f"ship {name} into a folder of its own (e.g. experiments/results/{name}), or pass --force to "
                        "replace them")
    questions = [dict(variant=q.variant, reference=q.reference, metric=q.metric)
                 for q in (plan.spec.questions if plan else [])]
    extra = _run_file_columns(sweep_dir)
    table = results.drop(columns=[c for c in _DROPPED if c in results]).merge(extra, on="cell_id", how="left")
    table.attrs = dict(results.attrs)
    if add:
        table = add_stage(load_study(folder), table, questions)
    return _write(folder, table, name, questions)


def add_stage(shipped: Study, stage: pd.DataFrame, questions: list[dict]) -> pd.DataFrame:
    """The shipped study's cells with a later stage's appended: the same study (axes, seed axes, declared
    questions), none of its cells shipped already (by cell id or config hash), its columns those of the shipped
    cells; UserError naming what differs and the fix."""
    fix = "ship the stage into a folder of its own, or run it under the shipped study's spec"
    where = f"--add {shipped.folder}"
    if shipped.stale:
        raise UserError(f"{where}: the shipped cells follow an older rule ({', '.join(shipped.stale)}); ship the "
                        "whole study again from its runs")
    old = shipped.results
    for key in ("axes", "seed_axes"):
        if list(stage.attrs.get(key, [])) != list(old.attrs.get(key, [])):
            raise UserError(f"{where}: the sweep's {key} {stage.attrs.get(key)} are not the shipped study's "
                            f"{old.attrs.get(key)}; {fix}")
    held = [dict(variant=q.variant, reference=q.reference, metric=q.metric) for q in shipped.questions]
    if held != questions:
        raise UserError(f"{where}: the sweep declares {questions}, the shipped study {held}: not one study; {fix}")
    for key in ("cell_id", "config_hash"):
        again = sorted(set(stage[key].dropna()) & set(old[key].dropna()))
        if again:
            raise UserError(f"{where}: {key} {again[0]!r} is shipped already ({len(again)} cells in all): a stage "
                            "adds cells the study does not have, e.g. seeds it has not run")
    if set(stage.columns) != set(old.columns):
        raise UserError(f"{where}: the sweep's columns differ from the shipped cells' (only the sweep: "
                        f"{sorted(set(stage.columns) - set(old.columns))[:4]}, only shipped: "
                        f"{sorted(set(old.columns) - set(stage.columns))[:4]}); {fix}")
    table = pd.concat([old, stage[list(old.columns)]], ignore_index=True)
    table.attrs = dict(old.attrs)
    return table


def _write(folder: Path, table: pd.DataFrame, name: str, questions: list[dict]) -> list[Path]:
    """Write cells.csv (the table), the comparisons its reader will get, and study.json under this code's rules."""
    from analysis.report import report_tables

    text = _csv(table)
    study = {"name": name, "axes": table.attrs.get("axes", []),
             "seed_axes": table.attrs.get("seed_axes", []), "questions": questions,
             "columns": {c: str(t) for c, t in table.dtypes.items()}, "rows": len(table),
             "cells_sha256": hashlib.sha256(text.encode()).hexdigest(), "rules": rules()}
    back = _read_cells(text, study, folder)  # what a reader will get: the report is computed from exactly that
    _, tests = report_tables(back, trained(back), _questions(questions))
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / CELLS_FILE, folder / COMPARISONS_FILE, folder / STUDY_FILE]
    written[0].write_text(text)
    written[1].write_text(_comparisons_csv(tests))
    written[2].write_text(json.dumps(study, indent=1) + "\n")
    return written


def restamp(folder: str | Path) -> list[Path]:
    """Rewrite a shipped study's folder under this code's rules from its own files: the columns shipped under
    another rule are dropped (never recomputed: their run files are not here), everything else kept as shipped."""
    study = load_study(folder)
    table = study.results.drop(columns=[c for c in ("variant", "variant_rank") if c in study.results])
    table.attrs = dict(study.results.attrs)
    questions = [dict(variant=q.variant, reference=q.reference, metric=q.metric) for q in study.questions]
    return _write(Path(folder), table, study.name, questions)


def _held_study(folder: Path) -> str | None:
    """The name of the study whose shipped files are in folder (None when it holds none of them)."""
    if not any((folder / f).exists() for f in (CELLS_FILE, COMPARISONS_FILE, STUDY_FILE)):
        return None
    try:
        name = json.loads((folder / STUDY_FILE).read_text()).get("name")
    except (OSError, ValueError, AttributeError):  # a folder of shipped files whose study.json is gone or damaged
        return "(unreadable study.json)"
    return str(name)


def _csv(table: pd.DataFrame) -> str:
    return table.to_csv(index=False, float_format="%.17g", lineterminator="\n")


def _comparisons_csv(tests: list[pd.DataFrame]) -> str:
    frames = [t for t in tests if len(t)]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    return table[COLUMNS].to_csv(index=False, float_format="%.17g", lineterminator="\n")


def _questions(raw: list[dict]) -> list[Any]:
    return [SimpleNamespace(variant=q["variant"], reference=q["reference"], metric=q["metric"]) for q in raw]


_TYPES = {"str", "object", "string", "int64", "float64", "bool"}  # what study.json may type a column as
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _study_problem(study: Any) -> str | None:
    """What is wrong with a study.json's content, naming the field (None when it is one)."""
    if not isinstance(study, dict):
        return f"holds a {type(study).__name__}, not a mapping of name, axes, seed_axes, questions and columns"
    if not isinstance(study.get("name"), str) or not study.get("name"):
        return f"field 'name' is {study.get('name')!r}, not the study's name"
    for key in ("axes", "seed_axes"):
        value = study.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return f"field {key!r} is {value!r}, not a list of column names"
    questions = study.get("questions")
    if not isinstance(questions, list):
        return f"field 'questions' is {questions!r}, not a list (an empty one when the study declared none)"
    for i, q in enumerate(questions):
        if not isinstance(q, dict) or set(q) != {"variant", "reference", "metric"} or not all(
                isinstance(v, str) and v for v in q.values()):
            return f"questions[{i}] is {q!r}, not a mapping of variant, reference and metric"
    from analysis.questions import duplicate_questions

    repeated = duplicate_questions(_questions(questions))
    if repeated:
        return repeated[0]
    columns = study.get("columns")
    if not isinstance(columns, dict) or not all(isinstance(k, str) and v in _TYPES for k, v in columns.items()):
        return f"field 'columns' is not a mapping of column name to one of {sorted(_TYPES)}"
    if "rows" in study and (isinstance(study["rows"], bool) or not isinstance(study["rows"], int) or study["rows"] < 0):
        return f"field 'rows' is {study['rows']!r}, not a count of cells"
    digest = study.get("cells_sha256", "0" * 64)
    if not (isinstance(digest, str) and _SHA256.match(digest)):
        return f"field 'cells_sha256' is {digest!r}, not a sha256 in hex"
    recorded = study.get("rules", {})
    if not isinstance(recorded, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                                 for k, v in recorded.items()):
        return f"field 'rules' is {recorded!r}, not a mapping of definition name to version number"
    return None


def _cells_problem(text: str, study: dict) -> str | None:
    """What is wrong with cells.csv's text against its study.json: cut or changed since shipping (its recorded
    sha256 and row count), or a row without every column (a file cut inside its last row)."""
    rows = list(csv.reader(io.StringIO(text)))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    missing = [c for c in study["columns"] if c not in header]
    extra = [c for c in header if c not in study["columns"]]
    if missing or extra:
        return (f"its columns are not the ones study.json lists (missing {missing[:4]}, not listed {extra[:4]}): the "
                "two files are not one study's")
    if "cells_sha256" in study and hashlib.sha256(text.encode()).hexdigest() != study["cells_sha256"]:
        return "does not match the sha256 study.json records (cut or edited since it was shipped)"
    if text and not text.endswith("\n"):
        return "does not end its last row with a newline, as every shipped cells.csv does (the file is cut)"
    short = next((i for i, r in enumerate(body) if len(r) != len(header)), None)
    if short is not None:
        return f"row {short + 2} has {len(body[short])} fields, not the header's {len(header)} (the file is cut)"
    if "rows" in study and len(body) != study["rows"]:
        return f"has {len(body)} rows, not the {study['rows']} study.json records (cut or edited since it was shipped)"
    return None


def _read_cells(text: str, study: dict, folder: Path | str = "") -> pd.DataFrame:
    """cells.csv as the results table it was written from: each column's type restored, empty text as missing;
    UserError naming the column and cell when a type would change a value."""
    types = study["columns"]
    strings = [c for c, t in types.items() if t in ("object", "string", "str")]
    df = pd.read_csv(io.StringIO(text), dtype={c: str for c in strings}, keep_default_na=False, na_values=[""])
    where = f"{Path(folder) / CELLS_FILE}"
    for c, t in types.items():
        if c in df and c not in strings:
            if t == "int64":
                as_float = pd.to_numeric(df[c], errors="coerce")
                bad = df[c].notna() & (as_float.isna() | (as_float != as_float.round()) | ~np.isfinite(as_float))
                if bad.any():
                    raise UserError(f"{where}: study.json types column {c!r} as int64, but cell "
                                    f"{_cell(df, bad)} holds {df.loc[bad, c].iloc[0]!r}, which that type would change; "
                                    "ship the study again (`hdrope report NAME --ship FOLDER`) or restore study.json")
            df[c] = df[c].astype(t)
    for c in strings:
        if c in df:
            df[c] = df[c].astype(object).where(df[c].notna(), None)
    df.attrs = {"axes": list(study["axes"]), "seed_axes": list(study["seed_axes"])}
    return df


def _cell(df: pd.DataFrame, rows: pd.Series) -> str:
    return str(df.loc[rows, "cell_id"].iloc[0]) if "cell_id" in df else f"row {int(rows.idxmax()) + 2}"


def _results_problem(results: pd.DataFrame, study: dict) -> str | None:
    """What is wrong with the cells read back: another study's, a cell twice, an infinite metric."""
    if "sweep" in results and results["sweep"].notna().any():
        names = sorted(set(results["sweep"].dropna()))
        if names != [study["name"]]:
            return f"holds the cells of {names}, but study.json is study {study['name']!r}: not one study's files"
    if "cell_id" in results and results["cell_id"].duplicated().any():
        return f"holds cell {results.loc[results['cell_id'].duplicated(), 'cell_id'].iloc[0]!r} twice"
    for c in results.select_dtypes(include="number"):
        inf = np.isinf(results[c])
        if inf.any():
            value = results.loc[inf, c].iloc[0]
            return f"cell {_cell(results, inf)} has {c} = {value}: an infinite value, not a result"
    return None


def load_study(folder: str | Path) -> Study:
    """A shipped study's files read back; UserError naming the folder, the file and what is missing or damaged."""
    folder = Path(folder)
    missing = [f for f in (CELLS_FILE, COMPARISONS_FILE, STUDY_FILE) if not (folder / f).is_file()]
    if missing:
        raise UserError(f"{folder}: not a shipped study (missing {', '.join(missing)}); write one with "
                        "`hdrope report NAME --ship FOLDER`")
    fix = "ship it again with `hdrope report NAME --ship FOLDER`"
    try:
        study = json.loads((folder / STUDY_FILE).read_text())
    except ValueError as err:  # a damaged study.json
        raise UserError(f"{folder / STUDY_FILE}: not readable JSON ({err}); {fix}") from None
    if (problem := _study_problem(study)) is not None:
        raise UserError(f"{folder / STUDY_FILE}: {problem}; {fix}")
    text = (folder / CELLS_FILE).read_text()
    if (problem := _cells_problem(text, study)) is not None:
        raise UserError(f"{folder / CELLS_FILE}: {problem}; {fix}")
    try:
        results = _read_cells(text, study, folder)
        comparisons = pd.read_csv(folder / COMPARISONS_FILE) if (folder / COMPARISONS_FILE).stat().st_size else None
    except (ValueError, KeyError, TypeError) as err:  # pandas' parse errors and a type it cannot convert to
        why = f"{type(err).__name__}: {str(err)[:120]}"
        raise UserError(f"{folder}: a shipped file is damaged ({why}); {fix}") from None
    if (problem := _results_problem(results, study)) is not None:
        raise UserError(f"{folder / CELLS_FILE}: {problem}; {fix}")
    stale = _stale_columns(study, list(results.columns))
    if stale:
        attrs = dict(results.attrs)
        results = results.drop(columns=stale)
        results.attrs = attrs
    return Study(study["name"], folder, results, _questions(study["questions"]), comparisons, stale)


def study_tests(study: Study) -> list[pd.DataFrame]:
    """The comparison tables the report draws from the study's cells."""
    from analysis.report import report_tables

    return report_tables(study.results, study.cells, study.questions)[1]


def rebuild(folder: str | Path) -> str:
    """The study's report (outcome and length tables, declared and exploratory comparisons, verdicts) as Markdown,
    from its shipped files alone."""
    from analysis.machines import machine_lines
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
          "every interval and test.", "", *machine_lines(cells), ""]
    if study.stale:
        md += [f"_Not shown: {', '.join(study.stale)}, shipped under an earlier definition of the task effective "
               "lengths (windows pooled); ship the study again from its runs to read them._", ""]
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
