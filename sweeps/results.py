"""The sweep results table: one Parquet row per cell (deduplicated cells expanded), the analysis input.

Columns: sweep, cell_id, trained_cell (the cell that actually trained), dedup_of, status
(FINISHED | FAILED | RUNNING | PENDING | CORRUPT), error, config_hash, the encoding identity of the cell
(`trainer.model.pe_schedule.run_identity`: pe_kind, pe_label, rotation_dim, basis, basis_seed, theta,
scaling; as its plan stored it, so the table is written without torch: `sweeps.plan_file.PlanRecord`), seed,
steps, run_dir, the machine that trained it (`trainer.files.machine.MACHINE_COLUMNS`: cpu_model, cpu_capability,
gpu, torch_version, threads, from run.json), the axis values (one string column per axis key, named by the dotted
key), and every final metric the cells planned or produced (val_loss_x16 included when configured; the
lm_<task>_<metric> columns of `hdrope eval lm-eval` when a cell was evaluated).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hdrope.errors import UserError
from sweeps.plan import Plan
from sweeps.plan_file import CellRecord, PlanRecord, cell_record, plan_record
from trainer.config import BASE_METRICS
from trainer.files.machine import MACHINE_COLUMNS, machine_row
from trainer.files.run_files import RUN_FILE, read_lm_eval, read_machines, read_result
from trainer.model.identity import IDENTITY_COLUMNS
from trainer.model.pe_schedule import run_identity

__all__ = ["axis_columns", "cell_rows", "planned_frame", "sampled_values", "write_results"]

def _status(cell_dir: Path, config_hash: str | None) -> tuple[str, str | None, dict[str, Any]]:
    try:
        result = read_result(cell_dir)
    except UserError as err:
        return "CORRUPT", str(err), {}
    if result is not None and config_hash and result["config_hash"] != config_hash:
        return "CORRUPT", (f"{cell_dir / 'result.json'}: result.json is of config {result['config_hash']}, not of this "
                           f"cell's {config_hash}; delete it and resume the sweep (`hdrope sweep resume`)"), {}
    if result is not None:
        return "FINISHED", None, result
    error = cell_dir / "error.txt"
    if error.is_file():
        return "FAILED", error.read_text(errors="replace")[-2000:], {}
    if (cell_dir / RUN_FILE).is_file():  # the trainer claimed the directory: started, not finished
        return "RUNNING", None, {}
    return "PENDING", None, {}


def axis_columns(values: dict[str, Any]) -> dict[str, str]:
    """A cell's axis values as results.parquet stores them: one string per dotted key (mappings and lists as JSON)."""
    return {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in values.items()}


def planned_frame(plan: Plan) -> Any:
    """The plan's cells shaped like results.parquet before anything ran (every cell as if FINISHED, dedup kept as
    planned), with the axes in `attrs`: what the analysis needs to know which comparisons a report will draw."""
    import pandas as pd

    df = pd.DataFrame([{**axis_columns(c.values), "cell_id": c.cell_id, "status": "FINISHED",
                        "dedup_of": c.dedup_of, **run_identity(c.config),
                        "seed": int(c.config.train.seed)} for c in plan.cells])
    df.attrs = {"axes": plan.axes, "seed_axes": plan.seed_axes}
    return df


def _row(name: str, cell: CellRecord, trained_dir: Path, trained_hash: str | None = None) -> dict[str, Any]:
    """A cell's row; its metrics come from trained_dir, the run of config trained_hash (its own or its dedup
    representative's)."""
    status, error, result = _status(trained_dir, trained_hash)
    metrics = result.get("metrics") or {}
    machine, machine_error = _machine(trained_dir)
    if machine_error is not None and status == "FINISHED":  # its numbers' machine is unknown: said, not guessed
        status, error = "CORRUPT", machine_error
    if status == "FINISHED":
        try:
            metrics = {**metrics, **read_lm_eval(trained_dir)}  # downstream benchmarks (`hdrope eval lm-eval`)
        except UserError as err:
            status, error = "CORRUPT", str(err)
    return {
        **axis_columns(cell.values),
        "sweep": name, "cell_id": cell.cell_id, "trained_cell": trained_dir.name, "dedup_of": cell.dedup_of,
        "status": status, "error": error, "config_hash": cell.config_hash or result.get("config_hash"),
        **cell.identity, "seed": cell.seed, "steps": cell.steps,
        "run_dir": str(trained_dir), **machine,
        **{m: float(v) for m, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
    }


def _machine(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The machine columns of the run in run_dir (None where its run.json records no machine), and what is wrong
    with its run.json when it cannot be read (the cell's status says so)."""
    try:
        return machine_row(read_machines(run_dir)), None
    except UserError as err:
        return machine_row([]), str(err)


def _run_config(path: Path) -> Any:
    """The config an Optuna trial's run directory holds (its cell was sampled, never stored in the plan)."""
    from trainer.presets import merge_config, yaml_layer

    return merge_config([yaml_layer(path, "the trial's config.yaml is damaged; delete its directory")], where=str(path))


def sampled_values(plan: Plan | PlanRecord, cell_dir: Path) -> dict[str, Any]:
    """The values an Optuna trial sampled, as its run directory's config holds them (typed, not as table text)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(_run_config(cell_dir / "config.yaml"))
    return {k: OmegaConf.select(cfg, k) for k in plan.spec.search.space}


def cell_rows(plan: Plan | PlanRecord) -> list[dict[str, Any]]:
    """One dict per planned cell with its status and final metrics (a deduplicated cell takes its representative's)."""
    record = plan_record(plan)
    hashes = {c.cell_id: c.config_hash for c in record.cells}
    trained = {c.cell_id: c.dedup_of or c.cell_id for c in record.cells}
    rows = [_row(record.spec.name, c, record.root / "cells" / trained[c.cell_id], hashes.get(trained[c.cell_id]))
            for c in record.cells]
    for cell_dir in sorted((record.root / "cells").glob("t-*")):  # Optuna trials, named by their sampled values
        if (cell_dir / "config.yaml").is_file():
            cfg = _run_config(cell_dir / "config.yaml")
            rows.append(_row(record.spec.name, cell_record(cell_dir.name, sampled_values(record, cell_dir), cfg, None,
                                                           None), cell_dir))
    return rows


def _metric_columns(record: PlanRecord, rows: list[dict[str, Any]]) -> list[str]:
    """Every metric any cell planned or produced: the planned ones in the trainer's order, then the rest."""
    planned: list[str] = list(BASE_METRICS)
    for cell in record.cells:
        planned += [m for m in cell.metrics if m not in planned]
    fixed = {"sweep", "cell_id", "trained_cell", "dedup_of", "status", "error", "config_hash", *IDENTITY_COLUMNS,
             "seed", "steps", "run_dir", *MACHINE_COLUMNS}
    seen = [k for r in rows for k in r if k not in fixed and k not in record.axes]
    extra = sorted({k for k in seen if k not in planned and isinstance(next(r[k] for r in rows if k in r), float)})
    return [m for m in planned if m != "lr"] + extra


def write_results(plan: Plan | PlanRecord, path: Path | None = None) -> Path:
    """Write results.parquet into the sweep directory (or path) and return it.

    The schema metadata records the sweep's axes (`hdrope.axes`) and which of them are seeds
    (`hdrope.seed_axes`), so the report groups cells by every other axis without parsing labels."""
    record = plan_record(plan)
    path = path or record.root / "results.parquet"
    rows = cell_rows(record)
    metrics = _metric_columns(record, rows)
    identity_types = {str: pa.string(), int: pa.int64(), float: pa.float64()}
    fields = [("sweep", pa.string()), ("cell_id", pa.string()), ("trained_cell", pa.string()),
              ("dedup_of", pa.string()), ("status", pa.string()), ("error", pa.string()),
              ("config_hash", pa.string()), *((k, identity_types[t]) for k, t in IDENTITY_COLUMNS.items()),
              ("seed", pa.int64()), ("steps", pa.int64()), ("run_dir", pa.string()),
              *((k, identity_types[t]) for k, t in MACHINE_COLUMNS.items())]
    axes = [k for k in record.axes if k not in dict(fields)]
    fields += [(k, pa.string()) for k in axes] + [(m, pa.float64()) for m in metrics]
    schema = pa.schema(fields, metadata={"hdrope.axes": json.dumps(record.axes),
                                         "hdrope.seed_axes": json.dumps(record.seed_axes)})
    table = pa.Table.from_pylist([{name: r.get(name) for name in schema.names} for r in rows], schema=schema)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path
