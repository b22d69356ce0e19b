"""`hdrope report NAME`: the paper's tables and figures from a finished sweep, as Markdown + PNG.

Writes <sweep dir>/report/report.md and report/*.png, and logs them to the sweep's MLflow parent
run. Cells are grouped into variants by every axis except the seeds (`analysis.variants`). The seed is
the unit of replication everywhere:

- Outcome tables: per variant and θ, the mean over seeds with a 95% Student-t interval (accuracies as
  k/n prompts with Wilson's interval); `*` marks a difference to RoPE at that θ that survives the
  table's family correction (Holm), from `analysis.comparisons` (paired by seed where both variants
  ran the same seeds, exact sign-flip p; else Welch). A design that cannot reach 5% at all says
  "too few seeds to test". Each table is followed by its comparisons (Δ, CI, p, corrected p, the
  difference detectable at 80% power) and the report ends with a one-line verdict per comparison.
- Length generalisation (`lengthgen_section`, docs/length-generalisation.md): exact match by evaluated length per
  task (k/n, Wilson; "not learned" below 0.9 at 1x, without tests or verdicts) and effective lengths per seed, each
  table one Holm family named in its caption.
- Declared questions (a spec's `questions:`, `analysis.questions`): Holm over those comparisons only, and only they
  are marked; every other comparison is listed as exploratory, unmarked, and the tables above carry no marks.
- Costs (tokens/s, MFU, the final evaluation's seconds) are a separate table: the median over each run's history,
  never tested.
- Figures carry intervals over seeds and captions that say what they pooled (`analysis.figures`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.comparisons import comparison_family, comparison_table, correction_text, fmt, references, verdict
from analysis.distance import distance_grid, distance_notes, effective_length_text, task_rows
from analysis.figures import (
    Figure,
    accuracy_vs_length,
    fourier_figures,
    metric_vs_theta,
    passkey_fans,
    position_loss_figures,
    rank_figures,
)
from analysis.lengthgen import (
    DEFAULT_RULE,
    LEARNED_THRESHOLD,
    LOSS_REASON,
    LOSS_TOLERANCE,
    is_task_metric,
    learned_table,
    task_metrics,
    with_effective_lengths,
)
from analysis.load import load_results, missing_run_dirs, read_json, sweep_cells
from analysis.machines import machine_lines
from analysis.mechanism import mechanism_lines
from analysis.outcomes import COST_METRICS, cost_table, is_proportion, outcome_metrics, seed_values
from analysis.plots import save
from analysis.questions import declared_family, exploratory, questions_markdown
from analysis.stats import mean_interval, proportion_interval
from analysis.variants import theta_text, trained
from hdrope.errors import UserError
from trainer.files.machine import MACHINE_COLUMNS

if TYPE_CHECKING:
    from sweeps.plan import Plan

__all__ = ["ablation_table", "build_report", "comparisons", "lengthgen_section", "metric_columns", "references",
           "report_figures", "report_tables", "verdict_lines", "verdict_markdown"]

_NOT_METRICS = {"seed", "steps", "theta", "rotation_dim", "basis_seed", *MACHINE_COLUMNS}
LEVEL, CORRECTION = 0.95, "holm"


def metric_columns(results: pd.DataFrame) -> list[str]:
    """The numeric metric columns the cells produced (in the results table's order), axes and ids excluded."""
    axes = set(results.attrs.get("axes", []))
    found = [c for c in results.columns if c not in _NOT_METRICS and c not in axes
             and pd.api.types.is_float_dtype(results[c]) and results[c].notna().any()]
    return sorted(found, key=lambda c: 0 if c.startswith("val_") else 1 if c.startswith("passkey") else 2)


def _cells(results: pd.DataFrame) -> pd.DataFrame:
    """Trained cells with their variants; passkey tables located when the results name run directories."""
    df = trained(results)
    if "run_dir" in df:
        df["passkey_path"] = df["run_dir"].map(lambda d: Path(d) / "passkey.parquet")
    return df


def _cell_text(values: pd.DataFrame, proportion: bool) -> str:
    """'mean ± half-CI (n=k)' over seeds, or 'k/n = p% [lo, hi]' for counts; '—' when nothing was computed."""
    if values.empty:
        return "—"
    if proportion:
        k, n = int(values["k"].sum()), int(values["n"].sum())
        iv = proportion_interval(k, n, LEVEL)
        return f"{k}/{n} = {iv.estimate:.1%} [{iv.lo:.1%}, {iv.hi:.1%}] (seeds={len(values)})"
    iv = mean_interval(values["value"], LEVEL)
    if iv.n < 2:
        return f"{fmt(iv.estimate)} (n=1)"
    return f"{fmt(iv.estimate)} ± {fmt(iv.half_width)} (n={iv.n})"


def comparisons(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The calibrated comparisons of every variant with its RoPE reference for one metric (see
    `analysis.comparisons.comparison_table`)."""
    return comparison_table(_cells(results), metric, LEVEL, CORRECTION)


def ablation_table(results: pd.DataFrame, metric: str, marked: bool = True) -> pd.DataFrame:
    """Rows: variants (in identity order); columns: θ; cells: the mean over seeds ± half its 95% t-interval (n
    seeds), or k/n with Wilson's interval for accuracies; '*' where the difference to RoPE at that θ is significant
    after the table's Holm correction, 'too few seeds to test' where the design cannot reach 5%; no marks unless
    `marked` (a study with declared questions marks only those)."""
    cells = _cells(results)
    values = seed_values(cells, metric)
    proportion = is_proportion(cells, metric)
    marks = _marks(comparison_table(cells, metric, LEVEL, CORRECTION)) if marked else {}
    thetas = sorted({float(t) for t in values["theta"].dropna()}) + ([np.nan] if values["theta"].isna().any() else [])
    out: dict[str, dict[str, str]] = {}
    ranks = cells.drop_duplicates("variant").set_index("variant")["variant_rank"]
    for variant in sorted(cells["variant"].unique(), key=lambda v: ranks[v]):
        mine = values[values["variant"] == variant]
        for theta in thetas:
            at = mine[mine["theta"].isna()] if np.isnan(theta) else mine[np.isclose(mine["theta"], theta)]
            column = theta_text(None if np.isnan(theta) else theta)
            if at.empty and not (cells["variant"].eq(variant) & _theta_match(cells, theta)).any():
                continue
            out.setdefault(variant, {})[column] = _cell_text(at, proportion) + _mark(marks, metric, variant, theta)
    table = pd.DataFrame(out).T
    columns = [c for c in (theta_text(None if np.isnan(t) else t) for t in thetas) if c in table.columns]
    return table.loc[[v for v in sorted(out, key=lambda v: ranks[v])], columns].fillna("")


def _marks(tests: pd.DataFrame) -> dict[tuple[str, str], list[tuple[float, pd.Series]]]:
    """(metric, variant) -> [(θ, comparison row)] of a table's comparisons."""
    out: dict[tuple[str, str], list[tuple[float, pd.Series]]] = {}
    for _, r in tests.iterrows():
        out.setdefault((r["metric"], r["variant"]), []).append((float(r["theta"]), r))
    return out


def _mark(marks: dict[tuple[str, str], list[tuple[float, pd.Series]]], metric: str, variant: str, theta: float) -> str:
    """A cell's mark: ' *' significant, ' (too few seeds to test)', or ''. A θ-less cell (NoPE) takes the mark of
    its comparison when it was compared at one θ only."""
    at = [r for th, r in marks.get((metric, variant), []) if np.isnan(theta) or np.isclose(th, theta)]
    if len(at) != 1:
        return ""
    return " *" if at[0]["significant"] else (" (too few seeds to test)" if not at[0]["testable"] else "")


def _theta_match(cells: pd.DataFrame, theta: float) -> pd.Series:
    return cells["theta"].isna() if np.isnan(theta) else np.isclose(cells["theta"].astype(float), theta)


def _markdown(table: pd.DataFrame, index_name: str = "variant") -> str:
    cols = [index_name, *table.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in zip(table.index, table.values, strict=True):
        lines.append("| " + " | ".join([str(idx), *map(str, row)]) + " |")
    return "\n".join(lines)


def _comparison_markdown(tests: pd.DataFrame) -> str:
    """The comparisons under a table: Δ and CI, design, p, corrected p, mark, 80%-power detectable difference (and
    the metric, when the table's family spans several)."""
    several = tests["metric"].nunique() > 1
    lines = [f"| {'metric | ' if several else ''}θ | comparison | Δ [95% CI] | design | p | p (Holm) | | "
             "detectable at 80% power |", "|---|---|---|---|---|---|---|---|" + ("---|" if several else "")]
    for _, r in tests.iterrows():
        design = f"paired, {r['n']} seeds" if r["paired"] else f"Welch, ≥{r['n']} seeds/arm"
        mark = "*" if r["significant"] else ("too few seeds to test" if not r["testable"] else "n.s.")
        lines.append(f"| {r['metric'] + ' | ' if several else ''}{theta_text(r['theta'])} | {r['variant']} − "
                     f"{r['reference']} | {fmt(r['delta'])} "
                     f"[{fmt(r['lo'])}, {fmt(r['hi'])}] | {design}, {r['method']} | "
                     f"{fmt(r['p'], 3)} | {fmt(r['p_adj'], 3)} | {mark} | {fmt(r['mde'])} |")
    return "\n".join(lines)


def _table_notes(cells: pd.DataFrame, metric: str, tests: pd.DataFrame) -> list[str]:
    """The table's caption: what the intervals are, what the mark means, and what the data cannot conclude."""
    counts = seed_values(cells, metric).groupby(["variant", "theta"], dropna=False)["seed"].nunique()
    interval = ("k/n pooled over seeds and prompts with Wilson's 95% interval; tests use the per-seed accuracy "
                "(prompts are identical across variants within a seed)" if is_proportion(cells, metric) else
                "mean over seeds ± half the 95% Student-t interval; n = seeds")
    notes = [f"_Cells: {interval}._"]
    if len(counts) and counts.max() < 2:
        notes.append("_One seed per cell: no intervals, and no difference here can be tested._")
    elif len(tests):
        notes.append(f"_* differs from {', '.join(sorted(set(tests['reference'])))} at the same θ: "
                     f"{correction_text(CORRECTION)} over the {int(tests['family'].iloc[0])} comparisons of this "
                     "table, at 5%; paired by seed (exact sign-flip test) where both ran the same seeds, else "
                     "Welch. Unmarked differences are not established._")
    values = cells[metric].dropna()
    if len(values) and (values == 0).all():
        notes.append(f"_{metric} is 0 for every cell: no model solved the task at this training budget._")
    return notes


def _row_label(variant: str, theta: float, thetas: int) -> str:
    return variant if thetas < 2 else f"{variant}, {theta_text(None if np.isnan(theta) else theta)}"


def _metric_grid(cells: pd.DataFrame, columns: dict[str, str], tests: pd.DataFrame,
                 blocked: dict[tuple[str, float], str] | None = None) -> pd.DataFrame:
    """Rows: variant (and θ when it varies); one column per label -> metric; cells as `_cell_text` with the
    table's marks; a (variant, θ) in `blocked` shows its reason instead of values."""
    marks = _marks(tests)
    n_theta = cells["theta"].astype(float).fillna(-1.0).nunique()
    out: dict[str, dict[str, str]] = {}
    order = cells.assign(_t=cells["theta"].astype(float).fillna(-1.0)).sort_values(["variant_rank", "_t"])
    for (variant, t), g in order.groupby(["variant", "_t"], sort=False):
        theta = np.nan if t < 0 else float(t)
        row = out.setdefault(_row_label(variant, theta, n_theta), {})
        for label, metric in columns.items():
            values = seed_values(g, metric) if metric in g else pd.DataFrame()
            text = _cell_text(values, is_proportion(g, metric) if metric in g else False)
            text += _mark(marks, metric, variant, theta)
            if blocked and (variant, t) in blocked:
                text = blocked[(variant, t)] + (f": {text}" if label == next(iter(columns)) else "")
            row[label] = text
    return pd.DataFrame(out).T[list(columns)]


def _loss_reasons(cells: pd.DataFrame) -> str:
    """' (cells without a value: <reason> ×n, …)' for the loss effective length (cells with their LOSS_REASON
    column, as `with_effective_lengths` gives them), or ''."""
    reasons = cells[LOSS_REASON].dropna() if LOSS_REASON in cells else pd.Series(dtype=object)
    missing = pd.Series([r for r in reasons if not str(r).startswith(("crossed", "censored"))])
    return f" (cells without a value: {'; '.join(f'{r} ×{n}' for r, n in missing.value_counts().items())})" \
        if len(missing) else ""


def lengthgen_section(cells: pd.DataFrame, marked: bool = True) -> tuple[list[str], list[pd.DataFrame]]:
    """The length-generalisation tables (accuracy by length per task, effective lengths), each one Holm family
    named in its caption, with their comparisons; ([], []) when the cells have neither task metrics nor
    loss-by-position tables. Not `marked`: the tables without marks, their comparisons returned for the caller's
    exploratory part."""
    tasks = task_metrics(list(cells.columns))
    learned = learned_table(cells)
    cells = with_effective_lengths(cells, learned=learned)
    if not tasks and "efflen_loss" not in cells:
        return [], []
    md = ["## Length generalisation", ""]
    if tasks:
        md += [f"_A (variant, task) whose 1x exact match, pooled over its seeds, is below {LEARNED_THRESHOLD:g} is "
               "marked \"not learned\": it gets no length-generalisation test or verdict (an instrument flat at 1x "
               "reads the same for every encoding)._", ""]
    all_tests = []
    theta_key = cells["theta"].astype(float).fillna(-1.0)
    rows = task_rows(cells)
    for task, by_factor in tasks.items():
        mine = learned[learned["task"] == task]
        blocked = {(v, -1.0 if np.isnan(t) else t): "not learned"
                   for v, t, ok in zip(mine["variant"], mine["theta"], mine["learned"], strict=True) if not ok}
        masked = cells.copy()
        out = [(v, t) in blocked for v, t in zip(cells["variant"], theta_key, strict=True)]
        counts = ["n_" + m.removeprefix("acc_") for m in by_factor.values()]
        masked.loc[out, [*by_factor.values(), *(c for c in counts if c in masked)]] = np.nan  # no test, no verdict
        tests = comparison_family(masked, list(by_factor.values()), LEVEL, CORRECTION)
        all_tests.append(tests)
        grid = _metric_grid(cells, {f"{f:g}x": m for f, m in by_factor.items()}, tests if marked else tests[:0],
                            blocked)
        md += [f"### {task}: exact match by evaluated length", "", _markdown(grid), "",
               "_Cells: k/n pooled over seeds and prompts with Wilson's 95% interval; tests use the per-seed "
               "accuracy (prompts are identical across variants within a seed)._",
               *([f"_* differs from RoPE at that length: {correction_text(CORRECTION)} over the {len(tests)} "
                  f"comparisons of this table (one family: every learned variant × length), at 5%._"] * marked), ""]
        if len(tests) and marked:
            md += [_comparison_markdown(tests), ""]
        for _, mine in rows[rows["task"] == task].groupby("trained_distance"):
            md += [f"### {task}: exact match by window length and distance", "",
                   _markdown(distance_grid(cells, mine, set(blocked))), "",
                   *distance_notes(mine), ""]
    eff = {task: f"efflen_{task}" for task in tasks}
    eff.update({f"{task} by position": f"poslen_{task}" for task in tasks if f"poslen_{task}" in cells})
    if "efflen_loss" in cells:
        eff["loss"] = "efflen_loss"
    tests = comparison_family(cells, list(eff.values()), LEVEL, CORRECTION)
    all_tests.append(tests)
    task_text = (effective_length_text() if len(rows) else "in multiples of the train length: the longest evaluated "
                 f"length up to which {DEFAULT_RULE.text()} (not learned: no value)")
    md += ["### Effective length", "", _markdown(_metric_grid(cells, eff, tests if marked else tests[:0])), "",
           f"_Per seed. Tasks: {task_text}. Loss (× train length, analysis.loss_length): the first bin past the train "
           f"length where the same tokens' full-context loss exceeds their train-length-context loss by more than "
           f"{LOSS_TOLERANCE:g} nats beyond a Bonferroni one-sided bound over the bins; censored at the window "
           f"length when none does; no value when the model never learned to use context or the file predates the "
           f"paired columns{_loss_reasons(cells)}. Cells: mean over seeds ± half the 95% Student-t interval._",
           *([f"_* differs from RoPE: {correction_text(CORRECTION)} over the {len(tests)} comparisons of this table "
              "(one family), paired by seed where both ran the same seeds._"] * marked), ""]
    if len(tests) and marked:
        md += [_comparison_markdown(tests), ""]
    return md, all_tests


def _cost_markdown(cells: pd.DataFrame) -> list[str]:
    costs = cost_table(cells)
    if costs.empty:
        return []
    lines = ["## Costs (not model outcomes; untested)", "",
             "_Median over each run's logged history, then the median over the variant's cells (range in "
             "brackets). These measure the machine the cells shared, so no significance marks._", "",
             "| variant | θ | " + " | ".join(m for m in COST_METRICS if m in set(costs["metric"])) + " |",
             "|---|---|" + "---|" * costs["metric"].nunique()]
    order = costs.assign(_t=costs["theta"].fillna(-1)).sort_values(["variant_rank", "_t"])
    for (variant, theta), g in order.groupby(["variant", "_t"], sort=False):
        by = g.set_index("metric")
        vals = [f"{by.loc[m, 'median']:.4g} [{by.loc[m, 'lo']:.4g}, {by.loc[m, 'hi']:.4g}]"
                for m in COST_METRICS if m in by.index]
        lines.append(f"| {variant} | {theta_text(None if theta < 0 else theta)} | " + " | ".join(vals) + " |")
    return [*lines, ""]


def report_figures(sweep_dir: str | Path, head_dim: int | None = None) -> list[Figure]:
    """Every figure of the report for a sweep directory, unsaved (notebooks show them without writing)."""
    sweep_dir = Path(sweep_dir)
    cells = sweep_cells(sweep_dir)
    results = load_results(sweep_dir)
    metrics = outcome_metrics(metric_columns(results))
    figs = [f for m in ("val_loss", "val_loss_x2", "val_loss_x4", "passkey_acc") if m in metrics
            for f in metric_vs_theta(cells, m, LEVEL)]
    figs += passkey_fans(cells)
    figs += accuracy_vs_length(cells, LEVEL)
    figs += position_loss_figures(cells, LEVEL)
    figs += rank_figures(cells, LEVEL)
    figs += fourier_figures(cells, head_dim or _head_dim(_plan(sweep_dir)), LEVEL)
    return figs


def build_report(sweep_dir: str | Path, tracking_uri: str | None = None) -> Path:
    """Write report.md and its figures for a sweep directory; log them to its MLflow parent run."""
    sweep_dir = Path(sweep_dir)
    plan = _plan(sweep_dir)
    name = plan.spec.name if plan else sweep_dir.name
    results = load_results(sweep_dir)
    cells = sweep_cells(sweep_dir)
    if cells.empty:
        raise UserError(f"{sweep_dir}: no cell finished; see `hdrope sweep status {name}`")
    out = sweep_dir / "report"
    out.mkdir(exist_ok=True)
    variants = list(dict.fromkeys(cells.sort_values("variant_rank")["variant"]))
    seed_axes = results.attrs.get("seed_axes", [])
    md = [f"# Sweep report: {name}", "",
          f"{len(results)} cells, {int((results['status'] == 'FINISHED').sum())} finished, "
          f"{int(results['dedup_of'].notna().sum())} answered by an equivalent cell (dedup). "
          f"{len(variants)} variants: {', '.join(variants)}. Averaged over: "
          f"{', '.join(seed_axes) or 'nothing (no seed axis)'}; the seed is the unit of every interval and test.", "",
          *machine_lines(cells), ""]
    if missing := missing_run_dirs(cells):
        gone = (f"Cells whose run directory is gone: {', '.join(missing)}; their loss by position, passkey and "
                "attention tables are left out of this report.")
        print(f"warning: {gone}", file=sys.stderr)
        md += [f"_{gone}_", ""]
    tables_md, all_tests = report_tables(results, cells, plan.spec.questions if plan else [])
    md += tables_md
    md += _cost_markdown(cells)
    if mech := mechanism_lines(cells):
        md += ["## Optimiser mechanism: is the Paley − identity gap an optimiser effect? (NOTES §2)", "",
               "A fixed basis is a re-parameterisation of W_q/W_k: under a rotation-invariant optimiser (SGD) "
               "the two train identically (tests/test_mechanism.py), so a gap there would be noise.", "", *mech, ""]
    figures = report_figures(sweep_dir, _head_dim(plan))
    saved = []
    sections = (("_vs_theta", "## Metric vs RoPE base θ"), ("passkey_fan_", "## Passkey retrieval: polar fans"),
                ("accuracy_vs_length_", "## Task accuracy vs length"), ("position_loss", "## Loss by position"),
                ("erank", "## Effective attention rank per layer"), ("fourier_", "## Fourier attention magnitudes"),
                ("rope_band_", None))
    for key, heading in sections:
        mine = [f for f in figures if (key in f.stem if key == "_vs_theta" else f.stem.startswith(key))]
        if heading and mine:
            md += [heading, ""]
        if key == "_vs_theta" and not mine:
            md += ["## Metric vs RoPE base θ", "", "_θ takes fewer than two values in this sweep: no metric-vs-θ "
                   "figure._", ""]
        for f in mine:
            path = save(f.figure, out / f"{f.stem}.png")
            saved.append(path)
            md += [*[f"- {n}" for n in f.notes], *([""] if f.notes else []), f"![{f.alt}]({path.name})", "",
                   f"_{f.caption}_", ""]
    bench = read_json(sweep_dir / "bench_train.json")
    if bench.get("rows"):
        md += ["## Overhead (hdrope bench train)", "", "| variant | step ms | vs RoPE | tokens/s | MFU |",
               "|---|---|---|---|---|"]
        for r in bench["rows"]:
            md.append(f"| {r['variant']} | {r['step_ms']:.1f} | {r['vs_rope']:.3f}× | {r['tokens_per_s']:.0f} "
                      f"| {r['mfu']:.3f} |")
        md.append("")
    md += verdict_markdown(all_tests)
    report = out / "report.md"
    report.write_text("\n".join(md))
    (out / "comparisons.csv").write_text(pd.concat(all_tests).to_csv(index=False) if all_tests else "")
    _log_to_mlflow(sweep_dir, name, [report, out / "comparisons.csv", *saved], tracking_uri or _spec_uri(plan))
    return report


def report_tables(results: pd.DataFrame, cells: pd.DataFrame, questions: Sequence[Any] = ()
                  ) -> tuple[list[str], list[pd.DataFrame]]:
    """The report's outcome and length-generalisation tables as Markdown lines, with their comparison tables. With
    declared `questions` (`analysis.questions`), only those are one marked family and every other comparison is
    shown as exploratory, unmarked."""
    metrics = [m for m in outcome_metrics(metric_columns(results)) if not is_task_metric(m)]
    md = ["## Outcome tables", ""]
    all_tests = []
    for metric in metrics:
        tests = comparison_table(cells, metric, LEVEL, CORRECTION)
        all_tests.append(tests)
        md += [f"### {metric}", "", _markdown(ablation_table(results, metric, marked=not questions)), "",
               *_table_notes(cells, metric, tests[:0] if questions else tests), ""]
        if len(tests) and not questions:
            md += [_comparison_markdown(tests), ""]
    length_md, length_tests = lengthgen_section(cells, marked=not questions)
    md += length_md
    all_tests += length_tests
    if questions:
        declared, missing = declared_family(cells, questions, LEVEL, CORRECTION)
        explore = exploratory(all_tests, declared)
        md += questions_markdown(declared, explore, missing)
        all_tests = [declared, explore]
    return md, all_tests


def verdict_markdown(all_tests: Sequence[pd.DataFrame]) -> list[str]:
    """The report's last section: one verdict line per comparison."""
    lines = [verdict(r) for t in all_tests for _, r in t.iterrows()]
    return ["## Verdicts (one per comparison)", "", *([f"- {v}" for v in lines] or ["_No variant had a RoPE "
                                                                                   "reference to compare with._"]), ""]


def verdict_lines(report_dir: Path) -> list[str]:
    """The one-line verdicts of a written report (from its comparisons.csv)."""
    path = Path(report_dir) / "comparisons.csv"
    if not path.is_file() or not path.read_text().strip():
        return ["no comparison with a RoPE reference in this sweep"]
    return [verdict(row) for _, row in pd.read_csv(path).iterrows()]


def _plan(sweep_dir: Path) -> Plan | None:
    """The sweep's stored plan, or None for a directory that holds only its results."""
    from sweeps.plan_file import PLAN_FILE, load_plan

    return load_plan(sweep_dir) if (sweep_dir / PLAN_FILE).is_file() else None


def _spec_uri(plan: Plan | None) -> str | None:
    """The tracking URI the sweep's spec named."""
    return (plan.spec.tracking_uri or None) if plan else None


def _log_to_mlflow(sweep_dir: Path, name: str, files: list[Path], tracking_uri: str | None) -> str | None:
    import mlflow

    from trainer.run.store_home import rehome_store
    from trainer.run.tracking import default_tracking_uri, runs_with

    uri = tracking_uri or default_tracking_uri(sweep_dir)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None
    rehome_store(uri, sweep_dir)  # a copied or moved sweep's report goes into its own artifacts, never the original's
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return None
    runs = runs_with(client, {"sweep": name, "role": "parent"}, [exp.experiment_id])
    if not runs:
        return None
    for f in files:
        client.log_artifact(runs[0].info.run_id, str(f), artifact_path="report")
    return runs[0].info.run_id


def _head_dim(plan: Plan | None) -> int:
    """The head width of the sweep's models (64 when the plan is not stored)."""
    return plan.cells[0].config.model.resolved_head_dim if plan and plan.cells else 64
