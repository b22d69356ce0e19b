"""Damaged or tampered files in a sweep directory: a clear exit-2 message (file, problem, fix) or a tolerant
reading, never a traceback and never a write outside the sweep (issue: trust, bad input)."""

import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def _truncate(path):
    path.write_text(path.read_text()[: len(path.read_text()) // 2])


def _edit_plan(fn):
    def apply(sweep):
        plan = json.loads((sweep / "plan.json").read_text())
        fn(plan)
        (sweep / "plan.json").write_text(json.dumps(plan))
    return apply


def _escape_cell(plan):
    plan["cells"]["../../outside"] = plan["cells"].pop(next(iter(plan["cells"])))


def _interpolating_spec(plan):
    assert "description: ''" in plan["spec"]
    plan["spec"] = plan["spec"].replace("description: ''", "description: ${oc.env:HOME}")


def _bad_identity(plan):
    next(iter(plan["cells"].values()))["identity"]["rotation_dim"] = "four"


def _first_cell(sweep):
    return next(p for p in sorted((sweep / "cells").iterdir()) if (p / "result.json").is_file())


# (id, damage(sweep dir), argv after the sweep dir is substituted for {sweep}, exit code, text in stderr)
CASES = [
    ("truncated-plan", lambda s: _truncate(s / "plan.json"), ["sweep", "status", "{sweep}"], 2,
     "plan.json: unreadable"),
    ("plan-not-a-plan", lambda s: (s / "plan.json").write_text("[1, 2]"), ["sweep", "results", "{sweep}"], 2,
     "not a plan written by `hdrope sweep`"),
    ("plan-cell-escapes", _edit_plan(_escape_cell), ["sweep", "results", "{sweep}"], 2, "is not a plain name"),
    ("plan-interpolation", _edit_plan(_interpolating_spec), ["sweep", "status", "{sweep}"], 2,
     "is an OmegaConf interpolation"),
    ("plan-bad-yaml", _edit_plan(lambda p: p.update(spec="a: [1\nb: 2")), ["sweep", "status", "{sweep}"], 2,
     "not a valid YAML mapping"),
    ("plan-bad-identity", _edit_plan(_bad_identity), ["sweep", "results", "{sweep}"], 2,
     "identity rotation_dim='four' must be of type int or null"),
    ("report-truncated-plan", lambda s: _truncate(s / "plan.json"), ["report", "{sweep}"], 2, "plan.json: unreadable"),
    ("foreign-results", lambda s: pq.write_table(pa.table({"x": [1, 2]}), s / "results.parquet"),
     ["report", "{sweep}"], 2, "not a results table of this version"),
    ("zero-row-results",
     lambda s: pq.write_table(pq.read_table(s / "results.parquet").slice(0, 0), s / "results.parquet"),
     ["report", "{sweep}"], 2, "has no rows"),
    ("garbage-results", lambda s: (s / "results.parquet").write_bytes(b"PAR1garbage"), ["report", "{sweep}"], 2,
     "results.parquet: unreadable"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_damaged_sweep_files_exit_2_with_the_file_and_the_fix(tiny_sweep, tmp_path, case, hdrope_here):
    _, damage, argv, code, text = case
    sweep = tmp_path / "tinysweep"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report", "mlflow.db"))
    damage(sweep)
    before = sorted(p for p in tmp_path.rglob("*"))
    out = hdrope_here([a.format(sweep=sweep) for a in argv], cwd=tmp_path)
    assert out.returncode == code, out.stderr[-2000:]
    assert text in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not (tmp_path.parent / "outside").exists()
    assert sorted(p for p in tmp_path.rglob("*")) == before  # a refused command writes nothing


def test_a_corrupt_result_and_a_half_written_metrics_line_are_reported_not_fatal(tiny_sweep, tmp_path):
    sweep = tmp_path / "tinysweep"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report", "mlflow.db"))
    cell = _first_cell(sweep)
    (cell / "result.json").write_text('{"config_hash": "ab')
    others = [p for p in sorted((sweep / "cells").iterdir()) if p != cell and (p / "metrics.jsonl").is_file()]
    with (others[0] / "metrics.jsonl").open("a") as f:
        f.write('{"step": 99, "train_lo')  # the trainer is mid-line
    status = subprocess.run([sys.executable, "-m", "sweeps.console", "sweep", "status", str(sweep)],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert "CORRUPT" in status.stdout and "step     12" in status.stdout  # the partial step-99 line is skipped
    results = subprocess.run([sys.executable, "-m", "sweeps.console", "sweep", "results", str(sweep)],
                             capture_output=True, text=True, timeout=120)
    assert results.returncode == 0, results.stderr
    rows = pq.read_table(sweep / "results.parquet").to_pandas()
    bad = rows[rows["trained_cell"] == cell.name]
    assert (bad["status"] == "CORRUPT").all() and bad["error"].str.contains("result.json is corrupt").all()
    assert (rows.loc[rows["trained_cell"] != cell.name, "status"] == "FINISHED").all()  # nothing else is lost
