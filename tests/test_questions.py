"""Declared questions (issue 33): the spec's questions are validated at plan time, the report's Holm family is those
questions only (every other comparison exploratory and unmarked), and the seeds advice sizes that family."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from statsmodels.stats.multitest import multipletests

from analysis.report import report_tables
from analysis.stats import seeds_needed
from analysis.variants import trained
from hdrope.errors import UserError
from sweeps.plan import make_plan
from sweeps.results import planned_frame
from sweeps.spec import SpecError, load_spec

REPO = Path(__file__).resolve().parents[1]
SEEDS = list(range(1, 9))
QUESTIONS = """questions:
  - {variant: "4D identity", reference: "RoPE", metric: val_loss_x4}
  - {variant: "4D Paley", reference: "4D identity", metric: val_loss_x4}
"""


def _spec(tmp_path: Path, questions: str = QUESTIONS, seeds: list[int] = SEEDS) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(f"""name: study
base: tiny
storage: {tmp_path / 'store'}
axes:
  model.pe.kind: [rope, hdrope]
  model.pe.basis: [identity, paley]
  seed: {seeds}
{questions}""")
    return path


# per-seed val_loss_x4 of a known design: Paley = identity − 0.10 in every seed (± small noise), identity ≈ RoPE,
# Paley far below RoPE (a huge effect that is not a declared question)
_RNG = np.random.default_rng(0)
_BASE = 3.0 + 0.05 * _RNG.standard_normal(len(SEEDS))
_IDENTITY = _BASE + 0.004 * np.array([1, -1, 1, -1, -1, 1, -1, 1]) * np.linspace(1, 1.7, len(SEEDS))
_PALEY = _IDENTITY - 0.10 + 0.002 * _RNG.standard_normal(len(SEEDS))


def _results(plan, metric: str = "val_loss_x4") -> pd.DataFrame:
    """The plan's cells shaped like results.parquet, with hand-made metrics (no training)."""
    df = planned_frame(plan)
    df["run_dir"] = [str(plan.root / "cells" / c) for c in df["cell_id"]]
    values = {"RoPE": _BASE, "4D identity": _IDENTITY, "4D Paley": _PALEY}
    label = trained(df.assign(dedup_of=None)).set_index("cell_id")["variant"]
    df[metric] = [values[label[c]][SEEDS.index(s)] for c, s in zip(df["cell_id"], df["seed"], strict=True)]
    df["val_loss"] = 2.0 + 0.01 * df["seed"]
    return df


def _report(results: pd.DataFrame, questions) -> tuple[str, list[pd.DataFrame]]:
    md, tests = report_tables(results, trained(results), questions)
    return "\n".join(md), tests


def test_a_report_marks_only_the_declared_questions_with_holm_over_them(tmp_path):
    plan = make_plan(load_spec(_spec(tmp_path)))
    results = _results(plan)
    md, (declared, explore) = _report(results, plan.spec.questions)
    assert list(zip(declared["variant"], declared["reference"], strict=True)) == [("4D identity", "RoPE"),
                                                                                  ("4D Paley", "4D identity")]
    assert (declared["family"] == 2).all() and declared["paired"].all() and (declared["n"] == 8).all()
    assert np.allclose(declared["p_adj"], multipletests(declared["p"], method="holm")[1])
    assert declared["significant"].tolist() == [False, True]  # 2/256 · 2 < 0.05: Paley vs identity survives
    assert np.isclose(declared["delta"].iloc[1], float(np.mean(_PALEY - _IDENTITY)))
    # Paley − RoPE is the largest effect in the table, yet not declared: exploratory, p shown, never marked
    paley = explore[(explore["variant"] == "4D Paley") & (explore["metric"] == "val_loss_x4")].iloc[0]
    assert paley["p"] < 0.01 and not paley["significant"] and np.isnan(paley["p_adj"])
    assert (explore["correction"] == "exploratory").all()
    assert not ((explore["variant"] == "4D identity") & (explore["metric"] == "val_loss_x4")).any()  # declared
    declared_part = md[md.index("## Declared questions"):md.index("## Exploratory")]
    assert declared_part.count("| * |") == 1 and "4D Paley − 4D identity on val_loss_x4" in declared_part
    outcome_part = md[:md.index("## Declared questions")]
    assert " *" not in outcome_part  # the outcome tables carry no marks: only declared rows are marked
    assert "exploratory" in md[md.index("## Exploratory"):]


def test_without_questions_the_report_keeps_its_per_table_families(tmp_path):
    plan = make_plan(load_spec(_spec(tmp_path, questions="")))
    md, tests = _report(_results(plan), [])
    table = next(t for t in tests if len(t) and t["metric"].iloc[0] == "val_loss_x4")
    assert (table["correction"] == "holm").all()
    paley = table[table["variant"] == "4D Paley"].iloc[0]
    assert paley["significant"] and " *" in md and "## Declared questions" not in md


@pytest.mark.parametrize(("question", "said"), [
    ('{variant: "4D Paly", reference: "RoPE", metric: val_loss_x4}',
     "questions[0].variant='4D Paly': no cell of this spec is that variant; the axes produce ['RoPE', "
     "'4D identity', '4D Paley']"),
    ('{variant: "4D Paley", reference: "RoPE", metric: val_loss_x9}',
     "questions[0].metric='val_loss_x9': the cells will not report it; choose one of"),
    ('{variant: "RoPE", reference: "RoPE", metric: val_loss}',
     "questions[0]: variant and reference are both 'RoPE'"),
    ('{variant: "4D Paley", reference: "RoPE", metrc: val_loss}', "questions[0].metrc: not a question field"),
    ('{variant: "4D Paley", reference: "RoPE"}', "questions[0]: metric is missing"),
])
def test_a_bad_question_is_refused_at_plan_time_naming_the_entry(tmp_path, question, said):
    with pytest.raises(SpecError) as err:
        make_plan(load_spec(_spec(tmp_path, questions=f"questions:\n  - {question}\n")))
    assert said in str(err.value)


def test_derived_metric_families_are_accepted(tmp_path):
    plan = make_plan(load_spec(_spec(tmp_path, questions=(
        'overrides: {eval.sliding_stride: 32}\n'  # the loss effective length's train-length-context pass
        'questions:\n  - {variant: "4D Paley", reference: "RoPE", metric: efflen_loss}\n'
        '  - {variant: "4D Paley", reference: "RoPE", metric: lm_hellaswag_acc}\n'))))
    assert len(plan.spec.questions) == 2


def _pilot(tmp_path: Path, results: pd.DataFrame) -> Path:
    """A finished pilot sweep directory holding only its results.parquet (hand-made values)."""
    root = tmp_path / "pilot"
    root.mkdir()
    table = pa.Table.from_pandas(results.assign(dedup_of=results["dedup_of"].astype(object)), preserve_index=False)
    meta = {b"hdrope.axes": json.dumps(results.attrs["axes"]).encode(),
            b"hdrope.seed_axes": json.dumps(results.attrs["seed_axes"]).encode()}
    pq.write_table(table.replace_schema_metadata(meta), root / "results.parquet")
    return root


def test_seed_advice_sizes_the_declared_family(tmp_path):
    from analysis.questions import question_advice

    plan = make_plan(load_spec(_spec(tmp_path)))
    pilot = _pilot(tmp_path, _results(plan).assign(status="FINISHED"))
    advice, said = question_advice(pilot, planned_frame(plan), plan.spec.questions, 0.01)
    assert advice.family == 2 and np.isclose(advice.alpha, 0.025)
    sd = max(float(np.std(_IDENTITY - _BASE, ddof=1)), float(np.std(_PALEY - _IDENTITY, ddof=1)))
    assert np.isclose(advice.paired_sd, sd)
    assert advice.paired_seeds == seeds_needed(0.01, sd, paired=True, alpha=0.025)
    assert "declared family: 2 questions" in said[0]
    one, _ = question_advice(pilot, planned_frame(plan), plan.spec.questions[:1], 0.01)
    assert one.family == 1 and np.isclose(one.alpha, 0.05)
    with pytest.raises(UserError, match="--metric val_loss: no declared question is on it"):
        question_advice(pilot, planned_frame(plan), plan.spec.questions, 0.01, metric="val_loss")


def test_sweep_plan_detect_says_it_sized_the_declared_family(tmp_path, hdrope_here):
    plan = make_plan(load_spec(_spec(tmp_path)))
    pilot = _pilot(tmp_path, _results(plan).assign(status="FINISHED"))
    out = hdrope_here(["sweep", "plan", str(_spec(tmp_path)), "--detect", "0.05", "--pilot", str(pilot)], cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "sized for the spec's declared family: 2 questions" in out.stdout
    assert "Holm over the plan's 2 comparisons" in out.stdout


def test_a_shipped_study_keeps_its_questions(tmp_path):
    """Shipping a sweep whose spec declares questions keeps them: the rebuilt report marks only those."""
    from analysis.docs_results import render
    from analysis.shipped import drift, load_study, rebuild, ship
    from sweeps.plan_file import save_plan

    plan = save_plan(make_plan(load_spec(_spec(tmp_path))))
    results = _results(plan).assign(status="FINISHED")
    results.attrs = {"axes": plan.axes, "seed_axes": plan.seed_axes}
    (plan.root / "results.parquet").unlink(missing_ok=True)
    pilot = _pilot(tmp_path, results)
    (pilot / "results.parquet").replace(plan.root / "results.parquet")
    ship(plan.root, tmp_path / "results" / "study")
    study = load_study(tmp_path / "results" / "study")
    assert [(q.variant, q.reference, q.metric) for q in study.questions] == [
        ("4D identity", "RoPE", "val_loss_x4"), ("4D Paley", "4D identity", "val_loss_x4")]
    assert set(study.comparisons["correction"]) == {"holm", "exploratory"}
    md = rebuild(tmp_path / "results" / "study")
    assert "## Declared questions" in md and md.count("| * |") == 1 and drift(tmp_path / "results" / "study") == []
    declared = render("study", "declared", tmp_path / "results")
    assert declared.count("\n") == 4 and "| 4D Paley | " in declared and "| * |" in declared  # 2 rows + header
    assert "exploratory" in render("study", "exploratory", tmp_path / "results")
