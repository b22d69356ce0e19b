"""The sweep results table: one Parquet row per cell (deduplicated cells expanded), the analysis input.

Columns: sweep, cell_id, trained_cell (the cell that actually trained), dedup_of, status
(FINISHED | FAILED | PENDING), error, config_hash, the axis values (one column per axis key,
named by the dotted key), pe_kind, rotation_dim, basis, theta, seed, steps, run_dir, and every
final metric (train_loss, val_loss, val_bpb, tokens_per_s, mfu, val_loss_x2/x4/x8, passkey_acc).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trainer.config import METRIC_NAMES

__all__ = ["cell_rows", "write_results"]



def _status(cell_dir: Path) -> tuple[str, str | None, dict[str, Any]]:
    result = cell_dir / "result.json"
    if result.is_file():
        return "FINISHED", None, json.loads(result.read_text())
    error = cell_dir / "error.txt"
    if error.is_file():
        return "FAILED", error.read_text()[-2000:], {}
    return "PENDING", None, {}


def _row(name: str, cell_id: str, trained_dir: Path, cfg, dedup_of: str | None, config_hash: str | None,
         values: dict[str, Any]) -> dict[str, Any]:
    status, error, result = _status(trained_dir)
    pe, metrics = cfg.model.pe, result.get("metrics", {})
    return {
        "sweep": name, "cell_id": cell_id, "trained_cell": trained_dir.name, "dedup_of": dedup_of,
        "status": status, "error": error, "config_hash": config_hash or result.get("config_hash"),
        "pe_kind": pe.kind, "rotation_dim": 2 if pe.kind == "rope" else int(pe.rotation_dim),
        "basis": pe.basis, "theta": float(pe.theta), "seed": int(cfg.train.seed), "steps": int(cfg.train.steps),
        "run_dir": str(trained_dir),
        **{k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in values.items()},
        **{m: (float(metrics[m]) if metrics.get(m) is not None else None) for m in METRIC_NAMES},
    }


def cell_rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per planned cell with its status and final metrics (a deduplicated cell takes its representative's)."""
    from omegaconf import OmegaConf

    root = Path(payload["root"])
    rows = [_row(payload["name"], cell_id, root / "cells" / (cell["dedup_of"] or cell_id),
                 OmegaConf.create(cell["config"]), cell["dedup_of"], cell["config_hash"], cell["values"])
            for cell_id, cell in payload["cells"].items()]
    for cell_dir in sorted((root / "cells").glob("t-*")):  # Optuna trials, named by their sampled values
        if (cell_dir / "config.yaml").is_file():
            cfg = OmegaConf.load(cell_dir / "config.yaml")
            values = {k: OmegaConf.select(cfg, k) for k in payload["space"]}
            rows.append(_row(payload["name"], cell_dir.name, cell_dir, cfg, None, None, values))
    return rows


def write_results(payload: dict[str, Any], path: Path | None = None) -> Path:
    """Write results.parquet into the sweep directory (or path) and return it."""
    path = path or Path(payload["root"]) / "results.parquet"
    pq.write_table(pa.Table.from_pylist(cell_rows(payload)), path)
    return path
