"""Issue 34's hostile inputs on tasks, run directories and copied or moved sweeps: each test failed before its fix."""

from __future__ import annotations

import shutil
import string
import time
from pathlib import Path

import numpy as np
import pytest

from hdrope.errors import UserError
from trainer.config import TaskParams
from trainer.data.tasks.build import TaskBuilder, check_fit
from trainer.data.tokenizer import ByteTokenizer, JsonTokenizer

FILLER = np.arange(5000) % 250


# --- case 1: a copied sweep writes into the original ------------------------------------------------------------


def _sweep_store(root: Path, name: str = "edges") -> str:
    """Sweep `name`'s own MLflow store with its parent run, made as the sweep driver makes it; the parent run's id."""
    from trainer.run.tracking import SweepTracker, default_tracking_uri

    return SweepTracker(default_tracking_uri(root), name, root / "artifacts").parent_run()


def test_a_copied_sweeps_store_logs_into_the_copy_and_never_recreates_the_original(tmp_path):
    import mlflow

    from trainer.run.tracking import SweepTracker, default_tracking_uri

    pilot = tmp_path / "pilot"
    pilot.mkdir()
    parent = _sweep_store(pilot)
    shutil.copytree(pilot, tmp_path / "COPY")
    pilot.rename(tmp_path / "moved")  # the original is moved away after the copy
    copy = tmp_path / "COPY"
    note = tmp_path / "note.md"
    note.write_text("report")
    tracker = SweepTracker(default_tracking_uri(copy), "edges", copy / "artifacts")  # what a resume of COPY opens
    tracker.client.log_artifact(parent, str(note), artifact_path="report")
    assert (copy / "artifacts" / parent / "artifacts" / "report" / "note.md").is_file()
    assert not pilot.exists(), "the moved-away original was recreated"
    assert not (tmp_path / "moved" / "artifacts").exists()
    exp = mlflow.MlflowClient(default_tracking_uri(copy)).get_experiment_by_name("edges")
    assert exp.artifact_location == (copy / "artifacts").resolve().as_uri()


def test_a_report_on_a_copy_of_a_moved_sweep_writes_inside_the_copy_with_every_figure(tiny_sweep, tmp_path):
    """`cp -r pilot COPY; mv pilot elsewhere; hdrope report COPY`: the report's files go to COPY's own artifacts (the
    original is not recreated), and the loss-by-position figure and loss effective length are there (case 5)."""
    from analysis.report import build_report
    from sweeps.plan_file import load_plan
    from sweeps.results import write_results

    pilot = tmp_path / "pilot"
    shutil.copytree(tiny_sweep, pilot, ignore=shutil.ignore_patterns("report", "mlflow.db", "artifacts"))
    write_results(load_plan(pilot))  # its results name its own cells, as `sweep results` writes them
    parent = _sweep_store(pilot, "tinysweep")
    copy = tmp_path / "COPY"
    shutil.copytree(pilot, copy)
    pilot.rename(tmp_path / "elsewhere")
    report = build_report(copy)
    logged = copy / "artifacts" / parent / "artifacts" / "report"
    assert (logged / "report.md").is_file() and any(logged.glob("*.png"))
    assert not pilot.exists(), "the report recreated the moved-away original"
    text = report.read_text()
    assert "## Loss by position" in text and "Cells whose run directory is gone" not in text
    assert any(p.name.startswith("position_loss") for p in report.parent.glob("*.png"))


# --- case 5: a moved sweep's cells are found where the sweep is now ------------------------------------------------


def test_a_moved_sweep_reads_its_cells_where_it_is_now_and_names_a_missing_one(tiny_sweep, tmp_path):
    from analysis.lengthgen import LOSS_REASON, position_losses, with_effective_lengths
    from analysis.load import missing_run_dirs, sweep_cells
    from sweeps.plan_file import load_plan
    from sweeps.results import write_results

    before = tmp_path / "before"
    shutil.copytree(tiny_sweep, before, ignore=shutil.ignore_patterns("report", "mlflow.db", "artifacts"))
    write_results(load_plan(before))
    after = tmp_path / "after"
    before.rename(after)  # `mv` after `sweep results`
    cells = sweep_cells(after)
    assert all(Path(d).parent == (after / "cells").resolve() for d in cells["run_dir"])
    assert len(set(position_losses(cells)["cell"])) == len(cells)
    assert with_effective_lengths(cells)[LOSS_REASON].notna().all()  # every cell's loss file read (a reading each)
    gone = cells["run_dir"].iloc[0]
    shutil.rmtree(gone)
    assert missing_run_dirs(sweep_cells(after)) == [cells["cell_id"].iloc[0]]


# --- case 2: train never overwrites the user's own files -----------------------------------------------------------


def test_train_refuses_a_directory_of_the_users_own_files_before_writing(tiny_cfg, tmp_path):
    from trainer.run.loop import train

    mine = tmp_path / "mine"
    mine.mkdir()
    files = {"tasks.parquet": b"my table", "position_loss.parquet": b"my losses", "notes.txt": b"my notes"}
    for name, data in files.items():
        (mine / name).write_bytes(data)
    with pytest.raises(UserError, match=rf"train\.out_dir='{mine}': holds 'notes\.txt' and 2 more, which `hdrope "
                       r"train` did not write \(the directory holds no run\.json, so it is no run's\); pass a new"):
        train(tiny_cfg("data.tasks=[copy]", "train.steps=1", out="mine"))
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == files  # not even a lock file left
    # what a run directory holds before its run.json (a failed sweep trial's error.txt, a lock) is the run's own
    from trainer.files.run_files import refuse_foreign_run_dir

    retried = tmp_path / "cell"
    retried.mkdir()
    (retried / "error.txt").write_text("RuntimeError: the last attempt\n")
    (retried / ".hdrope.lock").write_text("{}")
    refuse_foreign_run_dir(retried)


def test_train_into_a_users_directory_is_exit_2_on_the_cli(tmp_path, cache_dir, hdrope_here):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    proc = hdrope_here(["train", "tiny", f"train.out_dir={mine}", f"data.cache_dir={cache_dir}"])
    assert proc.returncode == 2 and "notes.txt" in proc.stderr and "train.out_dir" in proc.stderr, proc.stderr[-800:]
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


# --- case 3: an empty answer is never a correct one ---------------------------------------------------------------


def _letters_tokenizer(tmp_path: Path, unk: bool) -> JsonTokenizer:
    """A plain BPE over lowercase letters, space and <> only: no digits, no '#' (with or without an unknown token)."""
    from tokenizers import Tokenizer, models

    vocab = {c: i for i, c in enumerate(string.ascii_lowercase + " <>")}
    if unk:
        vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]" if unk else None))
    path = tmp_path / f"letters-{unk}.json"
    tok.save(str(path))
    return JsonTokenizer(path)


def test_a_tokenizer_that_cannot_write_a_tasks_symbols_is_refused_naming_them(tmp_path):
    builder = TaskBuilder(_letters_tokenizer(tmp_path, unk=False), TaskParams(), FILLER)
    with pytest.raises(UserError, match=r"data\.tokenizer=.*letters-False\.json: it writes the symbols '#' '\.' "
                                        r"'0' '1' .* of task niah_single as no token at all; use a tokenizer"):
        check_fit(builder, "niah_single", 64, "here")
    check_fit(builder, "copy", 64, "here")  # copy writes letters and < >, which it has
    with pytest.raises(UserError, match=r"answer .* is no token"):  # an example is never built with an empty answer
        builder.build("niah_single", 64, np.random.default_rng(0))
    unk = TaskBuilder(_letters_tokenizer(tmp_path, unk=True), TaskParams(), FILLER)
    with pytest.raises(UserError, match=r"writes the symbols '#' and '\.' of task niah_single as the same tokens"):
        check_fit(unk, "niah_single", 64, "here")


# --- case 6: a length factor listed twice -------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "match"), [
    (["data.tasks=[copy]", "eval.tasks.length_factors=[1,2,2]"],
     r"eval\.tasks\.length_factors=\[1\.0, 2\.0, 2\.0\]: the factor 2 is listed twice \(2\.0 and 2\.0\); list each"),
    (["eval.passkey.length_factors=[4,4.0]"], r"eval\.passkey\.length_factors=\[4\.0, 4\.0\]: the factor 4 is listed"),
    (["eval.extrapolation=[2,4,2]"], r"eval\.extrapolation=\[2, 4, 2\]: the factor 2 is listed twice"),
])
def test_a_length_factor_listed_twice_is_refused_naming_it(tiny_cfg, overrides, match):
    with pytest.raises(UserError, match=match):
        tiny_cfg(*overrides)


# --- case 7: a huge task size is refused at once ------------------------------------------------------------------


def test_a_huge_value_digits_is_refused_at_once_naming_the_largest_that_fits():
    builder = TaskBuilder(ByteTokenizer(), TaskParams(value_digits=100_000), FILLER)
    started = time.perf_counter()
    # niah_single: '# k v… .' + '# k' + the answer's v digits = 5 + 2v tokens <= 65
    with pytest.raises(UserError, match=r"takes 200005 tokens but here holds 65; the largest size that fits, the "
                                        r"others kept: data\.task_params\.value_digits=30, or raise"):
        check_fit(builder, "niah_single", 65, "here")
    assert time.perf_counter() - started < 2.0


# --- case 11: a task parameter on a spec axis is checked per cell at plan time ------------------------------------


def test_sweep_plan_refuses_a_cell_whose_task_does_not_fit_before_ray(tmp_path, cache_dir, hdrope_here):
    spec = tmp_path / "tasks.yaml"
    spec.write_text(f"name: taskaxis\nbase: tiny\nstorage: {tmp_path / 'store'}\noverrides:\n"
                    f"  data.cache_dir: {cache_dir}\n  data.tasks: [niah_single]\n  data.task_ratio: 0.5\n"
                    "axes:\n  data.task_params.value_digits: [1, 40]\n  seed: [1, 2]\n")
    proc = hdrope_here(["sweep", "plan", str(spec)])
    assert proc.returncode == 2, proc.stdout[-800:] + proc.stderr[-800:]
    assert "value_digits=40" in proc.stderr and "smallest niah_single example" in proc.stderr
    assert "data.task_params.value_digits=30" in proc.stderr  # the largest that fits 64 + 1 tokens
    assert "value_digits=1," not in proc.stderr.replace("value_digits=1)", "")  # the 1-digit cells are fine
    assert not (tmp_path / "store").exists()


# --- kin: what a run checks only after loading its data, a plan checks per cell when it needs no data -------------


def test_sweep_plan_refuses_a_cell_whose_attention_dump_exceeds_its_budget(tmp_path, cache_dir):
    from sweeps.plan import make_plan
    from sweeps.spec import SpecError, load_spec

    spec = tmp_path / "dump.yaml"
    spec.write_text(f"name: dumpaxis\nbase: tiny\nstorage: {tmp_path / 'store'}\noverrides:\n"
                    f"  data.cache_dir: {cache_dir}\n  dump.enabled: true\n  dump.byte_budget: 100000\n"
                    "axes:\n  dump.samples: [1, 100]\n")
    with pytest.raises(SpecError) as err:
        make_plan(load_spec(str(spec)))
    assert len(err.value.problems) == 1
    assert "cell c001-" in err.value.problems[0] and "dump.samples=100" in err.value.problems[0]
    assert "dump.byte_budget" in err.value.problems[0]


def test_a_dump_layer_or_head_listed_twice_is_refused(tiny_cfg):
    with pytest.raises(UserError, match=r"dump\.layers=\[0, 0\]: an index is listed twice"):
        tiny_cfg("dump.layers=[0,0]")
    with pytest.raises(UserError, match=r"dump\.heads=\[1, 1\]: an index is listed twice"):
        tiny_cfg("dump.heads=[1,1]")
