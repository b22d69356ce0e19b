"""The state-tracking and counting tasks (issue 36): each answer is what its instructions say, independently
recomputed; an oracle scores 1 and a format guess scores the task's chance floor through the lab's own task
evaluation (greedy decoding, exact match and token accuracy)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from analysis.task_answers import score
from trainer.config import task_metric
from trainer.data.tasks.build import TaskBuilder
from trainer.data.tasks.registry import TASKS
from trainer.data.tasks.spec import TaskParams
from trainer.data.tasks.state import CYCLE, SPECS
from trainer.data.tokenizer import ByteTokenizer

STATE = [s.name for s in SPECS]


def draws(task: str, n: int = 400, **params):
    p = TaskParams(**params)
    return [TASKS[task].draw(p, np.random.default_rng([n, i])) for i in range(n)]


@pytest.mark.parametrize(("task", "ignore"), [("flipflop", 0.8), ("flipflop_dense", 0.1)])
def test_flipflop_reads_back_the_last_written_bit(task, ignore):
    insts = draws(task, ops=10)
    for inst in insts:
        assert inst.inserts[0][0] == "@"  # the first instruction writes
        last = max(i for i, ins in enumerate(inst.inserts) if ins[0] == "@")
        assert inst.answer == [inst.inserts[last][1]] and inst.needed == [last] and inst.question == ["@", "="]
        assert all(ins[0] in "@&" and ins[1] in "01" for ins in inst.inserts)
    ignores = np.mean([ins[0] == "&" for inst in insts for ins in inst.inserts[1:]])
    assert abs(ignores - ignore) < 0.04  # 3600 instructions: the ignore share is the variant's


@pytest.mark.parametrize(("task", "ignore", "ops"), [("flipflop", 0.8, 3), ("flipflop_dense", 0.1, 3),
                                                   ("flipflop", 0.8, 6)])
def test_flipflop_shortcuts_score_their_known_ceilings_and_trailing_ignores_defeat_them(task, ignore, ops):
    """Two shortcuts a model may learn instead of flip-flop: the bit of the last instruction (right unless ignores
    trail the last write, then a coin flip) and the bit of the first (always a write; right when no later one
    writes, else a coin flip). With ignore probability i their accuracies are 1 - i/2 and i^(ops-1) +
    (1 - i^(ops-1))/2: 0.95 and 0.505 on flipflop_dense at ops 3, 0.6 and 0.82 on flipflop at ops 3. The drawn
    examples reach them within 4 binomial standard errors, and on the examples with trailing ignores
    (`params["trailing"]`) the last-instruction shortcut is at 1/2."""
    n = 4000
    insts = draws(task, n=n, ops=ops)
    trailing = np.array([inst.params["trailing"] for inst in insts])
    assert all(t == ops - 1 - inst.needed[0] for t, inst in zip(trailing, insts, strict=True))
    last_bit = np.array([inst.inserts[-1][1] == inst.answer[0] for inst in insts])
    first_bit = np.array([inst.inserts[0][1] == inst.answer[0] for inst in insts])
    p_trailing = ignore  # the last instruction is an ignore (it is never the first, which writes)
    p_only_first = ignore ** (ops - 1)  # no write after the first
    expected = {"last": 1 - p_trailing / 2, "first": p_only_first + (1 - p_only_first) / 2}
    for name, hits in (("last", last_bit), ("first", first_bit)):
        se = np.sqrt(expected[name] * (1 - expected[name]) / n)
        assert abs(hits.mean() - expected[name]) < 4 * se, (name, hits.mean(), expected[name])
    subset = last_bit[trailing > 0]
    assert abs(subset.mean() - 0.5) < 4 * np.sqrt(0.25 / len(subset))


def test_parity_and_cycle_answers_are_the_sum_of_their_inserts():
    for inst in draws("parity", ops=7):
        assert inst.answer == [str(sum(int(b) for _, b in inst.inserts) % 2)] and len(inst.inserts) == 7
    steps = {"+": 1, "-": -1, "0": 0}
    for inst in draws("cycle", ops=9):
        assert inst.answer == [str(sum(steps[m] for _, m in inst.inserts) % CYCLE)]


@pytest.mark.parametrize(("task", "n"), [("s3", 3), ("s5", 5)])
def test_a_word_problem_answer_is_the_product_of_its_permutation_matrices(task, n):
    def matrix(perm):  # P e_x = e_{perm(x)}
        m = np.zeros((n, n), dtype=int)
        m[list(perm), range(n)] = 1
        return m

    seen = set()
    for inst in draws(task, ops=5):
        word = [tuple(int(d) for d in ins[1:]) for ins in inst.inserts]
        product = np.eye(n, dtype=int)
        for g in word:  # the first applied first: P_last … P_first
            product = matrix(g) @ product
        assert inst.answer == [str(int(np.argmax(product[:, x]))) for x in range(n)]
        seen.update(word)
    assert len(seen) == len(list(itertools.permutations(range(n))))  # every element of the group is drawn


def test_selective_copy_asks_for_its_scattered_keys_in_order():
    for inst in draws("selective_copy", span=5):
        assert [ins[1] for ins in inst.inserts] == inst.answer and len(set(inst.answer)) == 5
        assert all(ins[0] == "_" for ins in inst.inserts) and inst.question == ["_", "="]


@pytest.fixture(scope="module")
def builder(shakespeare):
    tok = ByteTokenizer()
    return TaskBuilder(tok, TaskParams(keys=7, key_set="symbols", span=4, ops=4),
                       np.asarray(tok.encode("".join(shakespeare.val)), dtype=np.int64))


@pytest.mark.parametrize("task", STATE)
def test_an_oracle_scores_1_and_a_format_guess_scores_the_chance_floor(builder, task):
    """256 prompts at 1x through `evaluate_tasks`: the oracle's exact match is 1; the guesser's token accuracy is
    the task's floor within 4 binomial standard errors (a one-symbol answer: one of the task's answers at random;
    else the answer's symbols shuffled), and its chance-corrected token accuracy is about 0."""
    samples, train = 256, 48
    oracle = score(builder, [task], train, samples, seed=1, knows=lambda d, n: True, factors=(1.0,))
    guess = score(builder, [task], train, samples, seed=1, knows=lambda d, n: False, factors=(1.0,))
    assert oracle.metrics[task_metric("acc", task, 1.0)] == 1.0
    floor = builder.floor(task)
    tokacc = guess.metrics[task_metric("tokacc", task, 1.0)]
    assert abs(tokacc - floor) < 4 * (floor * (1 - floor) / samples) ** 0.5
    assert abs(guess.metrics[task_metric("tokskill", task, 1.0)]) < 0.2


def test_the_hard_subset_score_counts_the_examples_with_trailing_ignores(builder):
    """Through the lab's evaluation at frontier_compact's 1024 prompts, on 8 independent prompt sets: `hardn_…` is the
    number of examples with trailing ignores (about 1 in 10 at ignore probability 0.1), on which the oracle's
    `hardacc_…` is 1 and a guesser's 1/2 within 4 standard errors. (That the last-instruction shortcut is a coin flip
    there: the shortcut test above.)"""
    from trainer.evals.tasks import task_examples

    samples, train, task = 1024, 48, "flipflop_dense"
    for seed in range(8):
        hard = sum(TASKS[task].hard(ex.params) for ex in task_examples(builder, task, train, samples, seed))
        assert 60 < hard < 150, (seed, hard)
        oracle = score(builder, [task], train, samples, seed, knows=lambda d, n: True, factors=[1.0]).metrics
        assert oracle[f"hardn_{task}_x1"] == hard and oracle[f"hardacc_{task}_x1"] == 1.0, seed
        guess = score(builder, [task], train, samples, seed, knows=lambda d, n: False, factors=[1.0]).metrics
        assert guess[f"hardn_{task}_x1"] == hard, seed
        assert abs(guess[f"hardacc_{task}_x1"] - 0.5) < 4 * np.sqrt(0.25 / hard), (seed, guess[f"hardacc_{task}_x1"])
    parity = score(builder, ["parity"], train, 8, 5, knows=lambda d, n: True, factors=[1.0]).metrics
    assert "hardacc_parity_x1" not in parity  # only a task with a shortcut subset has one


PILOT = Path(__file__).resolve().parents[1] / "experiments" / "pilots" / "state_tasks.csv"
PILOT_LABELS = {"rope": "RoPE", "fox": "FoX", "nope": "NoPE"}


def _beats_a_coin_flip(correct: int, n: int) -> bool:
    """The docs' per-run reading of tracking: the hard prompts' exact match above 1/2 (one-sided binomial, α 0.05)."""
    from scipy.stats import binomtest

    return binomtest(correct, n, 0.5, alternative="greater").pvalue < 0.05


def _paired_spread(score: dict, variant: str, reference: str) -> float:
    """The standard deviation over shared seeds of score[variant, seed] − score[reference, seed]."""
    seeds = sorted({s for k, s in score if k == variant} & {s for k, s in score if k == reference})
    assert len(seeds) >= 2, (variant, reference, seeds)
    return float(np.std([score[variant, s] - score[reference, s] for s in seeds], ddof=1))


def test_the_docs_quote_the_state_task_pilot_and_its_seed_sizing_from_its_file():
    """docs/tasks.md's second-pilot table is experiments/pilots/state_tasks.csv, row by row, and the seeds it says a
    FoX vs RoPE comparison needs are `seeds_needed` on that file's paired differences."""
    import csv

    from analysis.stats import seeds_needed

    rows = list(csv.DictReader(PILOT.open()))
    text = (PILOT.parents[2] / "docs" / "tasks.md").read_text()
    for r in rows:
        rescored = f"{r['correct1024_trailing']}/{r['n1024_trailing']}" if r["n1024_trailing"] else "not scored"
        line = (f"| `{r['task']}` | {r['ops']} | {r['train_length']} | {r['steps']} | {PILOT_LABELS[r['kind']]} | "
                f"{r['seed']} | {r['correct']}/{r['n']} | {r['correct_trailing']}/{r['n_trailing']} | {rescored} |")
        assert line in text, line
    dense = {(r["kind"], int(r["seed"])): int(r["correct"]) / int(r["n"]) for r in rows
             if r["task"] == "flipflop_dense" and r["steps"] == "1500"}
    sd = _paired_spread(dense, "fox", "rope")  # seeds 42-45
    assert f"spread of the paired differences {sd:.2f}" in text
    at_05, at_01 = seeds_needed(0.2, sd, paired=True), seeds_needed(0.2, sd, paired=True, alpha=0.01)
    assert f"asks for {at_05} pairs at α = 0.05 and {at_01} at 0.01" in text


WIDTH_PILOT = PILOT.parent / "state_tasks_width.csv"


def test_the_docs_quote_the_width_pilot_from_its_file():
    """docs/tasks.md's third-pilot table is experiments/pilots/state_tasks_width.csv row by row; each run was scored on
    the same 1024 prompts as the width-64 run of its seed (the same count with trailing ignores); the seeds the docs
    say track the last write are those whose hard-subset score beats a coin flip at α = 0.05."""
    import csv

    from analysis.stats import seeds_needed

    rows = list(csv.DictReader(WIDTH_PILOT.open()))
    text = (PILOT.parents[2] / "docs" / "tasks.md").read_text()
    narrow = {r["seed"]: r["n1024_trailing"] for r in csv.DictReader(PILOT.open())
              if r["steps"] == "1500" and r["task"] == "flipflop_dense" and r["kind"] == "rope"}
    assert all(r["n_trailing"] == narrow[r["seed"]] for r in rows)  # the width-64 runs' 1024 prompts, seed by seed
    tracking: dict[str, list[str]] = {}
    for r in rows:
        line = (f"| `{r['task']}` | {r['ops']} | {r['dim']} | {r['steps']} | {PILOT_LABELS[r['kind']]} | {r['seed']} | "
                f"{r['correct']}/{r['n']} | {r['correct_trailing']}/{r['n_trailing']} |")
        assert line in text, line
        tracks = _beats_a_coin_flip(int(r["correct_trailing"]), int(r["n_trailing"]))
        tracking.setdefault(PILOT_LABELS[r["kind"]], []).extend([r["seed"]] if tracks else [])
    said = "; ".join(f"{label} seeds {', '.join(seeds) or 'none'}" for label, seeds in tracking.items())
    assert f"above a coin flip on trailing ignores (one-sided binomial, α = 0.05): {said}." in text
    hard = {(r["kind"], r["seed"]): int(r["correct_trailing"]) / int(r["n_trailing"]) for r in rows}
    sd = _paired_spread(hard, "fox", "rope")  # FoX beside RoPE on shared seeds: what sizes the study on this design
    n = seeds_needed(0.2, sd, paired=True, alpha=0.01)
    assert f"over the 4 shared seeds has a spread of the paired differences {sd:.3f}" in text
    assert f"`seeds_needed` asks for {n} pairs at α = 0.01" in text
    assert f"the hard-subset score sizes the comparison at {n} pairs at α = 0.01" in " ".join(text.split())
    frontier = (PILOT.parents[2] / "docs" / "frontier-kinds.md").read_text()
    assert f"at {n} paired seeds per question" in " ".join(frontier.split())
    # the frontier study's first stage is sized on it: n fresh seeds after the pilot's
    spec = (PILOT.parent.parent / "tables" / "frontier_fox_compact.yaml").read_text()
    assert f"seed: [{', '.join(str(s) for s in range(46, 46 + n))}]" in spec and f"# - Seeds: {n}," in spec
    assert f"paired spread on this metric ({sd:.3f})" in " ".join(w for w in spec.split() if w != "#")
    full = " ".join(w for w in (PILOT.parent.parent / "tables" / "frontier_compact.yaml").read_text().split()
                    if w != "#")
    assert f"(the third pilot's 4 seeds gave {sd:.3f} and {n})" in full


def test_the_frontier_studys_first_stage_trains_the_full_studys_cells():
    """Every trial of frontier_fox_compact is the trial of the same seed and kind in frontier_compact (the same
    config hash), so its shipped results are that study's cells; and it declares the one pair the pilot sized."""
    from sweeps.plan import make_plan
    from sweeps.spec import load_spec

    tables = PILOT.parent.parent / "tables"
    stage = make_plan(load_spec(tables / "frontier_fox_compact.yaml"))
    full = load_spec(tables / "frontier_compact.yaml")
    for key, values in stage.spec.axes.items():  # the stage's axis values are the full study's
        assert all(v in full.axes[key] for v in values), key
    full.axes = dict(stage.spec.axes)  # the full study's cells at those values only (its 220 take 5-10 s to plan)
    full.questions = stage.spec.questions  # the others name kinds these cells lack
    assert len(stage.cells) == 32
    assert [c.config_hash for c in stage.cells] == [c.config_hash for c in make_plan(full).cells]
    assert [(q.variant, q.reference, q.metric) for q in stage.spec.questions] == [
        ("FoX", "RoPE", "hardacc_flipflop_dense_x1")]


STAGE = PILOT.parent.parent / "results" / "frontier_fox_compact" / "cells.csv"


def test_the_docs_quote_the_frontier_stage_and_size_the_full_study_from_its_file():
    """docs/tasks.md's reading of the shipped first stage (runs above a coin flip on trailing ignores, seeds where
    FoX leads, its best run, the difference 16 seeds could see) is experiments/results/frontier_fox_compact/cells.csv;
    and frontier_compact's seeds are `seeds_needed` at α = 0.01 on that file's paired spread."""
    import csv

    from analysis.stats import detectable_difference, seeds_needed

    hard: dict[tuple[str, int], tuple[int, int]] = {}
    tracking = {"RoPE": 0, "FoX": 0}
    for r in csv.DictReader(STAGE.open()):
        n = int(float(r["hardn_flipflop_dense_x1"]))
        k = round(float(r["hardacc_flipflop_dense_x1"]) * n)
        hard[r["pe_label"], int(r["seed"])] = (k, n)
        tracking[r["pe_label"]] += _beats_a_coin_flip(k, n)
    seeds = sorted({seed for _, seed in hard})
    assert seeds == list(range(46, 62)) and len(hard) == 32
    rate = {key: k / n for key, (k, n) in hard.items()}
    diffs = [rate["FoX", s] - rate["RoPE", s] for s in seeds]
    sd = _paired_spread(rate, "FoX", "RoPE")
    pilot = {(r["kind"], r["seed"]): int(r["correct_trailing"]) / int(r["n_trailing"])
             for r in csv.DictReader(WIDTH_PILOT.open())}
    assert sd > _paired_spread(pilot, "fox", "rope")  # "larger than the third pilot's four seeds gave"
    best = max(hard, key=lambda key: hard[key][0] / hard[key][1])
    text = " ".join((PILOT.parents[2] / "docs" / "tasks.md").read_text().split())
    assert (f"RoPE tracks the last write in {tracking['RoPE']} of 16 seeds and FoX in {tracking['FoX']}. FoX's "
            f"hard-subset score is above RoPE's in {sum(d > 0 for d in diffs)} of 16 seeds") in text
    assert best[0] == "FoX" and f"seed {best[1]}, scores {hard[best][0]}/{hard[best][1]} on the hard" in text
    assert f"a difference under about {detectable_difference(sd, 16, paired=True):.2f} would likely go unseen" in text
    n01, n05 = seeds_needed(0.2, sd, paired=True, alpha=0.01), seeds_needed(0.2, sd, paired=True)
    assert f"is {sd:.3f}, larger than the third pilot's" in text
    assert f"asks for {n01} pairs at α = 0.01 ({n05} at 0.05)" in text and f"The spec now holds {n01} seeds" in text
    assert f"the whole study, {10 * n01} trials" in text and f"the {10 * n01 - 32} trials not yet run" in text
    spec = (PILOT.parent.parent / "tables" / "frontier_compact.yaml").read_text()
    assert f"seed: [{', '.join(str(s) for s in range(46, 46 + n01))}]" in spec and f"# - Seeds: {n01}," in spec
    frontier = " ".join((PILOT.parents[2] / "docs" / "frontier-kinds.md").read_text().split())
    assert f"the whole study needs {n01} seeds" in frontier
    comments = " ".join(w for w in spec.split() if w != "#")  # the comment's lines as one
    assert f"16 seeds, {sd:.3f} for FoX vs RoPE" in comments and f"so the {10 * n01 - 32} trials left" in comments
