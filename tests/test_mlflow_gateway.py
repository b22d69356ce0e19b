"""The one MLflow gateway (trainer/run/tracking.py): experiments made once, and every writer of a model's runs
attaching to the same identity (issue 18): `hdrope train --tracking-uri`, then `hdrope passkey eval` on its
checkpoint, end on one MLflow run that carries the model's config hash, encoding identity and seed."""

from __future__ import annotations

import json

import pytest


def test_an_experiment_is_made_once_with_artifacts_beside_a_local_store(tmp_path):
    import mlflow

    from trainer.run.tracking import EXPERIMENT_KIND_TAG, experiment

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    first, again = experiment(client, "exp"), experiment(client, "exp")
    assert first == again and [e.name for e in client.search_experiments()].count("exp") == 1
    made = client.get_experiment(first)
    assert made.artifact_location == (tmp_path / "store" / "mlartifacts").resolve().as_uri()
    assert made.tags[EXPERIMENT_KIND_TAG]


def test_train_and_passkey_eval_land_on_one_run_with_the_models_identity(tmp_path, cache_dir, hdrope_here):
    import mlflow

    from trainer.config import config_hash
    from trainer.data.tokenizer import ByteTokenizer
    from trainer.evals.passkey.builder import BuildConfig, build_dataset
    from trainer.model.position import encoding_identity
    from trainer.presets import load_config

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = ["train.steps=4", "eval.passkey.enabled=false", "eval.extrapolation_batches=0",
                 f"data.cache_dir={cache_dir}", f"train.out_dir={tmp_path / 'run'}"]
    out = hdrope_here(["train", "tiny", *overrides, "--tracking-uri", uri, "--no-progress"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    ckpt = max((tmp_path / "run" / "checkpoints").glob("step_*"))
    build_dataset(ByteTokenizer(), BuildConfig(multi_token=True, v_min=10000, v_max=99999, max_len=512,
                                               lines_per_file=1), tmp_path / "ds", cache_dir=cache_dir)
    out = hdrope_here(["passkey", "eval", str(ckpt), str(tmp_path / "ds"), "--no-progress", "--tracking-uri", uri],
                      cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [r.info.run_name for r in runs]  # no second run in another experiment
    (run,) = runs
    cfg = load_config("tiny", overrides)
    identity = {k: str(v) for k, v in encoding_identity(cfg.model.pe).items()}
    assert run.data.tags["config_hash"] == config_hash(cfg)
    assert {k: run.data.tags[k] for k in identity} == identity and run.data.tags["seed"] == "42"
    assert {"train_loss", "val_loss", "passkey_acc", "passkey_acc_U512"} <= set(run.data.metrics)
    assert client.get_experiment(run.info.experiment_id).name == "hdrope-train"


@pytest.mark.parametrize("experiment_name", ["hdrope-lm-eval"])
def test_an_evaluation_of_a_model_with_no_run_opens_one_with_its_identity(tmp_path, experiment_name):
    import mlflow

    from trainer.config import config_hash
    from trainer.presets import load_config
    from trainer.run.tracking import log_eval_metrics

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config("tiny", ["model.pe.rotation_dim=8"])
    (run_id,) = log_eval_metrics(uri, cfg, {"lm_toy_acc": 0.5}, 7, experiment_name)
    again = log_eval_metrics(uri, cfg, {"lm_toy_acc": 0.75}, 8, experiment_name)
    assert again == [run_id]  # the second evaluation finds the model's run by its identity
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.data.tags["config_hash"] == config_hash(cfg) and run.data.tags["rotation_dim"] == "8"
    history = mlflow.MlflowClient(uri).get_metric_history(run_id, "lm_toy_acc")
    assert [(m.step, m.value) for m in history] == [(7, 0.5), (8, 0.75)]
    assert json.dumps(run.data.tags)  # plain strings
