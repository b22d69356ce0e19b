"""The docs quote shipped studies through generated blocks, so every quoted number is checked against its files.

A quoted table sits between two markers in README.md or docs/*.md:

    <!-- results:<study>:<table> -->
    ...generated from experiments/results/<study>/ (`analysis.shipped`; a folder holding a benchmark's bench.json
    instead renders through `analysis.length_bench`)...
    <!-- /results -->

`hdrope report --docs` rewrites every block from the files (TABLES says which tables exist; `<table>-<metric>`
keeps one metric's rows), and
tests/test_shipped_results.py fails when a block differs from what the files give. Numbers from runs whose
per-seed results are not in the repository sit in a passage marked

    <!-- not-shipped:<study> -->
    ...a note that says NOTE, then the prose...
    <!-- /not-shipped -->

which the check exempts, and only while the study has no folder (a shipped study's passage must become blocks).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from analysis.comparisons import EXPLORATORY, fmt
from analysis.length_bench import BENCH_FILE, render_bench
from analysis.load import REPO_ROOT
from analysis.outcomes import seed_values
from analysis.shipped import Study, load_study
from analysis.variants import theta_text
from hdrope.errors import UserError

__all__ = ["BLOCK", "NOTE", "NOT_SHIPPED", "RESULTS_DIR", "TABLES", "doc_files", "problems", "regenerate", "render"]

RESULTS_DIR = REPO_ROOT / "experiments" / "results"
BLOCK = re.compile(r"<!-- results:(?P<study>[A-Za-z0-9_.-]+):(?P<table>[A-Za-z0-9_-]+) -->\n(?P<body>.*?)"
                   r"<!-- /results -->", re.S)
NOT_SHIPPED = re.compile(r"<!-- not-shipped:(?P<study>[A-Za-z0-9_.-]+) -->(?P<body>.*?)<!-- /not-shipped -->", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)  # a fenced code block: a block's example, not a quoted result
NOTE = "not yet shipped: these numbers come from runs whose per-seed results are not in the repository"


def doc_files(root: Path = REPO_ROOT) -> list[Path]:
    """The files whose numbers are checked: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _means(study: Study, metric: str) -> dict[tuple[str, float], float]:
    """(variant, θ or -1) -> mean over seeds of the per-seed values of metric."""
    if metric not in study.results:
        return {}
    v = seed_values(study.cells, metric)
    v["theta"] = v["theta"].astype(float).fillna(-1.0)
    return {k: float(x) for k, x in v.groupby(["variant", "theta"])["value"].mean().items()}


def _mark(r: pd.Series) -> str:
    if r["correction"] == EXPLORATORY:
        return "exploratory"
    return "*" if r["significant"] else ("too few seeds to test" if not r["testable"] else "n.s.")


def _design(r: pd.Series) -> str:
    return f"paired, {r['n']} seeds" if r["paired"] else f"Welch, ≥{r['n']} seeds/arm"


def _rows_table(study: Study, rows: pd.DataFrame, corrected: bool) -> str:
    head = ["metric", "θ", "variant", "mean", "reference", "mean", "Δ [95% CI]", "design", "p"]
    head += ["p (Holm)", ""] if corrected else [""]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in rows.iterrows():
        means = _means(study, r["metric"])
        theta = float(r["theta"]) if pd.notna(r["theta"]) else -1.0

        def mean(v: str, theta: float = theta, means: dict = means) -> str:
            return fmt(means.get((v, theta), means.get((v, -1.0), float("nan"))), 3)

        cells = [f"`{r['metric']}`", theta_text(None if theta < 0 else theta), r["variant"], mean(r["variant"]),
                 r["reference"], mean(r["reference"]), f"{fmt(r['delta'], 3)} [{fmt(r['lo'], 3)}, {fmt(r['hi'], 3)}]",
                 _design(r), fmt(r["p"], 3)]
        cells += [fmt(r["p_adj"], 3), _mark(r)] if corrected else [_mark(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _comparisons(study: Study, metric: str | None) -> pd.DataFrame:
    """The study's comparison rows (on `metric` only, when given)."""
    rows = study.comparisons if study.comparisons is not None else pd.DataFrame()
    return rows[rows["metric"] == metric] if metric and len(rows) else rows


def _declared(study: Study, metric: str | None = None) -> str:
    """The marked comparisons: the declared questions (Holm over them), or every table's comparisons when the
    study declared none."""
    rows = _comparisons(study, metric)
    table = _rows_table(study, rows[rows["correction"] != EXPLORATORY] if len(rows) else rows, corrected=True)
    return "\n".join([table, *_unanswered(study, rows, metric)])


def _unanswered(study: Study, rows: pd.DataFrame, metric: str | None) -> list[str]:
    """A row for each declared question (on `metric`, when given) without a comparison in the shipped file: it
    still counts in the family's correction."""
    have = {(r["metric"], r["variant"], r["reference"]) for _, r in rows.iterrows()} if len(rows) else set()
    lost = [q for q in study.questions if (q.metric, q.variant, q.reference) not in have
            and (metric is None or q.metric == metric)]
    return [f"| `{q.metric}` | | {q.variant} | | {q.reference} | | not answered: no value in the shipped cells | | "
            "| | counted in the family |" for q in lost]


def _exploratory(study: Study, metric: str | None = None) -> str:
    """The unmarked comparisons outside the declared family."""
    rows = _comparisons(study, metric)
    return _rows_table(study, rows[rows["correction"] == EXPLORATORY] if len(rows) else rows, corrected=False)


# table name -> what it renders from a shipped study; `<table>-<metric>` keeps the rows on that metric
TABLES: dict[str, Callable[[Study, str | None], str]] = {"declared": _declared, "exploratory": _exploratory}


def render(study: str, table: str, results_dir: Path = RESULTS_DIR) -> str:
    """The body of a `<!-- results:<study>:<table> -->` block (`<table>` or `<table>-<metric>`), from the study's
    shipped files."""
    if (results_dir / study / BENCH_FILE).is_file():  # a shipped benchmark, not a study
        return render_bench(results_dir / study, table)
    name, _, metric = table.partition("-")
    if name not in TABLES:
        raise UserError(f"results block {study}:{table}: no table {name!r}; choose one of {sorted(TABLES)}, "
                        "optionally followed by -<metric>")
    shipped = load_study(results_dir / study)
    if metric and (shipped.comparisons is None or metric not in set(shipped.comparisons["metric"])):
        raise UserError(f"results block {study}:{table}: the study compares no metric {metric!r}")
    return TABLES[name](shipped, metric or None) + "\n"


def _blocks(text: str) -> list[re.Match]:
    """The results blocks of a doc, outside fenced code (where a page shows the markers as an example)."""
    fences = [(m.start(), m.end()) for m in FENCE.finditer(text)]
    return [m for m in BLOCK.finditer(text) if not any(s <= m.start() < e for s, e in fences)]


def _exempt(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m["study"]) for m in NOT_SHIPPED.finditer(text)]


def problems(files: Iterable[Path], results_dir: Path = RESULTS_DIR) -> list[str]:
    """Every place a doc's quoted results disagree with the shipped files: a block that differs from its
    regeneration, a block of a study with no folder outside a not-shipped passage, an unknown table, and a
    not-shipped passage without the NOTE or of a study that is shipped by now."""
    found = []
    for path in files:
        text = path.read_text()
        exempt = _exempt(text)
        for start, end, study in exempt:
            if NOTE not in " ".join(text[start:end].split()).lower():
                found.append(f"{path}: the not-shipped passage of {study} does not say {NOTE!r}")
            if (results_dir / study).is_dir():
                found.append(f"{path}: {study} is shipped now ({results_dir / study}); replace its not-shipped "
                             "passage by results blocks")
        for m in _blocks(text):
            where = f"{path}:{text.count(chr(10), 0, m.start()) + 1}: results block {m['study']}:{m['table']}"
            if not (results_dir / m["study"]).is_dir():
                if not any(s <= m.start() < e and st == m["study"] for s, e, st in exempt):
                    found.append(f"{where}: no shipped results in {results_dir / m['study']}")
                continue
            try:
                want = render(m["study"], m["table"], results_dir)
            except UserError as err:
                found.append(f"{where}: {err}")
                continue
            if m["body"] != want:
                found.append(f"{where}: differs from the shipped files; run `hdrope report --docs`")
    return found


def regenerate(files: Iterable[Path], results_dir: Path = RESULTS_DIR) -> list[Path]:
    """Rewrite every block whose study is shipped from its files; returns the files that changed."""
    changed = []
    for path in files:
        text = path.read_text()
        new = text
        for m in reversed(_blocks(text)):
            if (results_dir / m["study"]).is_dir():
                block = (f"<!-- results:{m['study']}:{m['table']} -->\n{render(m['study'], m['table'], results_dir)}"
                         "<!-- /results -->")
                new = new[:m.start()] + block + new[m.end():]
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed
