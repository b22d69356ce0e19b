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

import pyarrow as pa
import pyarrow.parquet as pq

from trainer.config import RunConfig
from trainer.evals.passkey.table import RUN_COLUMNS, with_run_columns

__all__ = ["TASKS_FILE", "TASKS_SCHEMA", "write_tasks_table"]

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
