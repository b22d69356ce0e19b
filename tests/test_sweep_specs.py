"""Sweep specs: planning, dedup and 20+ malformed specs rejected before Ray starts (exit code 2, field named)."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sweeps.console import main
from sweeps.plan import canonical
from sweeps.runner import prepare

GOOD = """
name: ok
base: tiny
storage: {storage}
overrides: {{train.steps: 5}}
axes:
  model.pe.rotation_dim: [2, 4]
  model.pe.basis: [identity, random, paley]
  seed: [1, 2]
"""


def write(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).format(storage=tmp_path / "store"))
    return path


def test_plan_resolves_every_cell_and_dedups_2d(tmp_path):
    plan = prepare(str(write(tmp_path, GOOD)))
    assert len(plan.cells) == 12 and len(plan.to_run) == 8  # 2D x 3 bases -> one model per seed
    two_d = [c for c in plan.cells if c.values["model.pe.rotation_dim"] == 2]
    assert {c.dedup_of for c in two_d if c.dedup_of} == {c.cell_id for c in two_d if c.dedup_of is None}
    c = plan.cells[-1]
    assert c.config.train.seed == 2 and c.config.model.pe.basis == "paley" and c.config.train.steps == 5
    assert c.config.train.out_dir.endswith(f"store/ok/cells/{c.cell_id}")
    assert plan.summary()["trials_saved"] == 4


def test_canonical_keeps_real_differences(tmp_path):
    plan = prepare(str(write(tmp_path, GOOD)))
    four = [c for c in plan.cells if c.values["model.pe.rotation_dim"] == 4]
    assert len({c.group for c in four}) == 6  # 3 bases x 2 seeds all differ
    rope = canonical(plan.cells[0].config)
    assert rope.model.pe.basis == "identity" and rope.model.pe.rotation_dim == 2


def test_plan_cli_prints_counts(tmp_path, capsys):
    assert main(["sweep", "plan", str(write(tmp_path, GOOD))]) == 0
    out = capsys.readouterr().out
    assert "12 cells, 8 trials run, 4 saved by dedup" in out


BAD = [
    ("name: ../escape\nbase: tiny", "name='../escape' is not a plain name"),
    ("name: a/b\nbase: tiny", "name='a/b' is not a plain name"),
    ("name: x\nbase: nosuchpreset", "unknown preset 'nosuchpreset'"),
    ("name: x\nbase: ../../etc/passwd", "not a plain name"),
    ("name: x\nbase: tiny\naxes: {model.pe.rotation_dim: [3]}", "rotation_dim=3: must be an even integer >= 2"),
    ("name: x\nbase: tiny\naxes: {model.pe.rotation_dim: [16]}", "14 or 18"),
    ("name: x\nbase: tiny\naxes: {model.pe.theta: [1.0]}", "theta must be > 1"),
    ("name: x\nbase: tiny\naxes: {model.pe.basis: [qr]}", "unknown basis"),
    ("name: x\nbase: tiny\naxes: {model.pe.widht: [1]}", "widht"),
    ("name: x\nbase: tiny\naxes: {model.dim: [abc]}", "model.dim"),
    ("name: x\nbase: tiny\naxes: {model.pe.rotation_dim: []}", "axes.model.pe.rotation_dim: must be a non-empty list"),
    ("name: x\nbase: tiny\naxes: {seed: [1, 1]}", "axes.seed: has repeated values"),
    ("name: x\nbase: tiny\naxes: {model.n_kv_heads: [3]}", "not divisible by model.n_kv_heads=3"),
    ("name: x\nbase: tiny\noverrides: {optim.name: lion}", "optim.name='lion'"),
    ("name: x\nbase: tiny\noverrides: {train.steps: 0}", "train.steps=0"),
    ("name: x\nbase: tiny\nsearch: {kind: bayes}", "search.kind='bayes'"),
    ("name: x\nbase: tiny\nsearch: {kind: optuna}", "search.space is empty"),
    ("name: x\nbase: tiny\naxes: {seed: [1]}\nsearch: {kind: optuna, space: {optim.lr: {low: 1e-4, high: 1e-2}}}",
     "grid axes cannot be mixed with an Optuna search"),
    ("name: x\nbase: tiny\nsearch: {kind: optuna, space: {optim.lr: {low: 0, high: 1, log: true}}}",
     "search.space.optim.lr: need low < high"),
    ("name: x\nbase: tiny\nscheduler: hyperband", "scheduler='hyperband'"),
    ("name: x\nbase: tiny\nsearch: {kind: optuna, space: {optim.lrr: {low: 0.1, high: 1}}}", "search.space.optim.lrr"),
    ("name: x\nbase: tiny\nresources: {cpus: 0}", "resources: cpus must be > 0"),
    ("name: x\nbase: tiny\nmax_failures: -1", "max_failures=-1"),
    ("name: x\nbase: tiny\nunknown_key: 1", "unknown_key"),
    ("name: x\nbase: tiny\nresources: {cpus: lots}", "resources.cpus"),
    ("name: x\nbase: tiny\nsearch: {kind: grid, metric: accuracy}", "search.metric='accuracy'"),
    ("name: x\nbase: tiny\noverrides: {dump.layers: [9]}", "dump.layers"),
    ("name: x\nbase: tiny\naxes: [1, 2]", "axes"),
    ("name: [x\nbase: tiny", "not valid YAML"),
    # issue: trust -- bad numbers, names, grids and interpolations
    ("name: x\nbase: tiny\noverrides: {optim.lr: .nan}", "optim.lr=nan: NaN and infinity are not allowed"),
    ("name: x\nbase: tiny\noverrides: {optim.eps: .inf}", "optim.eps=inf"),
    ("name: x\nbase: tiny\noverrides: {optim.weight_decay: -.inf}", "optim.weight_decay=-inf"),
    ("name: x\nbase: tiny\noverrides: {optim.grad_clip: .nan}", "optim.grad_clip=nan"),
    ("name: x\nbase: tiny\noverrides: {train.max_time_s: .inf}", "train.max_time_s=inf"),
    ("name: x\nbase: tiny\noverrides: {eval.passkey.length_factors: [1.0, .nan]}", "eval.passkey.length_factors"),
    ("name: x\nbase: tiny\nresources: {gpus: .nan}", "resources.gpus=nan: must be a finite number"),
    ("name: x\nbase: tiny\nresources: {cpus: .inf}", "resources.cpus=inf"),
    ("name: x\nbase: tiny\nsearch: {kind: optuna, space: {optim.lr: {low: 1e-4, high: .inf}}}",
     "search.space.optim.lr.high=inf"),
    ("name: x\nbase: tiny\naxes: {model.pe.rotation_dim: [0]}", "model.pe.rotation_dim=0: must be an even integer"),
    ("name: x\nbase: tiny\naxes: {optim.lr: " + str([1e-3 + i * 1e-6 for i in range(200)]) + ", seed: "
     + str(list(range(100))) + "}", "the grid has 20,000 cells"),
    ('name: "x\\n"\nbase: tiny', "is not a plain name"),
    ('name: x\nbase: tiny\ndescription: "${oc.env:HOME}"',
     "description='${oc.env:HOME}' is an OmegaConf interpolation"),
    ("name: x\nbase: tiny\noverrides: {data.paths: ['${oc.env:HOME}']}", "data.paths[0]"),
    ("name: x\nbase: tiny\nsearch: {metric: val_loss_x16}", "search.metric='val_loss_x16' is not reported"),
    # issue 12: data-parallel workers (Ray Train inside Tune)
    ("name: x\nbase: tiny\nresources: {workers: 0}", "resources.workers=0: must be >= 1"),
    ("name: x\nbase: tiny\nresources: {workers: two}", "resources.workers"),
    ("name: x\nbase: tiny\nresources: {workers: 2, strategy: zero3}", "resources.strategy='zero3': choose one of ddp"),
    ("name: x\nbase: tiny\nresources: {workers: 2, gpus: 1}", "resources.gpus=1 with workers=2"),
    ("name: x\nbase: tiny\nresources: {gpus_per_worker: 1}", "resources.gpus_per_worker=1 with workers=1"),
    ("name: x\nbase: tiny\nresources: {workers: 2, gpus_per_worker: -1}",
     "resources.gpus_per_worker=-1.0: must be >= 0"),
    ("name: x\nbase: tiny\nresources: {workers: 2, gpus_per_worker: .nan}", "resources.gpus_per_worker=nan"),
    ("name: x\nbase: tiny\nresources: {workers: 3}",
     "train.batch_size=8 does not split evenly over resources.workers=3"),
    # issue 19: amounts Ray cannot schedule fail at plan time, not inside Ray
    ("name: x\nbase: tiny\nresources: {cpus: 1e-300}",
     "resources.cpus=1e-300: Ray schedules resources in units of 0.0001, so this is no amount at all; use at least"),
    ("name: x\nbase: tiny\nresources: {cpus: 0.00005}", "resources.cpus=5e-05: Ray schedules resources in units"),
    ("name: x\nbase: tiny\nresources: {workers: 2, cpus: 1, gpus_per_worker: 1.0e-9}",
     "resources.gpus_per_worker=1e-09: Ray schedules resources in units of 0.0001, so this is no amount at all; "
     "use 0 or at least 0.0001"),
    ("name: x\nbase: tiny\nresources: {cpus: 1.0e+20}", "resources.cpus=1e+20: more than Ray can count"),
]


@pytest.mark.parametrize("text,match", BAD, ids=[f"bad{i:02d}" for i in range(len(BAD))])
def test_malformed_spec_exit_2_naming_the_field(tmp_path, capsys, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text + f"\nstorage: {tmp_path / 'store'}\n" if "[x" not in text else text)
    assert main(["sweep", "plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert match in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "store").exists()  # nothing written
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


def test_all_problems_of_a_spec_come_out_together(tmp_path, capsys):
    text = "name: x\nbase: tiny\nscheduler: nope\nmax_failures: -2\naxes: {model.pe.rotation_dim: [3, 5]}\n"
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "scheduler='nope'" in err and "max_failures=-2" in err
    path.write_text("name: x\nbase: tiny\naxes: {model.pe.rotation_dim: [3, 5]}\n")
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cell c000-rotation_dim3" in err and "cell c001-rotation_dim5" in err


def test_asha_is_opt_in_and_warns_about_holes(tmp_path):
    with pytest.warns(UserWarning, match="holes"):
        plan = prepare(str(write(tmp_path, GOOD + "scheduler: asha\n")))
    assert plan.warnings and plan.spec.scheduler == "asha"
    assert prepare(str(write(tmp_path, GOOD, "fifo.yaml"))).spec.scheduler == "fifo"


def test_checkpoint_every_and_storage_flow_into_each_cell(tmp_path):
    plan = prepare(str(write(tmp_path, GOOD + "checkpoint_every: 7\n")))
    assert {c.config.train.ckpt_every for c in plan.cells} == {7}
    assert all(str(tmp_path / "store" / "ok" / "cells") in c.config.train.out_dir for c in plan.cells)


REPO = Path(__file__).resolve().parent.parent
SHIPPED = [str(p.relative_to(REPO)) for p in sorted(REPO.glob("experiments/tables/*.yaml"))]
SHIPPED += ["sweeps/quickstart.yaml", "sweeps/ablation.yaml", "sweeps/paper_grid.yaml"]


def _field(config, dotted: str):
    """The value at a dotted key of a cell's typed config (attribute by attribute: no OmegaConf copy per cell)."""
    for name in dotted.split("."):
        config = config[name] if isinstance(config, dict) else getattr(config, name)
    return config


def _as_set(config, value):
    """The part of a typed config that an axis value (a mapping sets each of its keys, nested) sets."""
    return {key: _as_set(_field(config, key), v) for key, v in value.items()} if isinstance(value, dict) else config


# what each kind of plan warning says (sweeps.plan, sweeps.design_warnings, analysis.questions); a shipped spec's
# header names each kind its plan gives as `# plan warning (<kind>): why` (docs/sweeps.md, "Design warnings")
WARNING_KINDS = {"frequencies": "distinct frequenc", "windows": "too few validation windows",
                 "lengths": "at or beyond every evaluated length", "gpu": "this machine has no GPU",
                 "questions": "questions: the declared family", "asha": "scheduler=asha"}


def _warning_kind(text: str) -> str:
    kinds = [k for k, said in WARNING_KINDS.items() if said in text]
    assert len(kinds) == 1, f"a plan warning of no known kind (add it to WARNING_KINDS): {text}"
    return kinds[0]


@pytest.mark.parametrize("path", SHIPPED)
def test_shipped_specs_validate(path):
    """Every shipped spec plans, each cell carries its axis values, and each kind of warning its plan gives is
    explained in its header (`# plan warning (<kind>): ...`), with no header line for a warning it does not give."""
    from sweeps.plan import ALIASES

    plan = prepare(str(REPO / path))
    assert plan.cells and plan.to_run
    for c in plan.cells:  # every cell carries exactly its axis values (a mapping value: each of its keys)
        for k, v in c.values.items():
            assert _as_set(_field(c.config, ALIASES.get(k, k)), v) == v, (c.cell_id, k)
    given = {_warning_kind(w) for w in plan.warnings} - {"gpu"}
    if plan.spec.resources.gpus or plan.spec.resources.gpus_per_worker:  # warned of only where no GPU is
        given.add("gpu")
    text = (REPO / path).read_text()
    header = text[:text.index("\nname:")]
    said = set(re.findall(r"^# plan warning \((\w+)\): \S", header, re.M))
    assert said == given, (f"{path}: its plan warns of {sorted(given)}, its header explains {sorted(said)}",
                           plan.warnings)


def test_plan_warns_when_the_declared_family_can_mark_nothing():
    """36 comparisons (6 questions at 6 θ) need 11 paired seeds before Holm can mark one; 3 are refused with that
    number, and at 11 the warning is gone."""
    spec = "sweeps/paper_grid.yaml"
    three = prepare(str(REPO / spec), ["axes.seed=[42,43,44]"])
    said = [w for w in three.warnings if w.startswith("questions:")]
    assert len(said) == 1 and "36 comparisons" in said[0] and "3 paired seeds" in said[0], three.warnings
    assert "p ≥ 0.25" in said[0] and "11 or more shared seeds" in said[0]
    assert not [w for w in prepare(str(REPO / spec)).warnings if w.startswith("questions:")]


def test_empty_spec_and_overrides_with_interpolations_exit_2(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["sweep", "plan", str(empty)]) == 2
    assert "the spec is empty" in capsys.readouterr().err
    monkeypatch.setenv("HDROPE_TEST_SECRET", "s3cr3t")
    spec = write(tmp_path, GOOD)
    assert main(["sweep", "plan", str(spec), "--set", "name=${oc.env:HDROPE_TEST_SECRET}"]) == 2
    err = capsys.readouterr().err
    assert "interpolation" in err and "s3cr3t" not in err
    cmd = [sys.executable, "-m", "sweeps.console", "train", "tiny", "name=${oc.env:HDROPE_TEST_SECRET}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HDROPE_TEST_SECRET": "s3cr3t"})
    assert out.returncode == 2 and "interpolation" in out.stderr and "s3cr3t" not in out.stderr + out.stdout
    assert not (tmp_path / "store").exists()


def test_extrapolation_metrics_are_valid_search_metrics_when_configured(tmp_path):
    text = GOOD.replace("{{train.steps: 5}}", "{{train.steps: 5, eval.extrapolation: [2, 16]}}")
    plan = prepare(str(write(tmp_path, text + "search: {{metric: val_loss_x16}}\n")))
    assert plan.cells and plan.spec.search.metric == "val_loss_x16"


def test_workers_keep_every_cell_config_hash_and_plan_their_cpus(tmp_path, capsys):
    """A run is the same function of (seed, step) for any number of workers: same cells, same hashes."""
    one = prepare(write(tmp_path, GOOD, "one.yaml"))
    two = prepare(write(tmp_path, GOOD + "resources: {{workers: 2, cpus: 1, strategy: ddp}}\n", "two.yaml"))
    assert [(c.cell_id, c.config_hash, c.dedup_of) for c in two.cells] == [
        (c.cell_id, c.config_hash, c.dedup_of) for c in one.cells]
    summary = two.summary()
    assert summary["per_trial"] == {"cpus": 2.0, "gpus": 0.0, "workers": 2}
    assert summary["concurrent_here"] == (os.cpu_count() or 1) // 2
    assert main(["sweep", "plan", str(tmp_path / "two.yaml")]) == 0
    assert "2.0 CPU / 0.0 GPU per trial in 2 Ray Train workers" in capsys.readouterr().out


def test_more_workers_than_this_machine_has_cpus_exit_2_before_ray(tmp_path, capsys):
    spec = GOOD.replace("train.steps: 5", "train.steps: 5, train.batch_size: 4096") + "resources: {{workers: 4096}}\n"
    assert main(["sweep", "run", str(write(tmp_path, spec))]) == 2
    err = capsys.readouterr().err
    assert "a trial needs 4096 CPUs" in err and "workers=4096" in err and "lower resources.workers" in err
    assert not (tmp_path / "store").exists()
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


MAPPING_AXIS = """
name: optims
base: tiny
storage: {storage}
overrides: {{train.steps: 5}}
axes:
  optim: [{{name: adamw}}, {{name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0}}]
  seed: [1]
"""


def test_a_mapping_axis_value_has_one_short_label_in_cell_ids_run_names_and_the_report(tmp_path):
    from types import SimpleNamespace

    from analysis.variants import value_text
    from sweeps.callback import trial_name
    from sweeps.plan_file import save_plan
    from sweeps.results import cell_rows
    from trainer.config import config_hash

    plan = prepare(str(write(tmp_path, MAPPING_AXIS)))
    assert [c.cell_id for c in plan.cells] == ["c000-optimAdamW-seed1", "c001-optimSGD_lr_0.1_m_0.9_wd_0-seed1"]
    plan = save_plan(plan)
    names = [trial_name(SimpleNamespace(config={"cell": c.cell_id}), plan) for c in plan.cells]
    assert names == ["4D-Paley-θ10000-s1-optimAdamW", "4D-Paley-θ10000-s1-optimSGD(lr=0.1, m=0.9, wd=0)"]
    stored = [r["optim"] for r in cell_rows(plan)]  # the results table keeps the value itself, as JSON
    assert [value_text(v) for v in stored] == ["AdamW", "SGD(lr=0.1, m=0.9, wd=0)"]
    assert [c.config_hash for c in plan.cells] == [config_hash(c.config) for c in plan.cells]
    sgd = plan.cells[1].config.optim
    assert (sgd.name, sgd.lr, sgd.momentum, sgd.weight_decay) == ("sgd", 0.1, 0.9, 0.0)


def test_a_sweep_planned_with_the_old_cell_ids_keeps_them(tmp_path):
    """A sweep directory whose plan.json has the cell ids of an older version (mapping values as Python reprs) is
    still this spec's sweep: `sweep run` keeps its stored ids (and so its cell directories) instead of refusing."""
    import json

    from sweeps.plan_file import find_plan, save_plan

    plan = save_plan(prepare(str(write(tmp_path, MAPPING_AXIS))))
    old_ids = {"c000-optimAdamW-seed1": "c000-optim_name_adamw_-seed1",
               "c001-optimSGD_lr_0.1_m_0.9_wd_0-seed1":
               "c001-optim_name_sgd_lr_0.1_momentum_0.9_weight_decay_0.0_-seed1"}
    stored = json.loads((plan.root / "plan.json").read_text())
    stored["cells"] = {old_ids[k]: v for k, v in stored["cells"].items()}
    (plan.root / "plan.json").write_text(json.dumps(stored))
    again = save_plan(prepare(str(write(tmp_path, MAPPING_AXIS))))
    assert [c.cell_id for c in again.cells] == list(old_ids.values())
    assert [c.config_hash for c in again.cells] == [c.config_hash for c in plan.cells]
    assert [c.cell_id for c in find_plan(str(plan.root)).cells] == list(old_ids.values())
    assert [c.config.train.out_dir for c in again.cells] == [str(plan.root / "cells" / i) for i in old_ids.values()]


def test_every_file_a_shipped_spec_cites_exists():
    """A spec's comments point readers at code and other specs: each path they name is there."""
    repo = Path(__file__).resolve().parents[1]
    cited = re.compile(r"\b((?:hdrope|trainer|sweeps|analysis|experiments|tests)/[\w/.-]*\w\.(?:py|yaml|md))")
    missing = [(spec.name, path) for spec in [*repo.glob("sweeps/*.yaml"), *repo.glob("experiments/**/*.yaml")]
               for path in cited.findall(spec.read_text()) if not (repo / path).exists()]
    assert not missing


def test_bench_analysis_help_names_functions_that_exist(capsys):
    """`hdrope bench analysis --help` names its loader by the module it lives in."""
    import importlib

    from sweeps import console

    with pytest.raises(SystemExit):
        console.main(["bench", "analysis", "--help"])
    text = capsys.readouterr().out
    assert "analysis.load.iter_maps" in text
    for name in re.findall(r"`(analysis\.[\w.]+)`", text):
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name


@pytest.mark.parametrize("make", ["missing", "file"])
def test_bench_analysis_dir_that_cannot_hold_the_dump_exits_2(make, tmp_path, capsys):
    """`hdrope bench analysis --dir D`: a D that is missing or a file is named with the fix (was FileNotFoundError)."""
    from sweeps import console

    target = tmp_path / "nowhere"
    if make == "file":
        target.write_text("x")
    assert console.main(["bench", "analysis", "--dir", str(target), "--gib", "0.001", "--seconds", "0.1"]) == 2
    err = capsys.readouterr().err
    why = "does not exist" if make == "missing" else "is not a writable directory"
    assert err == (f"hdrope bench analysis: error: --dir {target}: {why}; the benchmark writes its 0.001 GiB dump "
                   "there, so create it first (mkdir -p) or leave --dir out for a temporary directory\n")
