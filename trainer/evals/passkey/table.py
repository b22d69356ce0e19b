"""The one passkey table: a row per prompt, written by training-time evaluation (a run's passkey.parquet) and by
`hdrope passkey eval` (eval_<config hash>.parquet), read by the analysis through `read_passkey_table`.

Columns: length (the prompt's tokens), target_length, length_factor (target_length / the train length), depth (the
key's depth by `trainer.data.passkey_prompt.key_depth`), depth_target, sample, passkey, generated, correct, then the
run (run_name, config_hash) and its encoding identity (`trainer.model.pe_schedule.run_identity`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hdrope.errors import UserError
from trainer.config import RunConfig
from trainer.evals.attention_dump import identity_arrays, run_columns
from trainer.model.pe_schedule import run_identity
from trainer.model.position import IDENTITY_COLUMNS

__all__ = ["PASSKEY_SCHEMA", "RUN_COLUMNS", "read_passkey_table", "upgrade_passkey_table", "with_run_columns",
           "write_passkey_table"]

_ROW = pa.schema([("length", pa.int64()), ("target_length", pa.int64()), ("length_factor", pa.float64()),
                  ("depth", pa.float64()), ("depth_target", pa.float64()), ("sample", pa.int64()),
                  ("passkey", pa.int64()), ("generated", pa.string()), ("correct", pa.bool_())])
# The columns after a per-example table's own: the run (name, config hash) and its encoding identity.
RUN_COLUMNS = [("run_name", pa.string()), ("config_hash", pa.string()),
               *((k, a.type) for k, a in identity_arrays(dict.fromkeys(IDENTITY_COLUMNS), 0).items())]
PASSKEY_SCHEMA = pa.schema([*_ROW, *RUN_COLUMNS])
_FIX = "rerun the cell or the evaluation (or delete the file to report without it)"


def write_passkey_table(rows: list[dict[str, Any]], cfg: RunConfig, chash: str, path: Path) -> Path:
    """Write a row per prompt (keys: the row columns of PASSKEY_SCHEMA) with the run's name, hash and identity."""
    pq.write_table(with_run_columns(pa.Table.from_pylist(rows, schema=_ROW), cfg, chash).cast(PASSKEY_SCHEMA), path)
    return path


def with_run_columns(table: pa.Table, cfg: RunConfig, chash: str) -> pa.Table:
    """`table` with the RUN_COLUMNS of the run of cfg (hash chash) appended, the same on every row."""
    for name, column in run_columns(cfg.name, chash, run_identity(cfg), len(table)).items():
        table = table.append_column(name, column)
    return table


def upgrade_passkey_table(table: pa.Table) -> pa.Table:
    """A table written before issue 18 in today's schema. A run's passkey.parquet had these columns already; a
    `hdrope passkey eval` table held a row per (bucket_u, depth_bin) with accuracy and n: each becomes n rows,
    round(accuracy·n) of them correct, at target_length = length = bucket_u and depth = depth_target = depth_bin
    (the prompts' own lengths, keys and generations were not stored)."""
    if "bucket_u" not in table.column_names:
        return table
    rows = []
    for r in table.to_pylist():
        n, k = int(r["n"]), round(float(r["accuracy"]) * int(r["n"]))
        rows += [{"length": r["bucket_u"], "target_length": r["bucket_u"], "length_factor": None,
                  "depth": r["depth_bin"], "depth_target": r["depth_bin"], "sample": i, "passkey": None,
                  "generated": None, "correct": i < k, "run_name": None, "config_hash": r["config_hash"],
                  **{c: r[c] for c in PASSKEY_SCHEMA.names if c in r and c not in ("correct", "depth")}}
                 for i in range(n)]
    return pa.Table.from_pylist(rows, schema=PASSKEY_SCHEMA)


def read_passkey_table(path: Path) -> pa.Table:
    """A passkey table in PASSKEY_SCHEMA (older layouts upgraded); UserError naming the file when it is damaged or
    not a passkey table."""
    try:
        table = upgrade_passkey_table(pq.read_table(path))
    except (OSError, pa.ArrowInvalid) as err:  # a truncated file, or not Parquet at all
        raise UserError(f"{path}: unreadable passkey table ({type(err).__name__}: truncated or not Parquet); "
                        f"{_FIX}") from None
    missing = [c for c in _ROW.names if c not in table.column_names]
    if missing:
        raise UserError(f"{path}: not a passkey table (missing columns {missing}); {_FIX}")
    if table.schema.field("correct").type != pa.bool_():
        raise UserError(f"{path}: column 'correct' is {table.schema.field('correct').type}, not bool; {_FIX}")
    return table
