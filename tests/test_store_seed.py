"""A new local MLflow store is a copy of the cached migrated template; an existing store is never touched."""

import sqlite3

import mlflow

from trainer.run.store_seed import seed_store, store_template
from trainer.run.tracking import SweepTracker


def test_a_new_sqlite_store_is_seeded_from_an_empty_migrated_template(tmp_path, monkeypatch):
    monkeypatch.setenv("HDROPE_CACHE", str(tmp_path / "cache"))
    template = store_template()
    assert template is not None and template.parent == tmp_path / "cache" / "mlflow-store"
    with sqlite3.connect(template) as con:  # migrated (MLflow's schema version stamped), and empty
        assert con.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        assert con.execute("SELECT count(*) FROM experiments").fetchone()[0] == 0

    uri = f"sqlite:///{tmp_path / 'sweep' / 'mlflow.db'}"
    assert seed_store(uri) and not seed_store(uri)  # copied once; a store that exists is left alone
    tracker = SweepTracker(uri, "seeded", tmp_path / "sweep" / "artifacts")
    run_id = tracker.cell_run("c0", "abc", {"model.dim": 32}, {}, "c0")
    tracker.log_metrics(run_id, 5, {"val_loss": 2.5})
    client = mlflow.MlflowClient(uri)
    default = client.get_experiment("0")  # MLflow's default experiment, made on first open as for a store it makes
    assert "mlflow-store" not in default.artifact_location and ".build-" not in default.artifact_location
    assert client.get_run(run_id).data.metrics == {"val_loss": 2.5}
    assert client.get_run(run_id).info.status == "RUNNING"


def test_other_stores_and_existing_files_are_not_seeded(tmp_path, monkeypatch):
    monkeypatch.setenv("HDROPE_CACHE", str(tmp_path / "cache"))
    existing = tmp_path / "mine.db"
    existing.write_bytes(b"not a store")
    assert not seed_store(f"sqlite:///{existing}") and existing.read_bytes() == b"not a store"
    assert not seed_store("http://127.0.0.1:5000") and not seed_store("sqlite:///:memory:")
    assert not (tmp_path / "cache" / "mlflow-store").exists()  # nothing made for a store that needs no seed
