"""A study's declared questions: the comparisons its spec names are one Holm family; every other one is exploratory.

A spec may list `questions:` (`sweeps.spec.Question`: variant, reference, metric), each naming two of the report's
variant rows (`analysis.variants`: "4D Paley", "RoPE", "4D identity", ...) and a metric the cells report. Then:

- `declared_family`: one comparison per question (per θ where θ varies), variant − reference paired by seed where
  both ran the same seeds (exact sign-flip test), else Welch, with Holm over these rows only: the family is the
  declared questions, and only these rows get marks. Any two variants can be compared, not only a variant and RoPE.
- `exploratory`: every other comparison the report draws (each variant against its RoPE reference, per table),
  shown with its own interval and uncorrected p, never marked, labelled exploratory (correction `EXPLORATORY`).
- `plan_problems`: at plan time, each label must name a variant the spec's axes produce and each metric one the
  cells will report (or an effective length, or an lm-eval metric), listing what exists.
- `plan_warnings`: at plan time, a declared family its planned seeds can never mark (the exact sign-flip test's
  smallest p over the shared seeds above Holm's first-step α), with the seeds that could.
- `question_advice`: `hdrope sweep plan --detect D --pilot P` sized for the declared family (α = 5% / questions,
  each question's paired per-seed spread measured on the pilot, sized for the largest).

A spec without questions keeps the report's per-table families (`analysis.comparisons`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.comparisons import COLUMNS, EXPLORATORY, arms, corrected, fmt, pair_row
from analysis.lengthgen import EFFECTIVE_PREFIXES
from analysis.outcomes import seed_values
from analysis.power import SeedAdvice
from analysis.stats import min_attainable_p, seeds_needed, seeds_to_reach
from analysis.variants import theta_text, with_variants

if TYPE_CHECKING:
    from sweeps.plan import Plan

__all__ = ["declared_family", "duplicate_questions", "exploratory", "family_size", "plan_problems", "plan_warnings",
           "question_advice", "question_text", "questions_markdown"]

# metric families a cell does not report itself but the analysis derives or a later command adds
DERIVED_METRICS = {"efflen_loss": "the loss effective length (analysis.lengthgen)",
                   "efflen_<task>": "a task's effective length on distance",
                   "poslen_<task>": "a task's effective length on window position",
                   "lm_<task>_<metric>": "a downstream benchmark of `hdrope eval lm-eval`"}
_LM_METRIC = re.compile(r"^lm_.+_.+$")


def question_text(q: Any) -> str:
    """'4D Paley − RoPE on val_loss_x4'."""
    return f"{q.variant} − {q.reference} on {q.metric}"


def _with_metric(cells: pd.DataFrame, metric: str) -> pd.DataFrame:
    """cells with `metric`, deriving effective lengths when the metric is one (`efflen_<task>`, `efflen_loss`)."""
    if metric not in cells and metric.startswith(EFFECTIVE_PREFIXES) and "run_dir" in cells:
        from analysis.lengthgen import with_effective_lengths

        return with_effective_lengths(cells)
    return cells


def _thetas(values: pd.DataFrame, variants: Sequence[str]) -> list[float]:
    """The θ values at which the two variants are compared: theirs, or nan when neither has a θ."""
    mine = values[values["variant"].isin(list(variants))]["theta"].dropna()
    return sorted({float(t) for t in mine}) or [math.nan]


def declared_family(cells: pd.DataFrame, questions: Sequence[Any], level: float = 0.95,
                    correction: str = "holm") -> tuple[pd.DataFrame, list[str]]:
    """The declared questions' comparisons as one family (rows of `analysis.comparisons.COLUMNS`), and the
    questions that found no data (a variant or metric the finished cells lack), in words. A question without data
    still counts in the family (one comparison each): the correction is the one the study declared."""
    rows, missing = [], []
    for q in questions:
        mine = _with_metric(cells, q.metric)
        if q.metric not in mine or not {q.variant, q.reference} <= set(mine["variant"]):
            missing.append(f"{question_text(q)}: no finished cell reports it")
            continue
        values = seed_values(mine, q.metric)
        found = [r for theta in _thetas(values, (q.variant, q.reference))
                 if (r := pair_row(values, q.metric, q.variant, q.reference, theta, level)) is not None]
        rows += found
        if not found:
            missing.append(f"{question_text(q)}: {_why_unanswered(mine, values, q)}")
    return corrected(rows, level, correction, unanswered=len(missing)), missing


def _why_unanswered(cells: pd.DataFrame, values: pd.DataFrame, q: Any) -> str:
    """Why a question found no comparison in cells that have its metric and variants: a variant none of whose cells
    has a value of the metric, or no θ at which both ran."""
    for variant in (q.variant, q.reference):
        if not values[values["variant"] == variant]["value"].notna().any():
            n = int((cells["variant"] == variant).sum())
            return (f"{variant} has no value of {q.metric} (empty in all {n} of its cells: a task it did not learn "
                    "has no effective length, a metric it did not compute is empty)")
    return "no θ at which both ran"


def _key(row: pd.Series) -> tuple:
    theta = float(row["theta"])
    return row["metric"], row["variant"], row["reference"], None if np.isnan(theta) else round(theta, 9)


def exploratory(tests: Sequence[pd.DataFrame], declared: pd.DataFrame) -> pd.DataFrame:
    """Every comparison of `tests` that is not a declared question, unmarked: its own interval and uncorrected p,
    no corrected p, never significant, correction EXPLORATORY."""
    frames = [t for t in tests if len(t)]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    taken = {_key(r) for _, r in declared.iterrows()}
    table = table[[_key(r) not in taken for _, r in table.iterrows()]].copy() if len(table) else table
    table["p_adj"], table["mde"], table["significant"] = math.nan, math.nan, False
    table["family"], table["correction"] = 0, EXPLORATORY
    return table[COLUMNS].reset_index(drop=True)


def _design(r: pd.Series) -> str:
    return f"paired, {r['n']} seeds, {r['method']}" if r["paired"] else f"Welch, ≥{r['n']} seeds/arm"


def questions_markdown(declared: pd.DataFrame, explore: pd.DataFrame, missing: Sequence[str]) -> list[str]:
    """The report's two parts: the declared questions (Holm over them, marked) and the exploratory comparisons
    (unmarked), as Markdown lines."""
    n = int(declared["family"].iloc[0]) if len(declared) else 0
    md = ["## Declared questions", "",
          f"_The spec declares its questions: Holm over these {n} comparison{'s' * (n != 1)} only (one family), at "
          "5%; `*` marks a difference that survives. Paired by seed (exact sign-flip test) where both variants ran "
          "the same seeds, else Welch. No other comparison in this report is marked._", "",
          "| question | θ | Δ [95% CI] | design | p | p (Holm) | | detectable at 80% power |",
          "|---|---|---|---|---|---|---|---|"]
    for _, r in declared.iterrows():
        mark = "*" if r["significant"] else ("too few seeds to test" if not r["testable"] else "n.s.")
        md.append(f"| {r['variant']} − {r['reference']} on {r['metric']} | {theta_text(r['theta'])} | "
                  f"{fmt(r['delta'])} [{fmt(r['lo'])}, {fmt(r['hi'])}] | {_design(r)} | {fmt(r['p'], 3)} | "
                  f"{fmt(r['p_adj'], 3)} | {mark} | {fmt(r['mde'])} |")
    md += ["", *[f"- _not answered: {m}._" for m in missing], *([""] if missing else [])]
    md += ["## Exploratory comparisons (not declared: no marks)", "",
           "_Every other comparison the tables above draw, each with its own 95% interval and uncorrected p. They "
           "are exploratory: not corrected, not marked, and no conclusion is drawn from them; declare a question in "
           "the spec to test one._", ""]
    if not len(explore):
        return [*md, "_None._", ""]
    md += ["| metric | θ | comparison | Δ [95% CI] | design | p (uncorrected) |", "|---|---|---|---|---|---|"]
    md += [f"| {r['metric']} | {theta_text(r['theta'])} | {r['variant']} − {r['reference']} | {fmt(r['delta'])} "
           f"[{fmt(r['lo'])}, {fmt(r['hi'])}] | {_design(r)} | {fmt(r['p'], 3)} |" for _, r in explore.iterrows()]
    return [*md, ""]


def _planned_metrics(plan: Plan) -> list[str]:
    from trainer.config import metric_names

    return list(dict.fromkeys(m for c in plan.cells for m in metric_names(c.config)))


def _known_metric(metric: str, reported: Sequence[str]) -> bool:
    """Whether the cells report metric, or it belongs to a family the analysis derives from what they report."""
    if metric in reported or _LM_METRIC.match(metric):
        return True
    if metric == "efflen_loss":
        return any(m.startswith("val_loss_x") for m in reported)
    prefix = next((p for p in EFFECTIVE_PREFIXES if metric.startswith(p)), None)
    return prefix is not None and any(m.startswith(f"acc_{metric.removeprefix(prefix)}_x") for m in reported)


def plan_problems(plan: Plan) -> list[str]:
    """What is wrong with the spec's declared questions, one line each naming the entry and the fix: a label that
    no planned cell's variant has, a variant compared with itself, a metric the cells will not report."""
    from sweeps.results import planned_frame

    questions = plan.spec.questions
    if not questions or not plan.cells:
        return []
    shown = with_variants(planned_frame(plan))
    labels = list(dict.fromkeys(shown.sort_values("variant_rank")["variant"]))
    configs = {c.cell_id: c.config for c in plan.cells}
    reported = _planned_metrics(plan)
    problems = []
    for i, q in enumerate(questions):
        where = f"questions[{i}]"
        for key in ("variant", "reference"):
            value = getattr(q, key)
            if value not in labels:
                problems.append(f"{where}.{key}={value!r}: no cell of this spec is that variant; the axes produce "
                                f"{labels} (the report's row labels)")
        if q.variant == q.reference and q.variant:
            problems.append(f"{where}: variant and reference are both {q.variant!r}; compare two different variants")
        if not _known_metric(q.metric, reported):
            problems.append(f"{where}.metric={q.metric!r}: the cells will not report it; choose one of {reported}, "
                            f"or a derived family: {', '.join(DERIVED_METRICS)}")
            continue
        mine = shown[shown["variant"].isin([q.variant, q.reference])]
        cfgs = [configs[c] for c in mine["cell_id"]]
        problems += [f"{where}: {p}" for p in _unanswerable(q, mine, cfgs)]
    return problems + duplicate_questions(questions)


_HARD = re.compile(r"^hardacc_(?P<task>.+)_x[0-9.]+$")
_HARD_DRAWS = 256  # examples drawn to see whether a task's hard subset can hold any


def _unanswerable(q: Any, cells: pd.DataFrame, configs: Sequence[Any]) -> list[str]:
    """Why a question's planned cells cannot answer it, whatever they learn: a hard subset its task's parameters
    leave empty, a loss effective length without the train-length-context pass it is read from, or two variants that
    run at no common θ."""
    found = []
    if (hard := _HARD.match(q.metric)) and configs:
        from trainer.data.tasks.registry import TASKS

        task = TASKS.get(hard["task"])
        if task is not None and task.hard is not None:
            params = configs[0].data.task_params
            rng = np.random.default_rng(0)
            if not any(task.hard(task.draw(params, rng).params) for _ in range(_HARD_DRAWS)):
                used = ", ".join(f"{k}={getattr(params, k)}" for k in task.uses)
                found.append(f"{q.metric}: no example of {task.name} at data.task_params {used} is in its hard subset "
                             f"(none of {_HARD_DRAWS} drawn defeats its shortcut), so the metric has no examples; "
                             "change the task's parameters (a flip-flop needs ops >= 2) or ask on another metric")
    if q.metric == "efflen_loss" and any(not c.eval.sliding_stride for c in configs):
        found.append("efflen_loss is read from the loss of each window at the train length's context, which the cells "
                     "compute only with eval.sliding_stride set; set eval.sliding_stride (e.g. half the train length) "
                     "in the spec's overrides")
    thetas = {v: set(cells[cells["variant"] == v]["theta"].dropna().astype(float)) for v in (q.variant, q.reference)}
    if all(thetas.values()) and not thetas[q.variant] & thetas[q.reference]:
        found.append(f"{q.variant} runs at θ {sorted(thetas[q.variant])} and {q.reference} at θ "
                     f"{sorted(thetas[q.reference])}: no θ at which both run, so the pair is never compared; give them "
                     "a common θ")
    return found


def duplicate_questions(questions: Sequence[Any]) -> list[str]:
    """A problem for each question that repeats an earlier one, as it is or reversed (B − A after A − B: the same
    comparison with its sign flipped, which Holm would count twice)."""
    seen: dict[tuple, tuple[int, Any]] = {}
    found = []
    for i, q in enumerate(questions):
        key = (frozenset((q.variant, q.reference)), q.metric)
        if key in seen:
            first, earlier = seen[key]
            how = "reverses" if (earlier.variant, earlier.reference) != (q.variant, q.reference) else "repeats"
            found.append(f"questions[{i}]: {how} questions[{first}] ({question_text(q)} after "
                         f"{question_text(earlier)}): one comparison, which the family would count twice; list it "
                         "once")
        else:
            seen[key] = (i, q)
    return found


def _spread(values: pd.DataFrame, q: Any) -> tuple[float, float, int]:
    """(sd of the per-seed differences variant − reference, pooled within-variant sd, pairs) over the pilot's θs."""
    diffs, within = [], []
    for theta in _thetas(values, (q.variant, q.reference)):
        variant, reference = arms(values, q.variant, q.reference, theta)  # paired as the report pairs them
        within += [float(arm.var(ddof=1)) for arm in (variant, reference) if len(arm) >= 2]
        diffs += list((variant - reference).dropna())
    paired = float(np.std(diffs, ddof=1)) if len(diffs) >= 2 else math.nan
    return paired, (float(math.sqrt(np.mean(within))) if within else math.nan), len(diffs)


def plan_warnings(plan: Plan, level: float = 0.95) -> list[str]:
    """What the declared family cannot do at the planned seeds: one line when no comparison in it could ever be
    marked (the smallest p its test can give on the fewest seeds a question's two variants share, above Holm's
    first-step α = (1 − level) / family size), naming the seeds that could."""
    from sweeps.results import planned_frame

    questions = plan.spec.questions
    if not questions or not plan.cells:
        return []
    planned = planned_frame(plan)
    family = family_size(planned, questions)
    values = with_variants(planned)[["variant", "theta", "seed"]].assign(value=0.0)  # seed_values' shape
    shared = []
    for q in questions:
        for theta in _thetas(values, (q.variant, q.reference)):
            variant, reference = arms(values, q.variant, q.reference, theta)  # paired as the report pairs them
            shared.append((len(set(variant.index) & set(reference.index)), q, theta))
    if not shared or not family:
        return []
    n, q, theta = min(shared, key=lambda s: s[0])
    alpha = (1 - level) / family
    smallest = min_attainable_p(n, paired=True)
    if not (n < 2 or smallest > alpha):
        return []
    need = seeds_to_reach(alpha, paired=True)
    at = "" if np.isnan(theta) else f" at {theta_text(theta)}"
    return [f"questions: the declared family holds {family} comparison{'s' * (family != 1)} ({len(questions)} "
            f"question{'s' * (len(questions) != 1)}{', per θ' if family > len(questions) else ''}), so Holm's first "
            f"step needs p ≤ {alpha:.3g}; {question_text(q)}{at} has {n} paired seed{'s' * (n != 1)}"
            f"{f', whose exact sign-flip test gives p ≥ {smallest:.3g}' if n >= 2 else ''}: no declared comparison "
            f"can be marked; give every variant "
            f"{need} or more shared seeds (the power to detect a given difference needs more: `hdrope sweep plan "
            "--detect D --pilot P`)"]


def family_size(planned: pd.DataFrame, questions: Sequence[Any]) -> int:
    """The comparisons the report's declared family will hold for these planned cells: one per question, per θ
    where the question's variants run at several θ."""
    shown = with_variants(planned)
    return sum(len(_thetas(shown, (q.variant, q.reference))) for q in questions)


def _asked(questions: Sequence[Any], metric: str) -> list[Any]:
    """The declared questions `--metric` restricts the sizing to (all when not given)."""
    from hdrope.errors import UserError

    mine = [q for q in questions if not metric or q.metric == metric]
    if not mine:
        raise UserError(f"--metric {metric}: no declared question is on it; the spec's questions are on "
                        f"{sorted({q.metric for q in questions})} (or leave --metric out to size all of them)")
    return mine


def question_advice(pilot: str | Path, planned: pd.DataFrame, questions: Sequence[Any], difference: float,
                    metric: str = "", power: float = 0.8, level: float = 0.95) -> tuple[SeedAdvice, list[str]]:
    """Seeds the planned sweep needs so that each declared question (those on `metric` when given) detects
    `difference` at `power` after Holm over the whole declared family (α = (1 − level) / its size for the first
    step), from each question's per-seed spread on a finished pilot; sized for the question with the largest paired
    spread. Returns the advice and the lines that say how it was sized."""
    from analysis.load import find_sweep_dir, sweep_cells
    from analysis.variants import trained
    from hdrope.errors import UserError

    if not (difference > 0 and math.isfinite(difference)):
        raise UserError(f"--detect {difference}: must be a positive, finite difference in the metric's units, "
                        "e.g. --detect 0.02")
    asked = _asked(questions, metric)
    pilot_dir = find_sweep_dir(pilot)
    cells = sweep_cells(pilot_dir)
    family = family_size(planned, questions)
    spreads = []
    for q in asked:
        mine = _with_metric(cells, q.metric)
        if q.metric not in mine or not {q.variant, q.reference} <= set(mine["variant"]):
            raise UserError(f"--pilot {pilot_dir}: the pilot cannot measure the question {question_text(q)} (it ran "
                            f"variants {sorted(set(cells['variant']))}); run a pilot with both variants and 2 or "
                            "more shared seeds")
        values = seed_values(mine, q.metric)
        arms_ = values[values["variant"].isin([q.variant, q.reference])]["value"].dropna()
        if arms_.nunique() == 1:  # constant: a power calculation would answer its minimum for any difference
            raise UserError(f"--pilot {pilot_dir}: {question_text(q)}: every seed of both variants gave the same value "
                            f"({arms_.iloc[0]:g}), so the pilot measures nothing to size a plan from (a task not "
                            "learned scores flat); declare the question on a metric that varies, or pilot longer")
        paired, within, pairs = _spread(values, q)
        if not np.isfinite(paired) and not np.isfinite(within):
            from analysis.power import no_spread_reason

            both = mine[mine["variant"].isin([q.variant, q.reference])]
            raise UserError(f"{question_text(q)}: {no_spread_reason(both, pilot_dir, q.metric)}")
        spreads.append((paired if np.isfinite(paired) else math.sqrt(2) * within, within, pairs, q))
    paired_sd, within_sd, pairs, worst = max(spreads, key=lambda s: s[0])
    alpha = (1 - level) / family
    shown = trained(planned)
    planned_seeds = int(shown.groupby(["variant", shown["theta"].fillna(-1.0)])["seed"].nunique().min())
    source = (f"{pilot_dir.name}: the largest of the {len(asked)} declared question(s)' spreads, {question_text(worst)}"
              f" ({pairs} paired seeds)" if pairs >= 2 else f"{pilot_dir.name}: {question_text(worst)} has no paired "
              "seeds: √2 × the within-variant sd bounds its paired spread")
    advice = SeedAdvice(worst.metric, difference, family, alpha, paired_sd, within_sd,
                        seeds_needed(difference, paired_sd, paired=True, alpha=alpha, power=power),
                        seeds_needed(difference, within_sd, paired=False, alpha=alpha, power=power)
                        if np.isfinite(within_sd) else None, planned_seeds, source)
    said = [f"sized for the spec's declared family: {len(questions)} question{'s' * (len(questions) != 1)}, {family} "
            f"comparison{'s' * (family != 1)} (Holm over them, α = {alpha:.3g} for the first step); each question's "
            "paired spread from the pilot, the largest sizes the seeds:"]
    said += [f"  {question_text(q)}: paired sd {sd:.4g} over {n} seeds" for sd, _, n, q in spreads]
    return advice, said
