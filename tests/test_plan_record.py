"""`hdrope sweep status` and `hdrope sweep results` read a plan's record (issue 47): each cell's identity as stored
at plan time and its config untyped, so they load neither torch nor the encoding registry, and say exactly what
the typed plan says. Real parts: a finished tiny sweep, real subprocesses of the console."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]

# the console in a fresh interpreter, printing at exit (to stderr) the torch and encoding modules it loaded
_PROBE = ("import atexit, sys\n"
          "atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'torch' "
          "or m.startswith(('trainer.model.position', 'trainer.model.encodings'))), file=sys.stderr))\n"
          "from sweeps.console import main\n"
          "sys.exit(main(sys.argv[1:]))")


def _console(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    """Run `hdrope ARGS` in a fresh interpreter; the process and the modules it had loaded at exit."""
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return out, out.stderr.strip().splitlines()[-1]


def _forget_identities(sweep: Path) -> None:
    """Make sweep's plan.json as plans were stored before cells kept their identity."""
    payload = json.loads((sweep / "plan.json").read_text())
    for cell in payload["cells"].values():
        del cell["identity"]
    (sweep / "plan.json").write_text(json.dumps(payload, indent=1))


def _copy(tiny_sweep: Path, tmp_path: Path) -> Path:
    sweep = tmp_path / "tinysweep"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report", "mlflow.db", "results.parquet"))
    return sweep


def test_status_and_results_load_no_torch_and_print_what_the_typed_plan_prints(tiny_sweep, tmp_path, hdrope_here):
    sweep = _copy(tiny_sweep, tmp_path)
    table = tmp_path / "results.parquet"
    status, status_loaded = _console("sweep", "status", str(sweep))
    results, results_loaded = _console("sweep", "results", str(sweep), "--out", str(table))
    assert status_loaded == "LOADED []" and results_loaded == "LOADED []"
    light = pq.read_table(table)

    _forget_identities(sweep)  # the same sweep, read typed (torch and the registry) as before issue 47
    typed_status = hdrope_here(["sweep", "status", str(sweep)])
    typed_results = hdrope_here(["sweep", "results", str(sweep), "--out", str(table)])
    assert (typed_status.returncode, typed_results.returncode) == (0, 0), typed_results.stderr[-2000:]
    assert status.stdout == typed_status.stdout and "FINISHED 8" in status.stdout
    assert results.stdout == typed_results.stdout
    typed = pq.read_table(table)
    assert light.schema.equals(typed.schema, check_metadata=True)
    assert light.equals(typed)


def test_a_light_read_is_the_typed_plan_s_record_and_writes_the_same_table(tiny_sweep, tmp_path):
    from sweeps.plan_file import load_plan, plan_record, read_plan_record
    from sweeps.results import write_results

    stored = json.loads((tiny_sweep / "plan.json").read_text())
    assert all("identity" in cell for cell in stored["cells"].values())
    record = read_plan_record(tiny_sweep)
    typed = load_plan(tiny_sweep)
    assert record == plan_record(typed)
    assert {c.identity["pe_label"] for c in record.cells} == {"2D RoPE", "2D Paley", "4D identity", "4D Paley"}
    light_table = pq.read_table(write_results(record, tmp_path / "light.parquet"))
    typed_table = pq.read_table(write_results(typed, tmp_path / "typed.parquet"))
    assert light_table.schema.equals(typed_table.schema, check_metadata=True)
    assert light_table.equals(typed_table)


def test_a_plan_stored_before_identities_is_read_typed(tiny_sweep, tmp_path):
    from sweeps.plan_file import load_plan, plan_record, read_plan_record

    sweep = _copy(tiny_sweep, tmp_path)
    _forget_identities(sweep)
    assert read_plan_record(sweep) == plan_record(load_plan(sweep))


def test_every_kind_s_stored_identity_and_untyped_metrics_read_back_as_computed(tmp_path):
    """A plan over every registered kind (and a hybrid stack, a schedule, tasks, extrapolation with sliding windows):
    the record read from plan.json without types equals the one computed from the typed configs."""
    from sweeps.plan import Cell, Plan
    from sweeps.plan_file import plan_record, read_plan_record, save_plan
    from sweeps.spec import SweepSpec
    from trainer.config import config_hash
    from trainer.model.position import KIND_MODULES
    from trainer.presets import load_config

    variants = [("tiny", [f"model.pe.kind={kind}"]) for kind in KIND_MODULES]
    variants += [("tiny", ["model.pe_layers=[{layers: 'every 2nd', pe: {kind: nope}}]"]),
                 ("tiny", ["model.pe.kind=rope", "train.pe_schedule=[{step: 6, pe: {kind: nope}, lr: 0.001}]"]),
                 ("tasks_compact", ["eval.sliding_stride=8", "eval.passkey.enabled=true"])]
    cells = []
    for i, (preset, overrides) in enumerate(variants):
        cfg = load_config(preset, overrides, validate=False)
        cells.append(Cell(f"c{i:03d}", {"variant": overrides}, cfg, config_hash(cfg), config_hash(cfg)))
    plan = save_plan(Plan(SweepSpec(name="kinds", base="tiny"), cells, tmp_path / "kinds"))
    record = read_plan_record(plan.root)
    assert record == plan_record(plan)
    assert {c.identity["pe_kind"] for c in record.cells} >= {*KIND_MODULES, "hybrid", "scheduled"}
    assert {"val_loss_sw_x4", "passkey_acc", "acc_copy_x1.5"} <= set(record.cells[-1].metrics)
