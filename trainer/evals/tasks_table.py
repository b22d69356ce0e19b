"""A run's tasks.parquet: one row per evaluated task example, with the run and its encoding identity.

Columns: task, length_factor, length (prompt tokens), target_length (round(train length x factor) = prompt +
answer tokens), example, params (JSON of the drawn parameters: depth of each insert, k, q, span, digits …), target,
generated, correct, token_acc, distance (tokens from the earliest insert the answer reads to the question),
trained_distance (the longest distance a training example holds), reach (the longest this length holds), floor (the
task's chance token accuracy), token_skill (token_acc chance-corrected: 0 at the floor), then run_name, config_hash
and the encoding identity columns (as passkey.parquet).
Its mean of `correct` per (task, length_factor) is the run's acc_<task>_x<factor>.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from hdrope.errors import UserError
from trainer.config import RunConfig
from trainer.evals.passkey.table import RUN_COLUMNS, with_run_columns

__all__ = ["TASKS_FILE", "TASKS_SCHEMA", "read_tasks_table", "write_tasks_table"]

TASKS_FILE = "tasks.parquet"
_ROW = pa.schema([("task", pa.string()), ("length_factor", pa.float64()), ("length", pa.int64()),
                  ("target_length", pa.int64()), ("example", pa.int64()), ("params", pa.string()),
                  ("target", pa.string()), ("generated", pa.string()), ("correct", pa.bool_()),
                  ("token_acc", pa.float64()), ("distance", pa.int64()), ("trained_distance", pa.int64()),
                  ("reach", pa.int64()), ("floor", pa.float64()), ("token_skill", pa.float64())])
TASKS_SCHEMA = pa.schema([*_ROW, *RUN_COLUMNS])


def write_tasks_table(rows: list[dict[str, Any]], cfg: RunConfig, chash: str, path: Path) -> Path:
    """Write one row per example (keys: the row columns of TASKS_SCHEMA) with the run's name, hash and identity."""
    table = with_run_columns(pa.Table.from_pylist(rows, schema=_ROW), cfg, chash)
    pq.write_table(table.cast(TASKS_SCHEMA), path)
    return path


_FIX = "rerun the cell's task evaluation (or delete the file to report without it)"
# column -> (what its values must be, the check on a float64 array of them), for the columns the analysis reads
_VALUES = {
    "length_factor": ("finite and > 0", lambda v: np.isfinite(v) & (v > 0)),
    "distance": ("whole numbers ≥ 0", lambda v: (v >= 0) & (v == np.floor(v))),
    "trained_distance": ("whole numbers ≥ 1", lambda v: (v >= 1) & (v == np.floor(v))),
    "reach": ("whole numbers ≥ 0", lambda v: (v >= 0) & (v == np.floor(v))),
    "token_skill": ("finite", np.isfinite),
    "floor": ("in [0, 1]", lambda v: (v >= 0) & (v <= 1)),
}


_REQUIRED = ("task", "length_factor", "correct", "token_acc", "floor", "token_skill")
_DISTANCES = ("distance", "trained_distance", "reach")  # recorded together (tables before them have none)


def read_tasks_table(path: Path) -> pd.DataFrame:
    """A run's tasks.parquet; UserError naming the file when it is not Parquet, lacks a column, or holds a value out
    of its range (a trained distance of 0, a reach that is not a count)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as err:
        raise UserError(f"{path}: unreadable tasks table ({type(err).__name__}: truncated or not Parquet); {_FIX}") \
            from None
    missing = [c for c in _REQUIRED if c not in table.column_names]
    have = [c for c in _DISTANCES if c in table.column_names]
    if missing or 0 < len(have) < len(_DISTANCES):
        missing += [c for c in _DISTANCES if c not in have] if have else []
        raise UserError(f"{path}: not a tasks table of this lab (missing columns {missing}); {_FIX}")
    for name, (rule, ok) in _VALUES.items():
        if name not in table.column_names:
            continue  # a table from before distances were recorded
        column = table.column(name)
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            raise UserError(f"{path}: damaged tasks table (column {name} is stored as {column.type}, not as numbers); "
                            f"{_FIX}")
        values = np.asarray(column.to_pandas(), dtype=np.float64)
        bad = ~np.isnan(values) & ~ok(values)
        if bad.any():
            raise UserError(f"{path}: damaged tasks table ({name} = {values[bad][0]:g} in {int(bad.sum())} row(s): "
                            f"must be {rule}); {_FIX}")
    if not pa.types.is_boolean(table.column("correct").type):
        raise UserError(f"{path}: damaged tasks table (column correct is stored as {table.column('correct').type}, "
                        f"not as true/false); {_FIX}")
    return table.to_pandas()
