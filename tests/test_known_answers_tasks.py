"""Known answers for the task instruments (issue 33): stand-in decoders of known skill, scored by the lab's own task
evaluation (`evaluate_tasks`, greedy decoding, tasks.parquet rows) and read by the report's analysis, at the prompt
counts the shipped studies use (tasks_compact: 32, lengthgen_compact: 64) on 8 independent prompt sets each.

- an oracle: exact match 1 in every distance bin, effective length at the longest evaluated distance;
- right up to distance 2D (D: the longest distance trained on), a format guess past it: effective length 2;
- never learned (format guesses everywhere): "not learned", chance-corrected token accuracy about 0 where the raw
  token accuracy sits at its floor (1/span = 0.25);
- right in windows up to 2x at every distance, a guess in longer windows (issue 47 case 37): position effective
  length 2, and on distance nothing crossed (at least 2) where the "to 2D" model, which fails by distance, reads
  position 8.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.distance import accuracy_by_distance, distance_grid, distance_notes, task_rows
from analysis.lengthgen import learned_table
from analysis.task_answers import FACTORS, known_answer_cells
from trainer.config import task_metric
from trainer.data.tasks.build import TaskBuilder
from trainer.data.tasks.registry import TASKS
from trainer.data.tasks.spec import TaskParams
from trainer.data.tokenizer import ByteTokenizer

TRAIN_LENGTH, SETS = 32, range(8)
PROMPTS = (32, 64)  # eval.tasks.samples of experiments/tasks_compact.yaml and experiments/tables/lengthgen_compact.yaml
TASK = "copy"


@pytest.fixture(scope="module")
def builder(shakespeare):
    """The tasks_compact design's builder: bytes, keys from `symbols`, span 4, filler from the validation text."""
    tok = ByteTokenizer()
    return TaskBuilder(tok, TaskParams(keys=7, key_set="symbols", span=4),
                       np.asarray(tok.encode("".join(shakespeare.val)), dtype=np.int64))


@pytest.fixture(scope="module")
def scored(builder, tmp_path_factory):
    """prompts -> cells of the three stand-ins (8 prompt sets each), efflen_copy from the report's analysis."""
    trained = builder.max_distance(TASK, TRAIN_LENGTH + 1)
    window = round(TRAIN_LENGTH * 2)  # prompts of windows up to 2x the train length
    models = {"oracle": lambda d, n: True, "to 2D": lambda d, n: d <= 2 * trained, "guesser": lambda d, n: False,
              "to 2x windows": lambda d, n: n <= window}
    root = tmp_path_factory.mktemp("known-answers")
    return {n: known_answer_cells(builder, [TASK], TRAIN_LENGTH, n, SETS, models, root) for n in PROMPTS}


def _sets(cells, variant):
    return cells[cells["variant"] == variant]


@pytest.mark.parametrize("prompts", PROMPTS)
def test_an_oracle_is_right_at_every_distance_and_reaches_the_longest(scored, builder, prompts):
    cells = scored[prompts]
    rows = task_rows(cells)
    longest = builder.max_distance(TASK, round(TRAIN_LENGTH * max(FACTORS))) / builder.max_distance(
        TASK, TRAIN_LENGTH + 1)
    for idx, _ in _sets(cells, "oracle").iterrows():
        bins = accuracy_by_distance(rows[rows["cell"] == idx])
        seen = bins[bins["n"] > 0]
        assert (seen["k"] == seen["n"]).all() and seen["unseen"].sum() >= 4
    assert _sets(cells, "oracle")["efflen_copy"].tolist() == pytest.approx([longest] * len(SETS))


@pytest.mark.parametrize("prompts", PROMPTS)
def test_a_model_right_to_2d_has_effective_length_2(scored, prompts):
    cells = scored[prompts]
    rows = task_rows(cells)
    assert _sets(cells, "to 2D")["efflen_copy"].tolist() == [2.0] * len(SETS)
    for idx, _ in _sets(cells, "to 2D").iterrows():
        bins = accuracy_by_distance(rows[rows["cell"] == idx]).set_index("m")
        assert (bins.loc[[1.0, 1.5, 2.0], "k"] == bins.loc[[1.0, 1.5, 2.0], "n"]).all()
        past = bins.loc[bins.index > 2]
        assert past["k"].sum() / past["n"].sum() < 0.15  # a format guess: 1/24 of four distinct symbols


@pytest.mark.parametrize("prompts", PROMPTS)
def test_a_model_that_never_learned_reads_not_learned_and_no_skill(scored, builder, prompts):
    cells = scored[prompts]
    learned = learned_table(cells).set_index("variant")
    assert not learned.loc["guesser", "learned"] and learned.loc[["oracle", "to 2D"], "learned"].all()
    assert _sets(cells, "guesser")["efflen_copy"].isna().all()
    assert builder.floor(TASK) == 0.25
    for f in FACTORS:
        raw = _sets(cells, "guesser")[task_metric("tokacc", TASK, f)].mean()
        skill = _sets(cells, "guesser")[task_metric("tokskill", TASK, f)].mean()
        assert raw == pytest.approx(0.25, abs=0.05)  # the floor, which token accuracy alone shows as skill
        assert skill == pytest.approx(0.0, abs=0.07)
        assert _sets(cells, "oracle")[task_metric("tokskill", TASK, f)].eq(1.0).all()


def test_the_report_tables_show_distance_bins_past_training_and_not_learned(scored):
    """What the report's length section renders per task (`distance_grid`, `distance_notes`)."""
    cells = scored[32]
    rows = task_rows(cells)
    grid = distance_grid(cells, rows, {("guesser", -1.0)})
    windows = [f"{f:g}x" for f in FACTORS]
    assert list(grid.index) == [f"{m} · {w}" for m in ["oracle", "to 2D", "guesser", "to 2x windows"] for w in windows]
    assert grid.columns[0] == "≤1× (0–22)" and all(c.endswith("†") for c in grid.columns[1:])
    assert (grid.loc[[f"guesser · {w}" for w in windows]] == "not learned").all().all()
    oracle = grid.loc[[f"oracle · {w}" for w in windows]].stack()
    assert oracle[oracle != "—"].str.match(r"(\d+)/\1 = 100%").all()
    assert (grid.loc["oracle · 1x"].iloc[1:] == "—").all()  # a 1x window holds no distance past the trained one
    assert grid.columns[-1] == "8–11.1× (177–245) †"  # the last bin ends at the longest evaluated distance
    skill = grid.loc["to 2D · 8x"].str.extract(r"skill (-?[0-9.]+)")[0].astype(float)
    assert (skill.iloc[:3] == 1.0).all() and (skill.iloc[3:].abs() < 0.15).all()
    near = grid.loc[[f"to 2x windows · {w}" for w in windows], "≤1× (0–22)"].str.extract(r"= (\d+)%")[0].astype(int)
    assert list(near)[:3] == [100] * 3 and (near.iloc[3:] < 15).all()  # near answers fail in long windows
    notes = " ".join(distance_notes(rows))
    assert "22 tokens" in notes and "floor 0.25" in notes


@pytest.mark.parametrize("task", sorted(TASKS))
def test_each_example_records_the_gap_from_its_earliest_needed_insert_to_the_question(builder, task):
    from trainer.evals.tasks import task_examples

    p = TaskParams(keys=7, key_set="symbols", span=4)
    for ex in task_examples(builder, task, 96, 16, seed=3):
        inst = TASKS[task].draw(p, np.random.default_rng(0))
        end = len(ex.prompt) - len(inst.question) - ex.distance  # where the earliest needed insert ends
        # the earliest needed insert: its closing marker, or for a state task its opening marker and payload
        opening = {"flipflop": ("@", 2), "flipflop_dense": ("@", 2), "parity": ("*", 2), "cycle": (";", 2),
                   "s3": ("[", 4), "s5": ("[", 6), "selective_copy": ("_", 2)}
        if task in opening:
            marker, width = opening[task]
            assert chr(ex.prompt[end - width]) == marker
        else:
            closing = {"copy": ">", "reverse": ">", "addition": ")", "mqar": "}"}.get(task, ".")
            assert chr(ex.prompt[end - 1]) == closing
        assert 0 <= ex.distance <= builder.max_distance(task, 96)
    trained = builder.max_distance(task, TRAIN_LENGTH + 1)
    assert trained > 0 and not math.isnan(builder.floor(task)) and 0 < builder.floor(task) < 1


@pytest.mark.parametrize("prompts", PROMPTS)
def test_failure_by_position_and_by_distance_each_read_as_such(scored, prompts):
    cells = scored[prompts]
    by_window, by_distance = _sets(cells, "to 2x windows"), _sets(cells, "to 2D")
    assert by_window["poslen_copy"].tolist() == [2.0] * len(SETS)
    assert (by_window["efflen_copy"] >= 2.0).all(), by_window["efflen_copy"].tolist()
    assert by_distance["poslen_copy"].tolist() == [max(FACTORS)] * len(SETS)
    assert by_distance["efflen_copy"].tolist() == [2.0] * len(SETS)
    assert _sets(cells, "oracle")["poslen_copy"].tolist() == [max(FACTORS)] * len(SETS)
    assert _sets(cells, "guesser")["poslen_copy"].isna().all()  # not learned: no value
