"""The study surfaces under hostile input (issue 47): shipped results, declared questions, the console's exits, the
kinds' own fields. Each case lost data, gave a silent wrong number, or a traceback where a message belongs; each
test here failed before its fix."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from analysis.shipped import CELLS_FILE, STUDY_FILE, load_study, rebuild
from hdrope.errors import UserError

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "experiments" / "results"


def _copy(study: str, to: Path, keep_digest: bool = False) -> Path:
    """A shipped study copied to `to`; without its recorded row count and sha256 unless keep_digest (an older
    study.json), so the checks behind them are what a damaged file meets."""
    shutil.copytree(SHIPPED / study, to)
    if not keep_digest:
        study_json = json.loads((to / STUDY_FILE).read_text())
        for key in ("rows", "cells_sha256"):
            study_json.pop(key)
        (to / STUDY_FILE).write_text(json.dumps(study_json))
    return to


# --- lost data -----------------------------------------------------------------------------------------------------

def test_a_rebuilt_report_is_never_written_over_its_own_inputs(hdrope_here, tmp_path):
    folder = _copy("quickstart", tmp_path / "q", keep_digest=True)
    before = (folder / CELLS_FILE).read_bytes()
    for out in (folder / CELLS_FILE, folder / STUDY_FILE, folder):
        done = hdrope_here(["report", "--from-results", str(folder), "--out", str(out)])
        assert done.returncode == 2 and "the report is rebuilt from" in done.stderr, done.stderr
    assert (folder / CELLS_FILE).read_bytes() == before
    done = hdrope_here(["report", "--from-results", str(folder), "--out", str(tmp_path / "nowhere" / "r.md")])
    assert done.returncode == 2 and "the directory" in done.stderr and "does not exist" in done.stderr


def test_the_console_says_when_its_output_cannot_be_written_and_survives_a_closed_stdout():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "sweeps.console", "bases"], cwd=REPO, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 120 and done.stderr.strip().count("\n") == 0
    assert "could not write the output" in done.stderr and "Traceback" not in done.stderr
    closed = subprocess.run([sys.executable, "-c", "import os, sys, runpy; os.close(1); sys.stdout = None; "
                             "sys.argv = ['hdrope', 'bases']; runpy.run_module('sweeps.console', run_name='__main__')"],
                            cwd=REPO, stderr=subprocess.PIPE, text=True, timeout=120)
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr


def test_ctrl_c_while_planning_exits_130_with_one_line():
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.console", "sweep", "plan",
                             "experiments/tables/frontier_compact.yaml"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(4.0)  # imports done, planning 220 cells
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "interrupted" in err


# --- silent wrong numbers -------------------------------------------------------------------------------------------

def test_a_cut_or_edited_cells_file_is_refused(tmp_path):
    folder = _copy("frontier_fox_compact", tmp_path / "digest", keep_digest=True)
    text = (folder / CELLS_FILE).read_text()
    (folder / CELLS_FILE).write_text(text[:-40])  # cut inside its last row
    with pytest.raises(UserError, match=r"does not match the sha256 study\.json records"):
        load_study(folder)
    older = _copy("frontier_fox_compact", tmp_path / "older")  # a study.json from before the digest
    (older / CELLS_FILE).write_text(text[:-40])
    with pytest.raises(UserError, match="does not end its last row with a newline"):
        load_study(older)
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    (older / CELLS_FILE).write_text(text[:len(text) - len(last) - 1] + last.rsplit(",", 5)[0] + "\n")  # fields lost
    with pytest.raises(UserError, match=r"row 33 has \d+ fields, not the header's \d+ \(the file is cut\)"):
        load_study(older)


def test_a_type_that_would_change_values_is_refused(tmp_path):
    folder = _copy("frontier_fox_compact", tmp_path / "f")
    study = json.loads((folder / STUDY_FILE).read_text())
    study["columns"]["hardacc_flipflop_dense_x1"] = "int64"
    (folder / STUDY_FILE).write_text(json.dumps(study))
    with pytest.raises(UserError, match=r"types column 'hardacc_flipflop_dense_x1' as int64, but cell \S+ holds"):
        load_study(folder)


def test_an_infinite_metric_and_a_repeated_cell_are_refused_naming_the_cell(tmp_path):
    import pandas as pd

    for case in ("inf", "twice"):
        folder = _copy("frontier_fox_compact", tmp_path / case)
        cells = pd.read_csv(folder / CELLS_FILE, dtype=str, keep_default_na=False)
        if case == "inf":
            cells.loc[3, "hardacc_flipflop_dense_x1"] = "inf"
            message = rf"cell {cells.loc[3, 'cell_id']} has hardacc_flipflop_dense_x1 = inf"
        else:
            cells = pd.concat([cells, cells.iloc[[5]]], ignore_index=True)
            message = rf"holds cell '{cells.loc[5, 'cell_id']}' twice"
        cells.to_csv(folder / CELLS_FILE, index=False)
        with pytest.raises(UserError, match=message):
            load_study(folder)


def test_a_declared_question_and_its_reverse_are_one_question(tmp_path):
    from analysis.questions import duplicate_questions
    from sweeps.spec import Question

    found = duplicate_questions([Question("FoX", "RoPE", "m"), Question("RoPE", "FoX", "m"),
                                 Question("FoX", "RoPE", "n")])
    assert found == ["questions[1]: reverses questions[0] (RoPE − FoX on m after FoX − RoPE on m): one comparison, "
                     "which the family would count twice; list it once"]
    folder = _copy("frontier_fox_compact", tmp_path / "f")
    study = json.loads((folder / STUDY_FILE).read_text())
    study["questions"].append({"variant": "RoPE", "reference": "FoX", "metric": "hardacc_flipflop_dense_x1"})
    (folder / STUDY_FILE).write_text(json.dumps(study))
    with pytest.raises(UserError, match=r"questions\[1\]: reverses questions\[0\]"):
        load_study(folder)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: {**s, "columns": list(s["columns"])}, "field 'columns' is not a mapping"),
    (lambda s: {k: v for k, v in s.items() if k != "name"}, "field 'name' is None"),
    (lambda s: {**s, "questions": None}, "field 'questions' is None, not a list"),
    (lambda s: {**s, "questions": [{"variant": "FoX"}]}, r"questions\[0\] is .*not a mapping of variant"),
    (lambda s: {**s, "rows": "many"}, "field 'rows' is 'many'"),
])
def test_a_study_json_off_its_schema_is_refused_naming_the_field(tmp_path, edit, message):
    folder = _copy("frontier_fox_compact", tmp_path / "f")
    study = json.loads((folder / STUDY_FILE).read_text())
    (folder / STUDY_FILE).write_text(json.dumps(edit(study)))
    with pytest.raises(UserError, match=message):
        load_study(folder)


def test_another_studys_files_beside_the_cells_are_refused(tmp_path):
    folder = _copy("quickstart", tmp_path / "q")
    shutil.copyfile(SHIPPED / "frontier_fox_compact" / STUDY_FILE, folder / STUDY_FILE)
    with pytest.raises(UserError, match="not one study's"):
        load_study(folder)
    folder = _copy("quickstart", tmp_path / "q2")
    study = json.loads((folder / STUDY_FILE).read_text())
    study["columns"]["acc_mqar_x1"] = "float64"  # listed, not in cells.csv
    (folder / STUDY_FILE).write_text(json.dumps(study))
    with pytest.raises(UserError, match=r"missing \['acc_mqar_x1'\]"):
        load_study(folder)


def test_a_rebuilt_report_warns_when_a_comparison_mixes_machines(tmp_path):
    import pandas as pd

    folder = _copy("frontier_fox_compact", tmp_path / "f")
    cells = pd.read_csv(folder / CELLS_FILE, dtype=str, keep_default_na=False)
    fox = cells.index[cells["pe_kind"] == "fox"][:3]
    cells.loc[fox, "cpu_capability"] = "AVX512"  # the study ran on AVX2
    cells.to_csv(folder / CELLS_FILE, index=False)
    text = rebuild(folder)
    assert "**Warning**: the cells of FoX vs RoPE ran on different machines" in text
    assert "**Warning**" not in rebuild(SHIPPED / "frontier_fox_compact")


# --- the kinds' own fields ------------------------------------------------------------------------------------------

def test_a_typo_in_a_field_rope_ignores_is_still_refused(tiny_cfg):
    with pytest.raises(UserError, match=r"model\.pe\.basis='paleyy': not a basis \(model\.pe\.kind=rope ignores it"):
        tiny_cfg("model.pe.kind=rope", "model.pe.basis=paleyy")
    with pytest.raises(UserError, match=r"model\.pe\.rotation_dim=3: not an even integer"):
        tiny_cfg("model.pe.kind=nope", "model.pe.rotation_dim=3")
    assert tiny_cfg("model.pe.kind=rope", "model.pe.basis=paley").model.pe.basis == "paley"  # a sweep's shared axis


@pytest.mark.parametrize("scale", ["1e38", "1e-44"])
def test_grape_m_refuses_a_scale_whose_float32_spectrum_is_not_ropes(tiny_cfg, scale):
    with pytest.raises(UserError, match=r"model\.pe\.log_freq_scale=.*not RoPE at init"):
        tiny_cfg("model.pe.kind=grape_m", f"model.pe.log_freq_scale={scale}")
    assert tiny_cfg("model.pe.kind=grape_m", "model.pe.log_freq_scale=1e6").model.pe.log_freq_scale == 1e6


def test_dape_over_fire_inherits_fires_length_warning(tiny_cfg):
    from sweeps.design_warnings import length_warnings

    found = length_warnings(tiny_cfg("model.pe.kind=dape", "model.pe.base=fire"))
    assert len(found) == 1 and "DAPE-FIRE: model.pe.base=fire: init_threshold=512 is at or beyond" in found[0]
    assert length_warnings(tiny_cfg("model.pe.kind=dape")) == []  # KERPLE has no length


def test_dapes_fire_base_takes_the_official_leaky_relu():
    """The official FIRE_C / FIRE_DAPE re-typed: MLP(ψ(i−j)/ψ(max(i, L))) with a LeakyReLU (0.01), on the base's own
    parameters; plain FIRE keeps its ReLU."""
    from trainer.model.encodings.base import EncodingShape
    from trainer.model.position import build_position_encoding, pe_config_class

    shape = EncodingShape(8, 4, 2, 2, 32)
    dape = build_position_encoding(pe_config_class("dape")(kind="dape", base="fire"), shape)
    fire = dape.base
    with torch.no_grad():
        fire.b1.uniform_(-2, 2, generator=torch.Generator().manual_seed(0))  # negative pre-activations
    i, j = torch.arange(20.0)[:, None], torch.arange(20.0)[None, :]
    c, threshold = fire.c[1].abs(), (fire.multiplier[1] * fire.init_threshold).abs()
    x = (torch.log1p(c * (i - j).clamp(min=0)) / (torch.log1p(c * torch.maximum(i, threshold)) + 1e-6))[..., None]
    want = F.linear(F.leaky_relu(F.linear(x, fire.w1[1], fire.b1[1]), 0.01), fire.w2[1], fire.b2[1]).permute(2, 0, 1)
    torch.testing.assert_close(fire.score_bias(torch.arange(20), 20, 1), want, atol=1e-6, rtol=1e-6)
    plain = build_position_encoding(pe_config_class("fire")(kind="fire"), shape)
    assert plain.activation == "relu"


# --- where the docs and the code disagreed --------------------------------------------------------------------------

def test_the_docs_say_which_stick_breaking_code_the_lab_follows():
    text = " ".join((REPO / "docs" / "frontier-kinds.md").read_text().split())
    assert "returns `o + rem · v`" not in text
    assert "returns the pair (o, rem)" in text and "`tests/test_attn.py::ref_fwd`" in text and "GroupNorm" in text


def test_the_tasks_package_says_where_its_registry_lives():
    import importlib

    import trainer.data.tasks as tasks

    home = "trainer.data.tasks.registry"
    assert home in " ".join(tasks.__doc__.split())
    assert importlib.import_module(home).TASKS


# --- stored files read through their schema ------------------------------------------------------------------------

def _paired_position_loss(path: Path) -> None:
    """A version-2 loss-by-position file with every paired column measured (a window's loss at full and at the
    train length's context)."""
    import numpy as np

    from trainer.evals.position_loss import PositionLoss, write_position_loss

    rng = np.random.default_rng(0)
    full = {f: PositionLoss(np.full(16 * f, 2.0), np.full(16 * f, 4), 2.0 + 0.1 * rng.random((4, 16 * f)),
                            np.full((4, 16 * f), 3.0)) for f in (1, 2)}
    limited = {2: PositionLoss(np.full(32, 2.1), np.full(32, 4), 2.1 + 0.1 * rng.random((4, 32)))}
    write_position_loss(full, 4, "linear", path, limited=limited, train_length=16)


@pytest.mark.parametrize(("column", "damage", "said"), [
    ("diff_se", lambda v: [None] * len(v), "but diff_se is empty"),  # read "censored" before
    ("gain", lambda v: [str(x) for x in v], "column gain is stored as string"),  # ValueError before
    ("windows", lambda v: [0] * len(v), "windows = 0 in"),
])
def test_a_damaged_paired_column_of_a_loss_by_position_file_is_refused(tmp_path, column, damage, said):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.evals.position_loss import read_position_loss

    path = tmp_path / "position_loss.parquet"
    _paired_position_loss(path)
    table = read_position_loss(path)
    assert table.column("diff").null_count < table.num_rows  # measured where the limited pass ran
    at = table.column_names.index(column)
    values = table.column(column).to_pylist()
    if column == "diff_se":  # empty where the difference is measured
        values = [None if d is not None else v for d, v in zip(table.column("diff").to_pylist(), values, strict=True)]
    else:
        values = damage(values)
    pq.write_table(table.set_column(at, column, pa.array(values)), path)
    with pytest.raises(UserError, match=said):
        read_position_loss(path)


@pytest.mark.parametrize(("damage", "said"), [
    ("not parquet", "unreadable tasks table"),
    ("trained_distance 0", "trained_distance = 0 in"),
    ("no reach", r"missing columns \['reach'\]"),
])
def test_a_damaged_tasks_table_is_refused_naming_the_file_and_the_cell(tmp_path, damage, said):
    import pandas as pd
    import pyarrow.parquet as pq

    from analysis.distance import task_rows
    from trainer.evals.tasks_table import TASKS_FILE, TASKS_SCHEMA

    run = tmp_path / "cells" / "c1"
    run.mkdir(parents=True)
    row = {"task": "copy", "length_factor": 1.0, "length": 60, "target_length": 64, "example": 0, "params": "{}",
           "target": "ab", "generated": "ab", "correct": True, "token_acc": 1.0, "distance": 10,
           "trained_distance": 40, "reach": 50, "floor": 0.1, "token_skill": 1.0, "run_name": "r", "config_hash": "h",
           "pe_kind": "rope", "pe_label": "RoPE", "rotation_dim": 2, "basis": "identity", "basis_seed": None,
           "theta": 1e4, "scaling": "none"}
    table = pd.DataFrame([row])
    if damage == "not parquet":
        (run / TASKS_FILE).write_text("not a parquet file")
    else:
        if damage == "trained_distance 0":
            table["trained_distance"] = 0
        else:
            table = table.drop(columns="reach")
        pq.write_table(__import__("pyarrow").Table.from_pandas(table, preserve_index=False), run / TASKS_FILE)
    assert TASKS_SCHEMA.field("reach")  # the column the damaged table lacks is the schema's
    cells = pd.DataFrame({"cell_id": ["c1"], "run_dir": [str(run)]})
    with pytest.raises(UserError, match=rf"cell c1: {run / TASKS_FILE}: .*{said}"):
        task_rows(cells)


def test_a_machine_record_of_the_wrong_type_marks_its_cell_instead_of_raising(tmp_path):
    from sweeps.results import _machine
    from trainer.files.run_files import RUN_FILE, read_machines

    (tmp_path / RUN_FILE).write_text(json.dumps({"config_hash": "h", "machines": [{"cpu_model": "AMD EPYC",
                                                                                    "threads": "two"}]}))
    with pytest.raises(UserError, match=r"machines\[0\]\.threads='two' is not an integer"):
        read_machines(tmp_path)
    row, error = _machine(tmp_path)
    assert row["threads"] is None and "machines[0].threads='two'" in error


# --- the console's commands ----------------------------------------------------------------------------------------

def test_bench_encodings_checks_its_size_up_front_and_shows_its_progress(hdrope_here):
    big = hdrope_here(["bench", "encodings", "--shape", "1", "1", "200000", "16"])
    assert big.returncode == 2 and "would hold about" in big.stderr and "use S <=" in big.stderr
    small = hdrope_here(["bench", "encodings", "--shape", "1", "2", "16", "8", "--rounds", "1"])
    assert small.returncode == 0, small.stderr
    assert "round-robin rounds" in small.stdout.splitlines()[0] and "timing" in small.stderr


def test_a_run_that_diverges_from_its_initial_parameters_exits_2_and_leaves_nothing(hdrope_here, cache_dir, tmp_path):
    done = hdrope_here(["train", "tiny", f"data.cache_dir={cache_dir}", "model.pe.kind=comrope",
                        "model.pe.init_std=1e30", "train.steps=2", "--no-progress"], cwd=tmp_path)
    assert done.returncode == 2 and "set by model.pe.init_std=1e+30" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no run directory, no runs/ folder


# --- declared questions: sizing and answering -----------------------------------------------------------------------

def _results_pilot(tmp_path: Path, results) -> Path:
    """A finished pilot directory holding only a results.parquet of hand-made values."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "pilot"
    root.mkdir()
    table = pa.Table.from_pandas(results.assign(dedup_of=results["dedup_of"].astype(object),
                                                cell_id=[f"c{i}" for i in range(len(results))]), preserve_index=False)
    meta = {b"hdrope.axes": json.dumps(results.attrs["axes"]).encode(),
            b"hdrope.seed_axes": json.dumps(results.attrs["seed_axes"]).encode()}
    pq.write_table(table.replace_schema_metadata(meta), root / "results.parquet")
    return root


PALEY = {"rotation_dim": 4, "basis": "paley"}


def test_sizing_a_question_on_a_constant_metric_is_refused_as_without_questions(tmp_path):
    from analysis.questions import question_advice
    from sweeps.spec import Question
    from tests.test_edges_b import _results

    rows = [("rope", {}, 1e4, s, 2.0 + 0.1 * s) for s in (1, 2, 3)] + [("hdrope", PALEY, 1e4, s, 2.0 + 0.2 * s)
                                                                       for s in (1, 2, 3)]
    results = _results(rows).assign(acc_s5_x1=0.0)  # a task neither variant learned: 0 everywhere
    pilot = _results_pilot(tmp_path, results)
    with pytest.raises(UserError, match=r"4D Paley − RoPE on acc_s5_x1: every seed of both variants gave the same "
                                        r"value \(0\)"):
        question_advice(pilot, results, [Question("4D Paley", "RoPE", "acc_s5_x1")], 0.1)


def test_sizing_a_question_on_a_task_not_learned_says_so_naming_the_variants(tmp_path):
    from analysis.questions import question_advice
    from sweeps.spec import Question
    from tests.test_edges_b import _results

    rows = [("rope", {}, 1e4, s, 2.0) for s in (1, 2)] + [("hdrope", PALEY, 1e4, s, 2.1) for s in (1, 2)]
    results = _results(rows).assign(acc_copy_x1=[0.25, 0.0, 0.125, 0.0], n_copy_x1=8, acc_copy_x2=0.0, n_copy_x2=8)
    pilot = _results_pilot(tmp_path, results)
    with pytest.raises(UserError) as err:
        question_advice(pilot, results, [Question("4D Paley", "RoPE", "efflen_copy")], 0.5)
    message = str(err.value)
    assert "fewer than 2 seeds" not in message and "the task copy was not learned" in message
    assert "RoPE at θ=10000" in message and "4D Paley at θ=10000" in message


def test_a_question_whose_variant_has_no_values_says_so():
    from analysis.questions import declared_family
    from analysis.variants import trained
    from sweeps.spec import Question
    from tests.test_edges_b import _results

    rows = [("rope", {}, 1e4, s, 2.0) for s in (1, 2, 3)] + [("hdrope", PALEY, 1e4, s, 2.1) for s in (1, 2, 3)]
    cells = trained(_results(rows).assign(efflen_copy=[1.0, 1.5, 2.0, float("nan"), float("nan"), float("nan")]))
    rows_, missing = declared_family(cells, [Question("4D Paley", "RoPE", "efflen_copy")])
    assert rows_.empty and len(missing) == 1
    assert "4D Paley has no value of efflen_copy (empty in all 3 of its cells" in missing[0]
    assert "no θ at which both ran" not in missing[0]


def _planned(tmp_path: Path, overrides: dict, axes: dict, questions: list[dict]):
    import yaml

    from sweeps.plan import make_plan
    from sweeps.spec import load_spec

    spec = {"name": "q", "base": "tiny", "storage": str(tmp_path / "store"), "overrides": overrides, "axes": axes,
            "questions": questions}
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return make_plan(load_spec(path))


@pytest.mark.parametrize(("overrides", "axes", "question", "said"), [
    ({"data.tasks": ["flipflop"], "data.task_ratio": 0.5, "data.task_params.ops": 1},
     {"model.pe.kind": ["rope", "nope"]}, {"variant": "NoPE", "reference": "RoPE", "metric": "hardacc_flipflop_x1"},
     "no example of flipflop at data.task_params ops=1 is in its hard subset"),
    ({}, {"model.pe.kind": ["rope", "nope"]}, {"variant": "NoPE", "reference": "RoPE", "metric": "efflen_loss"},
     "compute only with eval.sliding_stride set"),
    ({}, {"model.pe": [{"kind": "rope", "theta": 10000.0},
                       {"kind": "hdrope", "rotation_dim": 4, "basis": "paley", "theta": 500000.0}]},
     {"variant": "4D Paley", "reference": "RoPE", "metric": "val_loss"}, "no θ at which both run"),
])
def test_a_question_the_cells_cannot_answer_is_refused_at_plan_time(tmp_path, overrides, axes, question, said):
    from sweeps.spec import SpecError

    with pytest.raises((UserError, SpecError), match=said):
        _planned(tmp_path, overrides, axes, [question])


def test_sizing_with_declared_questions_judges_the_windows_against_the_difference(tmp_path, hdrope_here):
    """`sweep plan --detect --pilot` said nothing of too few validation windows when the spec declared questions."""
    import yaml

    from tests.test_edges_b import _results

    rows = [("rope", {}, 1e4, s, 2.0 + 0.01 * s) for s in (1, 2, 3)] + [
        ("hdrope", PALEY, 1e4, s, 2.0 + 0.03 * s) for s in (1, 2, 3)]
    results = _results(rows).assign(val_loss_x4=lambda d: d["val_loss"] + 0.3)
    pilot = _results_pilot(tmp_path, results)
    spec = {"name": "sized", "base": "tiny", "storage": str(tmp_path / "store"),
            "overrides": {"eval.extrapolation": [4], "eval.windows": 2, "model.pe.rotation_dim": 4,
                          "model.pe.basis": "paley"},
            "axes": {"model.pe.kind": ["rope", "hdrope"], "seed": [1, 2, 3]},
            "questions": [{"variant": "4D Paley", "reference": "RoPE", "metric": "val_loss_x4"}]}
    path = tmp_path / "sized.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = hdrope_here(["seeds", str(path), "--detect", "0.01", "--pilot", str(pilot)])
    assert done.returncode == 0, done.stderr
    assert "declared family" in done.stdout and "warning:" in done.stderr and "window" in done.stderr


# --- derived numbers of shipped studies ----------------------------------------------------------------------------

def test_a_shipped_task_effective_length_is_kept_not_recomputed_by_the_old_rule():
    """Cells without run files (shipped results) carry their effective lengths; the report read them through the
    length-factor rule of runs that predate distances instead (in train lengths, labelled as on distance)."""
    from analysis.lengthgen import with_effective_lengths
    from analysis.variants import trained
    from tests.test_edges_b import _results

    rows = [("rope", {}, 1e4, s, 2.0) for s in (1, 2, 3)]
    shipped = {"acc_copy_x1": 1.0, "acc_copy_x2": 1.0, "acc_copy_x4": 0.0, "n_copy_x1": 32, "n_copy_x2": 32,
               "n_copy_x4": 32, "efflen_copy": [1.0, 1.25, 1.5], "poslen_copy": [2.0, 2.0, 4.0]}
    cells = trained(_results(rows)).drop(columns="run_dir", errors="ignore").assign(**shipped)
    got = with_effective_lengths(cells)
    assert got["efflen_copy"].tolist() == [1.0, 1.25, 1.5] and got["poslen_copy"].tolist() == [2.0, 2.0, 4.0]


def test_a_declared_question_without_data_still_counts_in_the_family():
    """A study declared two questions; one lost its data. The other is still corrected over two, as declared (it
    was corrected over one)."""
    from analysis.questions import declared_family
    from analysis.variants import trained
    from sweeps.spec import Question
    from tests.test_edges_b import _results

    rows = [("rope", {}, 1e4, s, 2.0 + 0.01 * s) for s in range(1, 9)]
    rows += [("hdrope", PALEY, 1e4, s, 2.5 + 0.02 * s) for s in range(1, 9)]
    cells = trained(_results(rows))
    asked = [Question("4D Paley", "RoPE", "val_loss"), Question("4D Paley", "RoPE", "efflen_copy")]
    family, missing = declared_family(cells, asked)
    alone, _ = declared_family(cells, asked[:1])
    assert len(missing) == 1 and len(family) == 1
    assert family["family"].iloc[0] == 2 and alone["family"].iloc[0] == 1
    assert family["p_adj"].iloc[0] == pytest.approx(2 * alone["p_adj"].iloc[0])


def test_a_study_shipped_under_an_earlier_effective_length_rule_is_read_without_those_columns(tmp_path):
    """The task effective lengths changed definition (windows read apart, issue 47 case 37): a study that records
    the earlier rule (or none) keeps its cells, loses those columns, and its rebuilt report says so."""
    folder = _copy("lengthgen_compact", tmp_path / "study")
    study_json = json.loads((folder / STUDY_FILE).read_text())
    study_json["rules"] = {"task_effective_length": 1}
    study_json["columns"]["efflen_copy"] = "float64"  # as the study was shipped under the earlier rule
    (folder / STUDY_FILE).write_text(json.dumps(study_json))
    lines = (folder / CELLS_FILE).read_text().splitlines()
    (folder / CELLS_FILE).write_text("\n".join([lines[0] + ",efflen_copy", *(f"{r},1.5" for r in lines[1:])]) + "\n")
    study = load_study(folder)
    assert study.stale == ["efflen_copy"]
    assert not set(study.stale) & set(study.results.columns) and "efflen_loss" in study.results
    assert "shipped under an earlier definition of the task effective lengths" in rebuild(folder)
    study_json["rules"] = {"task_effective_length": "two"}
    (folder / STUDY_FILE).write_text(json.dumps(study_json))
    with pytest.raises(UserError, match="field 'rules'"):
        load_study(folder)


def test_a_loss_file_scored_on_one_window_has_empty_standard_errors_and_reads(tmp_path):
    """One validation window has no spread: its standard errors are empty, which the reader accepted nowhere (a tiny
    sweep's own files were refused as damaged)."""
    import numpy as np

    from trainer.evals.position_loss import PositionLoss, read_position_loss, write_position_loss

    full = {f: PositionLoss(np.full(16 * f, 2.0), np.full(16 * f, 1), np.full((1, 16 * f), 2.0),
                            np.full((1, 16 * f), 3.0)) for f in (1, 2)}
    limited = {2: PositionLoss(np.full(32, 2.1), np.full(32, 1), np.full((1, 32), 2.1))}
    path = tmp_path / "position_loss.parquet"
    write_position_loss(full, 4, "linear", path, limited=limited, train_length=16)
    table = read_position_loss(path).to_pandas()
    assert (table["windows"] == 1).all() and table["diff_se"].isna().any()
