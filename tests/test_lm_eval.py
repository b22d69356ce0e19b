"""`hdrope eval lm-eval` on a tiny trained model with a task defined locally (lm-eval local YAML + JSONL):
real lm-evaluation-harness, no hub. The paper's tasks (hellaswag, arc_easy, ...) run the same way online."""

import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval")

TASK = """
task: lab_toy
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
DOCS = [("ROMEO. O, she doth teach the torches to burn", [" bright!", " qzxv!"], 0),
        ("JULIET. Wherefore art thou", [" xqzj", " Romeo?"], 1),
        ("To be, or not to", [" be", " zq"], 0),
        ("Now is the winter of our", [" qqq", " discontent"], 1),
        ("HAMLET. My lord", [",", "zzz"], 0),
        ("KING. Good night, sweet", [" prince", " xkcd"], 0)]


@pytest.fixture(scope="module")
def trained_tiny(tmp_path_factory, cache_dir):
    from trainer.presets import load_config
    from trainer.run.loop import train

    out = tmp_path_factory.mktemp("lm") / "run"
    cfg = load_config("tiny", [f"data.cache_dir={cache_dir}", f"train.out_dir={out}", "train.steps=60",
                               "eval.passkey.enabled=false"])
    train(cfg)
    return out, sorted((out / "checkpoints").glob("step_*"))[-1]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """The local task, one folder for the module: lm-eval's task index is built once per include path and process."""
    tmp_path = tmp_path_factory.mktemp("lm-task")
    data = tmp_path / "lab_toy.jsonl"
    data.write_text("".join(json.dumps({"context": c, "choices": ch, "label": lab}) + "\n" for c, ch, lab in DOCS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "lab_toy.yaml").write_text(TASK.format(data=data))
    return tmp_path / "tasks"


def test_lab_lm_loglikelihood_is_the_models_own(trained_tiny):
    from trainer.evals.lm_harness import LabLM
    from trainer.run.trained import load_trained

    _, ckpt = trained_tiny
    trained = load_trained(ckpt)
    lm = LabLM(trained)
    (ll, greedy), = lm.loglikelihood([("To be, or not to", " be")])
    ids = trained.tok.encode("To be, or not to" + " be")
    n = len(trained.tok.encode(" be"))
    with torch.no_grad():
        logp = F.log_softmax(trained.model(torch.tensor([ids[:-1]]))[0].float(), -1)
    expected = sum(float(logp[len(ids) - 1 - n + i, ids[len(ids) - n + i]]) for i in range(n))
    assert ll == pytest.approx(expected, abs=1e-5) and ll < 0 and isinstance(greedy, bool)
    rolled, = lm.loglikelihood_rolling([("To be, or not",)])  # shorter than a window: scored after <bos>
    assert rolled == pytest.approx(lm.loglikelihood([("", "To be, or not")])[0][0], abs=1e-5)
    long_text = "To be, or not to be, that is the question. " * 6  # several windows: each token scored once
    assert lm.loglikelihood_rolling([(long_text,)])[0] < rolled
    text, = lm.generate_until([("ROMEO.", {"until": ["\n"], "max_gen_toks": 5})])
    assert isinstance(text, str) and "\n" not in text and len(text) <= 5


def test_hdrope_eval_lm_eval_runs_a_local_task_and_reaches_mlflow_and_results(trained_tiny, task_dir, tmp_path,
                                                                              hdrope_here):
    import mlflow

    run_dir, ckpt = trained_tiny
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = hdrope_here(["eval", "lm-eval", str(ckpt), "--tasks", "lab_toy", "--include-path", str(task_dir),
                       "--tracking-uri", uri], cwd=tmp_path)  # offline: tests/conftest.py sets HF_*_OFFLINE
    assert out.returncode == 0, out.stderr[-3000:]
    stored = json.loads((run_dir / "lm_eval.json").read_text())
    acc = stored["metrics"]["lm_lab_toy_acc"]
    assert 0.0 <= acc <= 1.0 and acc * len(DOCS) == pytest.approx(round(acc * len(DOCS)))
    assert stored["metrics"]["lm_lab_toy_n"] == len(DOCS)  # accuracies are k of n documents
    runs = mlflow.MlflowClient(uri).search_runs([mlflow.MlflowClient(uri).get_experiment_by_name(
        "hdrope-lm-eval").experiment_id])
    assert runs[0].data.metrics["lm_lab_toy_acc"] == acc


@pytest.mark.parametrize("extra,expected", [
    (["--tasks", "no_such_task_xyz"], "--tasks: unknown lm_eval task(s) ['no_such_task_xyz']"),
    (["--tasks", "lab_toy", "--include-path", "nope"], "--include-path nope: not a directory of task YAMLs"),
    (["--tasks", "lab_toy", "--max-length", "-5"], "--max-length -5: must be an integer >= 2 (or 0 for the run's "
                                                   "train length)"),  # used to report an accuracy
    (["--tasks", "lab_toy", "--limit", "-1"], "--limit -1: must be an integer >= 1 (or 0 for every document)"),
])
def test_bad_flags_exit_2_naming_the_flag(trained_tiny, task_dir, tmp_path, extra, expected, hdrope_here):
    _, ckpt = trained_tiny
    if "--include-path" not in extra:
        extra = [*extra, "--include-path", str(task_dir)]
    out = hdrope_here(["eval", "lm-eval", str(ckpt), *extra], cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert expected in out.stderr


def test_results_table_carries_lm_eval_columns(tiny_sweep):
    import pyarrow.parquet as pq

    from sweeps.plan_file import load_plan
    from sweeps.results import write_results

    plan = load_plan(tiny_sweep)
    cell = plan.to_run[0].cell_id
    (tiny_sweep / "cells" / cell / "lm_eval.json").write_text(json.dumps({"metrics": {"lm_lab_toy_acc": 0.5}}))
    try:
        rows = {r["cell_id"]: r for r in pq.read_table(write_results(plan, tiny_sweep / "r.parquet")).to_pylist()}
    finally:
        (tiny_sweep / "cells" / cell / "lm_eval.json").unlink()
    assert rows[cell]["lm_lab_toy_acc"] == 0.5
    assert all(r["lm_lab_toy_acc"] is None for c, r in rows.items() if c != cell and r["trained_cell"] != cell)
