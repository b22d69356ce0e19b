"""What a tracking outage leaves behind is logged later, on a real local MLflow store: a history gap before the last
logged step, a batch the store refused, a run whose creator was cut off before its params. The outage itself (a real
PostgreSQL-backed server killed mid-sweep) is tests/test_team_server_e2e.py."""

import pytest


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    """One store for the module (creating one takes seconds); each test has cells of its own."""
    from trainer.run.tracking import SweepTracker

    root = tmp_path_factory.mktemp("outage")
    return SweepTracker(f"sqlite:///{root / 'mlflow.db'}", "outage", root / "artifacts")


def steps(tracker, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracker.client.get_metric_history(run_id, key))


def test_the_history_gets_the_steps_the_live_logging_missed_before_its_last(tracker):
    run_id = tracker.cell_run("gap", "h", {"a": 1}, {})
    tracker.log_metrics(run_id, 5, {"train_loss": 3.0})
    tracker.log_metrics(run_id, 15, {"train_loss": 1.0})  # step 10 was reported while the server was down
    tracker.log_history(run_id, [{"step": 5, "train_loss": 3.0}, {"step": 10, "train_loss": 2.0, "lr": 0.5},
                                 {"step": 15, "train_loss": 1.0}])
    assert steps(tracker, run_id, "train_loss") == [(5, 3.0), (10, 2.0), (15, 1.0)]  # each step once
    assert steps(tracker, run_id, "lr") == [(10, 0.5)]


def test_a_batch_the_store_refused_is_logged_on_the_next_try(tracker):
    from mlflow.exceptions import MlflowException

    run_id = tracker.cell_run("refused", "h", {"a": 1}, {})
    tracker.log_metrics(run_id, 5, {"val_loss": 3.0})
    tracker.client.delete_run(run_id)  # a deleted run refuses metrics, as a server that is down would
    with pytest.raises(MlflowException):
        tracker.log_metrics(run_id, 10, {"val_loss": 2.0})
    tracker.client.restore_run(run_id)
    tracker.log_metrics(run_id, 10, {"val_loss": 2.0})
    assert steps(tracker, run_id, "val_loss") == [(5, 3.0), (10, 2.0)]


def test_a_cell_run_created_without_its_params_gets_them_when_found(tracker):
    from trainer.run.tracking import SweepTracker

    # a driver created the run, then lost the server before logging the params; a restarted driver finds it
    tags = {"sweep": "outage", "role": "cell", "cell_id": "cut-off"}
    run_id = tracker.client.create_run(tracker.experiment_id, tags=tags).info.run_id
    restarted = SweepTracker(tracker.uri, "outage")
    assert restarted.cell_run("cut-off", "h", {"model.d": 64, "train.seed": 42}, {}) == run_id
    assert tracker.client.get_run(run_id).data.params == {"model.d": "64", "train.seed": "42"}


def test_a_cell_run_whose_params_were_cut_off_is_reused_by_the_same_driver(tracker, monkeypatch):
    from mlflow.exceptions import MlflowException

    from trainer.run import tracking

    real = tracking.log_params

    def cut_off(*args, **kwargs):  # the server went away between creating the run and logging its params
        monkeypatch.setattr(tracking, "log_params", real)
        raise MlflowException("the server did not answer")

    monkeypatch.setattr(tracking, "log_params", cut_off)
    with pytest.raises(MlflowException):
        tracker.cell_run("cut-off-here", "h", {"model.d": 64}, {})
    run_id = tracker.cell_run("cut-off-here", "h", {"model.d": 64}, {})
    runs = tracker.client.search_runs([tracker.experiment_id], "tags.cell_id = 'cut-off-here'")
    assert [r.info.run_id for r in runs] == [run_id]  # one run, not a second one
    assert tracker.client.get_run(run_id).data.params == {"model.d": "64"}


def test_an_outage_is_a_server_that_does_not_answer_not_a_refused_request():
    import requests
    from mlflow.exceptions import MlflowException

    from trainer.run.tracking import is_outage, outage_reason

    def raised(inner: Exception) -> MlflowException:  # as MLflow's HTTP client wraps what requests raised
        try:
            try:
                raise inner
            except Exception as e:
                raise MlflowException(f"API request failed with exception {e}")  # noqa: B904
        except MlflowException as err:
            return err

    refused = raised(requests.exceptions.ConnectionError("Max retries exceeded ([Errno 111] Connection refused)"))
    assert is_outage(refused) and outage_reason(refused) == "[Errno 111] Connection refused"
    assert is_outage(raised(requests.exceptions.ReadTimeout("read timed out")))
    assert not is_outage(MlflowException("RESOURCE_DOES_NOT_EXIST: run x not found"))
    assert not is_outage(raised(ValueError("a bug")))
