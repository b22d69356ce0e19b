"""`hdrope sweep plan|run|submit|status|logs|resume|results` and `hdrope ui`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

from hdrope.errors import UserError

__all__ = ["sweep_main", "ui_main"]

DEFAULT_STORAGE = "runs/sweeps"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _plan(a: argparse.Namespace) -> int:
    if a.detect is not None:  # a power calculation on a pilot's stored results: the analysis owns it
        from sweeps.console import run_command

        return run_command("seeds", [a.spec, *(f"--set={s}" for s in a.set), "--detect", str(a.detect),
                                     "--pilot", a.pilot, "--metric", a.metric, "--storage", a.storage])
    from sweeps.runner import prepare

    plan = prepare(a.spec, a.set)
    if a.json:
        cells = [{"cell_id": c.cell_id, "values": c.values, "config_hash": c.config_hash, "dedup_of": c.dedup_of}
                 for c in plan.cells]
        print(json.dumps({"summary": plan.summary(), "cells": cells}, indent=1, default=str))
        return 0
    width = max(len(c.cell_id) for c in plan.cells)
    print(f"{'cell':<{width}}  {'config_hash':<16}  runs")
    for c in plan.cells:
        print(f"{c.cell_id:<{width}}  {c.config_hash:<16}  {'= ' + c.dedup_of if c.dedup_of else 'train'}")
    s = plan.summary()
    print(f"\n{s['cells']} cells, {s['trials_run']} trials run, {s['trials_saved']} saved by dedup; "
          f"{s['per_trial']['cpus']} CPU / {s['per_trial']['gpus']} GPU per trial"
          f"{' in ' + str(s['per_trial']['workers']) + ' Ray Train workers' if s['per_trial']['workers'] > 1 else ''}, "
          f"{s['concurrent_here']} at once "
          f"on this machine; {s['total_steps']} optimizer steps in all; search={s['search']}, "
          f"scheduler={s['scheduler']}; writes to {s['dir']}")
    if a.estimate:
        from sweeps.estimate import estimate_line

        print(estimate_line(plan))
    for note in plan.warnings:
        print(f"warning: {note}", file=sys.stderr)
    return 0


def _run(a: argparse.Namespace) -> int:
    from sweeps.runner import run_sweep

    return run_sweep(a.spec, a.set, a.address, a.tracking_uri)


def _resume(a: argparse.Namespace) -> int:
    from sweeps.runner import resume_sweep

    return resume_sweep(a.name, a.storage, a.address, a.tracking_uri)


def _submit(a: argparse.Namespace) -> int:
    from sweeps.submit import submit_sweep

    job_id = submit_sweep(a.spec, a.address, a.set, a.working_dir)
    print(job_id)
    return 0


def _status(a: argparse.Namespace) -> int:
    from sweeps.plan_file import find_plan_record
    from sweeps.results import cell_rows

    plan = find_plan_record(a.name, a.storage)
    rows = cell_rows(plan)
    counts = Counter(r["status"] for r in rows)
    print(f"sweep {plan.spec.name} at {plan.root}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for r in rows:
        last = _last_metrics(Path(r["run_dir"]))
        shown = " ".join(f"{k}={v:.4g}" for k, v in last.items() if k in ("train_loss", "val_loss") and v is not None)
        via = f" (= {r['dedup_of']})" if r["dedup_of"] else ""
        print(f"  {r['cell_id']:<40} {r['status']:<9} step {last.get('step', 0):>6} {shown}{via}")
    job = plan.root / "job.json"
    if job.is_file():
        print(f"  submitted job: {json.loads(job.read_text())}")
    return 0


def _last_metrics(run_dir: Path) -> dict:
    from trainer.files.run_files import METRICS_FILE, read_metrics

    last: dict = {}
    for rec in read_metrics(run_dir / METRICS_FILE):  # tolerates a line being written
        last.update(rec)
    return last


def _logs(a: argparse.Namespace) -> int:
    from sweeps.plan_file import find_plan
    from trainer.files.run_files import METRICS_FILE, read_metrics

    root = find_plan(a.name, a.storage).root
    job = root / "job.json"
    if job.is_file():
        from sweeps.submit import job_logs

        info = json.loads(job.read_text())
        print(job_logs(info["address"], info["job_id"])[-a.tail * 200 :])
    for cell_dir in sorted((root / "cells").glob("*")):
        records = read_metrics(cell_dir / METRICS_FILE)
        dedup = cell_dir / "dedup.json"
        print(f"== {cell_dir.name}" + (f" (= {json.loads(dedup.read_text())['dedup_of']})" if dedup.is_file() else ""))
        print(_columns(records[-a.tail :]))
        if (cell_dir / "error.txt").is_file():
            print(f"   ERROR {(cell_dir / 'error.txt').read_text().strip()}")
    return 0


def _columns(records: list[dict]) -> str:
    """Metric records as aligned columns under a header (step first, then every key in first-seen order)."""
    if not records:
        return "   (no metrics yet)"
    keys = list(dict.fromkeys(k for rec in records for k in rec))
    keys = ["step", *[k for k in keys if k != "step"]] if "step" in keys else keys
    cell = lambda v: "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    rows = [keys, *[[cell(rec.get(k)) for k in keys] for rec in records]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(keys))]
    return "\n".join("   " + "  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows)


def _results(a: argparse.Namespace) -> int:
    from sweeps.plan_file import find_plan_record
    from sweeps.results import write_results

    path = write_results(find_plan_record(a.name, a.storage), Path(a.out) if a.out else None)
    print(results_text(path))
    print(f"\nwritten to {path}")
    _warn_corrupt(path)
    return 0


def _warn_corrupt(path: Path) -> None:
    """Name every cell whose result could not be trusted (status CORRUPT: no metrics in the table), with the fix."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path, columns=["cell_id", "status", "error"]).to_pylist()
    for row in rows:
        if row["status"] == "CORRUPT":
            print(f"warning: cell {row['cell_id']}: {row['error']}", file=sys.stderr)


def results_text(path: Path, width: int = 160) -> str:
    """The results table as text: one line per cell, its encoding, θ, seed, status and the main metrics."""
    import pyarrow.parquet as pq

    df = pq.read_table(path).to_pandas()
    metrics = [c for c in df.columns if c.startswith("val_loss") or c == "passkey_acc"]
    cols = ["cell_id", "status", "pe_label", "theta", "seed", *metrics, "dedup_of"]
    shown = df[[c for c in cols if c in df.columns]].copy()
    shown["dedup_of"] = shown["dedup_of"].fillna("")
    return shown.to_string(index=False, float_format=lambda v: f"{v:.4g}", line_width=width)


def sweep_main(argv: list[str]) -> int:
    """Dispatch `hdrope sweep <action>`."""
    p = argparse.ArgumentParser(prog="hdrope sweep", description="Ray Tune sweeps of HD-RoPE ablations")
    sub = p.add_subparsers(dest="action", required=True)

    def spec_cmd(name: str, help_: str) -> argparse.ArgumentParser:
        q = sub.add_parser(name, help=help_)
        q.add_argument("spec", help="sweep spec YAML")
        q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec key")
        return q

    def name_cmd(name: str, help_: str) -> argparse.ArgumentParser:
        q = sub.add_parser(name, help=help_)
        q.add_argument("name", help="sweep name (or its directory)")
        q.add_argument("--storage", default=DEFAULT_STORAGE, help=f"storage root (default {DEFAULT_STORAGE})")
        return q

    q = spec_cmd("plan", "print the cells, trials run and saved, and resources without running")
    q.add_argument("--json", action="store_true")
    q.add_argument("--estimate", action="store_true",
                   help="also time a few training steps of each model shape here and print the sweep's estimated time")
    q.add_argument("--detect", type=float, default=None, metavar="DIFF",
                   help="print the seeds this plan needs to detect a difference DIFF in --metric (80%% power, after "
                        "the report's Holm correction), from the per-seed spread of --pilot")
    q.add_argument("--pilot", default="", help="a finished sweep (name or directory) to take the spread from")
    q.add_argument("--metric", default="", help="the metric for --detect (default: the spec's search.metric)")
    q.add_argument("--storage", default=DEFAULT_STORAGE, help="where --pilot is looked up by name")
    q.set_defaults(fn=_plan)
    q = spec_cmd("run", "run a sweep (embedded Ray unless --address)")
    q.add_argument("--address", default=None, help="join an existing Ray cluster (e.g. auto or HOST:6379)")
    q.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"), help="MLflow tracking URI")
    q.set_defaults(fn=_run)
    q = spec_cmd("submit", "submit the sweep to a Ray cluster as a Ray Job; prints the job id")
    q.add_argument("--address", required=True, help="Ray dashboard address, e.g. http://127.0.0.1:8265")
    q.add_argument("--working-dir", default=".", help="shipped to the cluster as the job's working dir")
    q.set_defaults(fn=_submit)
    q = name_cmd("resume", "finish a sweep whose driver died (never re-runs a finished cell)")
    q.add_argument("--address", default=None)
    q.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"))
    q.set_defaults(fn=_resume)
    name_cmd("status", "cells by status with their last step and loss").set_defaults(fn=_status)
    q = name_cmd("logs", "the last metric lines of every cell (and the job's log if submitted)")
    q.add_argument("--tail", type=int, default=3)
    q.set_defaults(fn=_logs)
    q = name_cmd("results", "write results.parquet (all cells x final metrics, dedup expanded) and print it")
    q.add_argument("--out", default="")
    q.set_defaults(fn=_results)
    a = p.parse_args(argv)
    return a.fn(a)


def ui_main(argv: list[str]) -> int:
    """`hdrope ui [NAME]`: the MLflow UI on 127.0.0.1 for a sweep's store (or --tracking-uri)."""
    p = argparse.ArgumentParser(prog="hdrope ui", description=ui_main.__doc__)
    p.add_argument("name", nargs="?", help="sweep name or directory (default: the tracking URI given)")
    p.add_argument("--storage", default=DEFAULT_STORAGE)
    p.add_argument("--tracking-uri", default="", help="a backend store URI instead of a sweep's")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; anything else exposes it)")
    p.add_argument("--port", type=int, default=5000, help="TCP port (default 5000; 0 picks a free one and prints it)")
    p.add_argument("--allowed-hosts", default="", help="MLflow's Host-header guard, e.g. 'lab-box,lab-box:5000' "
                   "(required with a --host other than loopback)")
    a = p.parse_args(argv)
    if not 0 <= a.port <= 65535:
        raise UserError(f"--port {a.port}: a TCP port is 1 to 65535 (0 picks a free one); e.g. --port 5000")
    if a.host not in LOOPBACK:
        if not a.allowed_hosts:
            raise UserError(f"--host {a.host} exposes the MLflow UI (no login) beyond this machine; pass "
                            "--allowed-hosts with the names clients use (MLflow's DNS-rebinding guard), or keep the "
                            "default --host 127.0.0.1 and use an SSH tunnel")
        print(f"warning: the MLflow UI listens on {a.host}:{a.port}, reachable from other machines; it has no "
              "login", file=sys.stderr)
    from sweeps.mlflow_server import serve_forever

    if a.name:
        from sweeps.plan_file import find_plan
        from trainer.run.store_home import rehome_store
        from trainer.run.tracking import default_tracking_uri

        plan = find_plan(a.name, a.storage)
        uri, experiment = default_tracking_uri(plan.root), plan.spec.name
        rehome_store(uri, plan.root)  # a copied or moved sweep shows its own artifacts
    elif a.tracking_uri:
        from trainer.run.tracking import check_tracking_uri

        check_tracking_uri(a.tracking_uri)  # a store that cannot be created is named before a server starts
        uri, experiment = a.tracking_uri, ""
    else:
        raise UserError("give a sweep NAME or --tracking-uri")
    return serve_forever(uri, a.host, a.port, experiment, a.allowed_hosts)
