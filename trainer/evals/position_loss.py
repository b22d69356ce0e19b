"""Loss by position: the next-token loss of the validation windows summed per position, binned, and its table.

Position p is the index of the input token whose successor is predicted (p + 1 tokens of context), so a window of
L + 1 tokens gives positions 0 … L − 1. Bins are spaced by a rule of POSITION_SPACINGS (the validator reads it);
each row of position_loss.parquet is one bin at one length factor: `length_factor`, `length` (the windows'
positions, f times the train length), `position` (the bin's first position), `loss` (mean nats over the bin's
tokens), `tokens` (how many), plus the run's name, config hash and encoding identity. The token-weighted mean of a
factor's rows is that factor's validation loss, from the same windows (`val_loss` at 1x, `val_loss_x<f>` beyond).
Format version 2 (schema metadata `hdrope.position_loss_version`) adds PAIRED_COLUMNS, null where not measured:
`diff`, `diff_se` (trainer.evals.paired_loss: full minus train-length context, per bin, where eval.sliding_stride
ran the limited pass), `windows`, and the factor's context `gain`, `gain_se` (the same on each of its rows).
Version 1 files have none of them and still load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hdrope.errors import UserError
from trainer.evals.paired_loss import context_gain, paired_bins

__all__ = ["PAIRED_COLUMNS", "POSITION_LOSS_FILE", "POSITION_LOSS_SCHEMA", "POSITION_LOSS_VERSION", "POSITION_SPACINGS",
           "PositionLoss", "bin_starts", "read_position_loss", "write_position_loss"]

POSITION_LOSS_FILE = "position_loss.parquet"


def _linear(length: int, bins: int) -> np.ndarray:
    return np.linspace(0, length, bins + 1)[:-1]


def _log(length: int, bins: int) -> np.ndarray:
    return np.concatenate([[0.0], np.geomspace(1, length, bins)[:-1]])  # the first bin is position 0 alone


# spacing name -> (length, bins) -> candidate first positions (rounded down and deduplicated by bin_starts)
POSITION_SPACINGS: dict[str, Callable[[int, int], np.ndarray]] = {"linear": _linear, "log": _log}


def bin_starts(length: int, bins: int, spacing: str = "linear") -> np.ndarray:
    """The first position of each bin over positions 0 … length − 1: at most `bins` bins (fewer when length is
    shorter or log spacing rounds two edges together), starting at 0, strictly increasing."""
    if spacing not in POSITION_SPACINGS:
        raise UserError(f"eval.position_spacing={spacing!r}: choose one of {', '.join(POSITION_SPACINGS)}")
    starts = np.unique(np.floor(POSITION_SPACINGS[spacing](length, min(bins, length))).astype(np.int64))
    return starts[starts < length]


@dataclass
class PositionLoss:
    """Summed next-token loss (nats, float64) and token count per position of the windows of one length; with
    `per_window`, each window's loss per position (windows × positions), and with `unigram` each of those targets'
    surprisal under the windows' own unigram distribution (a predictor that uses no context)."""

    sums: np.ndarray
    tokens: np.ndarray
    per_window: np.ndarray | None = field(default=None, repr=False)
    unigram: np.ndarray | None = field(default=None, repr=False)

    @property
    def mean(self) -> float:
        """The token-weighted mean loss over every position (the validation loss of these windows)."""
        return float(self.sums.sum() / self.tokens.sum())

    def binned(self, bins: int, spacing: str = "linear") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first position, mean loss, tokens) per bin."""
        starts = bin_starts(len(self.sums), bins, spacing)
        sums, tokens = np.add.reduceat(self.sums, starts), np.add.reduceat(self.tokens, starts)
        return starts, sums / tokens, tokens


POSITION_LOSS_SCHEMA = pa.schema([("length_factor", pa.float64()), ("length", pa.int64()), ("position", pa.int64()),
                                  ("loss", pa.float64()), ("tokens", pa.int64())])
PAIRED_COLUMNS = {"diff": pa.float64(), "diff_se": pa.float64(), "windows": pa.int64(), "gain": pa.float64(),
                  "gain_se": pa.float64()}
POSITION_LOSS_VERSION = 2
_FIX = "rerun the cell's evaluation (or delete the file to report without it)"


def _paired(full: PositionLoss, limited: PositionLoss | None, starts: np.ndarray,
            train_length: int | None) -> dict[str, list]:
    out: dict[str, list] = {name: [None] * len(starts) for name in PAIRED_COLUMNS}
    if full.per_window is None or full.unigram is None or train_length is None:
        return out
    gain, gain_se, windows = context_gain(full.per_window, full.unigram, train_length)
    out.update(windows=[windows] * len(starts), gain=[gain] * len(starts), gain_se=[gain_se] * len(starts))
    if limited is not None and limited.per_window is not None:
        diff, diff_se, _ = paired_bins(full.per_window, limited.per_window, starts)
        out.update(diff=diff.tolist(), diff_se=diff_se.tolist())
    return out


def write_position_loss(by_factor: dict[float, PositionLoss], bins: int, spacing: str, path: Path,
                        columns: Callable[[int], dict[str, pa.Array]] | None = None,
                        limited: dict[float, PositionLoss] | None = None, train_length: int | None = None) -> Path:
    """Write the binned losses of every length factor; `columns(rows)` gives the run's identity columns. With
    per-window losses and the train length, also the paired columns (PAIRED_COLUMNS; `diff` where `limited` has
    the factor's train-length-context loss of the same windows)."""
    rows = []
    for f, pl in sorted(by_factor.items()):
        starts, means, tokens = pl.binned(bins, spacing)
        paired = _paired(pl, (limited or {}).get(f), starts, train_length)
        rows += [{"length_factor": float(f), "length": len(pl.sums), "position": int(p), "loss": float(v),
                  "tokens": int(n), **{k: paired[k][i] for k in PAIRED_COLUMNS}}
                 for i, (p, v, n) in enumerate(zip(starts, means, tokens, strict=True))]
    schema = pa.schema([*POSITION_LOSS_SCHEMA, *(pa.field(k, t) for k, t in PAIRED_COLUMNS.items())],
                       metadata={"hdrope.position_loss_version": str(POSITION_LOSS_VERSION)})
    table = pa.Table.from_pylist(rows, schema=schema)
    for name, column in (columns(len(table)) if columns else {}).items():
        table = table.append_column(name, column)
    pq.write_table(table, path)
    return path


def read_position_loss(path: Path) -> pa.Table:
    """A run's position_loss.parquet; UserError naming the file when it is damaged or not a loss-by-position table."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as err:
        raise UserError(f"{path}: unreadable loss-by-position table ({type(err).__name__}: truncated or not "
                        f"Parquet); {_FIX}") from None
    missing = [c for c in POSITION_LOSS_SCHEMA.names if c not in table.column_names]
    if missing:
        raise UserError(f"{path}: not a loss-by-position table (missing columns {missing}); {_FIX}")
    if problem := _value_problem(table):
        raise UserError(f"{path}: damaged loss-by-position table ({problem}); {_FIX}")
    return table


# column -> (what its values must be, the check on a float64 array of them)
_VALUES: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "length_factor": ("finite and > 0", lambda v: np.isfinite(v) & (v > 0)),
    "length": ("whole numbers ≥ 1", lambda v: (v >= 1) & (v == np.floor(v))),
    "position": ("whole numbers ≥ 0", lambda v: (v >= 0) & (v == np.floor(v))),
    "loss": ("finite and ≥ 0 nats", lambda v: np.isfinite(v) & (v >= 0)),
    "tokens": ("whole numbers ≥ 1", lambda v: (v >= 1) & (v == np.floor(v))),
}


def _value_problem(table: pa.Table) -> str | None:
    """What is wrong with the values of a table that has the loss-by-position columns: a column stored as another
    type than a number, an empty cell, or a value out of its range (a position past its window's length)."""
    arrays = {}
    for name, (rule, ok) in _VALUES.items():
        column = table.column(name)
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            return f"column {name} is stored as {column.type}, not as numbers"
        if column.null_count:
            return f"column {name} has {column.null_count} empty value(s)"
        values = column.to_numpy().astype(np.float64)
        bad = ~ok(values)
        if bad.any():
            return f"{name} = {values[bad][0]:g} in {int(bad.sum())} row(s): must be {rule}"
        arrays[name] = values
    past = arrays["position"] >= arrays["length"]
    if past.any():
        return f"position {arrays['position'][past][0]:g} ≥ its length {arrays['length'][past][0]:g}"
    meta = table.schema.metadata or {}
    if meta.get(b"hdrope.position_loss_version") == str(POSITION_LOSS_VERSION).encode():
        return _paired_problem(table)
    return None


# a version-2 file's paired columns, in the groups that are measured together (all empty where one is not measured)
_PAIRED_GROUPS = (("diff", "diff_se"), ("gain", "gain_se", "windows"))
_PAIRED_VALUES: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "diff": ("finite", np.isfinite), "gain": ("finite", np.isfinite),
    "diff_se": ("finite and ≥ 0", lambda v: np.isfinite(v) & (v >= 0)),
    "gain_se": ("finite and ≥ 0", lambda v: np.isfinite(v) & (v >= 0)),
    "windows": ("whole numbers ≥ 1", lambda v: (v >= 1) & (v == np.floor(v))),
}


def _paired_problem(table: pa.Table) -> str | None:
    """What is wrong with a version-2 file's paired columns: one missing or not numbers, a group half empty in a row
    (a difference without its standard error, unless the row scored one window), or a value out of its range."""
    missing = [c for c in PAIRED_COLUMNS if c not in table.column_names]
    if missing:
        return f"a version-{POSITION_LOSS_VERSION} file without its paired columns {missing}"
    values = {}
    for name in PAIRED_COLUMNS:
        column = table.column(name)
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_null(column.type)):
            return f"column {name} is stored as {column.type}, not as numbers"
        values[name] = np.asarray(column.to_pandas(), dtype=np.float64)  # empty -> nan
    single = values["windows"] < 2  # one window has no spread: its standard errors are empty, and rightly so
    for group in _PAIRED_GROUPS:
        measured = ~np.isnan(values[group[0]])
        present = np.stack([~np.isnan(values[c]) | (single & measured & c.endswith("_se")) for c in group])
        half = present.any(axis=0) & ~present.all(axis=0)
        if half.any():
            row = int(np.flatnonzero(half)[0])
            empty = [c for c, p in zip(group, present[:, row], strict=True) if not p]
            return f"row {row} has {', '.join(c for c in group if c not in empty)} but {', '.join(empty)} is empty"
        for name in group:
            v = values[name][present[0]]
            v = v[~np.isnan(v)] if name.endswith("_se") else v  # (empty only where one window was scored)
            rule, ok = _PAIRED_VALUES[name]
            bad = ~ok(v)
            if bad.any():
                return f"{name} = {v[bad][0]:g} in {int(bad.sum())} row(s): must be {rule}"
    return None
