"""Reading stored results: attention dumps, logit profiles, passkey tables and sweep results.

Dumps are streamed one row group (one layer) at a time, so memory stays bounded by one layer's
selection. A dump stores its maps full, pooled or as sampled rows (`form`, `pool`, `query_rows`; a dump written
before the forms, schema 2, is full): `load_stats` carries the form beside each row's entropy and effective rank,
`iter_maps` yields the maps as stored, and `same_dump_form` refuses to compare statistics of different forms or
lengths. A truncated, foreign or wrong-schema file raises a UserError that says which file and what is wrong, never
a traceback from inside pyarrow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hdrope.errors import UserError
from trainer.evals.passkey.table import read_passkey_table

__all__ = [
    "SCALAR_COLUMNS",
    "find_sweep_dir",
    "iter_maps",
    "load_passkey",
    "load_profiles",
    "load_results",
    "load_stats",
    "open_dump",
    "read_json",
    "same_dump_form",
    "sweep_cells",
]

SCALAR_COLUMNS = ["run_id", "config_hash", "step", "sample", "layer", "head", "seq_len", "pe_kind", "pe_label",
                  "rotation_dim", "basis", "basis_seed", "theta", "scaling", "form", "pool", "entropy", "erank"]
FORM_DEFAULTS = {"form": "full", "pool": 1}  # what a dump written before the forms (schema 2) holds
_SCHEMA_KEY = b"hdrope.dump_schema"
_DAMAGED = (pa.ArrowException, OSError)  # what pyarrow raises for a damaged file (ArrowInvalid, OSError for thrift)


def _truncated(path: Path | str, group: int, err: Exception) -> UserError:
    return UserError(f"{path}: row group {group} is unreadable ({type(err).__name__}); the file is truncated")


def open_dump(path: str | Path, kind: str = "attention") -> pq.ParquetFile:
    """Open an attention or logit-profile dump, checking it is complete and ours."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such dump file")
    try:
        pf = pq.ParquetFile(path)
    except _DAMAGED as err:
        why = type(err).__name__
        raise UserError(f"{path}: not a readable Parquet file (truncated or not Parquet: {why})") from None
    meta = pf.schema_arrow.metadata or {}
    if _SCHEMA_KEY not in meta:
        raise UserError(f"{path}: not an hdrope dump (no {_SCHEMA_KEY.decode()} metadata); "
                         "dumps are written by trainer.evals.attention_dump")
    need = {"attention": ("attn", "layer", "head", "erank"), "profile": ("logit_mean", "layer", "head")}[kind]
    missing = [c for c in need if c not in pf.schema_arrow.names]
    if missing:
        raise UserError(f"{path}: missing columns {missing}; is this a {kind} dump?")
    wrong = [f"{name} is {pf.schema_arrow.field(name).type}, not {want}" for name, (want, ok) in _TYPES.items()
             if name in pf.schema_arrow.names and not ok(pf.schema_arrow.field(name).type)]
    if wrong:
        article = "an" if kind[0] in "aeiou" else "a"
        raise UserError(f"{path}: not {article} {kind} dump of this lab ({'; '.join(wrong)}); dumps are written by "
                        "trainer.evals.attention_dump: re-dump the run (dump.enabled=true)")
    return pf


def _float_tensor(t: pa.DataType) -> bool:
    storage = t.storage_type if isinstance(t, pa.BaseExtensionType) else t
    return pa.types.is_fixed_size_list(storage) and pa.types.is_floating(storage.value_type)


def _float_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and \
        pa.types.is_floating(t.value_type)


# column -> (what it must be, check): a file whose metadata says "dump" but whose columns are other types is refused
_TYPES = {
    **{c: ("an integer", pa.types.is_integer) for c in ("layer", "head", "sample", "seq_len", "step", "rotation_dim",
                                                         "pool")},
    **{c: ("a float", pa.types.is_floating) for c in ("erank", "entropy", "theta")},
    **{c: ("a string", pa.types.is_string) for c in ("pe_kind", "pe_label", "basis", "run_id", "config_hash", "form")},
    "attn": ("a fixed-shape float tensor", _float_tensor),
    "logit_mean": ("a list of floats", _float_list),
}


def _filter(table: pa.Table, layers, heads, samples) -> pa.Table:
    for col, wanted in (("layer", layers), ("head", heads), ("sample", samples)):
        if wanted is not None and col in table.column_names:
            table = table.filter(pc.is_in(table.column(col), value_set=pa.array(list(wanted), pa.int32())))
    return table


def load_stats(path: str | Path, layers=None, heads=None) -> pd.DataFrame:
    """Scalar columns (entropy, erank, ids) of an attention dump, without decoding any map."""
    pf = open_dump(path)
    frames = []
    for i in range(pf.num_row_groups):
        try:
            t = pf.read_row_group(i, columns=[c for c in SCALAR_COLUMNS if c in pf.schema_arrow.names])
        except _DAMAGED as err:
            raise _truncated(path, i, err) from None
        frames.append(_with_form(_filter(t, layers, heads, None).to_pandas()))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SCALAR_COLUMNS)


def _with_form(frame: pd.DataFrame) -> pd.DataFrame:
    for column, default in FORM_DEFAULTS.items():
        if column not in frame.columns:
            frame[column] = default
    return frame


def same_dump_form(stats: pd.DataFrame, what: str) -> pd.DataFrame:
    """stats unchanged when all its rows come from dumps of one form, pool and length; UserError naming `what` and
    the forms found otherwise (a pooled map's effective rank is not a full map's)."""
    forms = stats[["form", "pool", "seq_len"]].drop_duplicates()
    if len(forms) > 1:
        found = "; ".join(f"{r.form} (pool {r.pool}) at {r.seq_len} tokens" for r in forms.itertuples())
        raise UserError(f"{what}: the attention dumps differ in form or length ({found}), so their effective ranks and "
                        "entropies are not comparable; dump every cell with one dump.seq_len and dump.form")
    return stats


def iter_maps(path: str | Path, layers=None, heads=None, samples=None) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Yield (ids, maps (n, M, N) float32) one row group (layer) at a time, selected by layer/head/sample; the maps
    as stored (the ids' `form`, `pool` and `query_rows` say how: L × L full, pooled ⌈L/pool⌉², or rows × L)."""
    pf = open_dump(path)
    for i in range(pf.num_row_groups):
        try:
            t = pf.read_row_group(i)
        except _DAMAGED as err:
            raise _truncated(path, i, err) from None
        t = _filter(t, layers, heads, samples)
        if t.num_rows == 0:
            continue
        maps = t.column("attn").combine_chunks().to_numpy_ndarray().astype(np.float32)
        yield _with_form(t.drop(["attn"]).to_pandas()), maps


def load_profiles(path: str | Path, layers=None, heads=None) -> pd.DataFrame:
    """The logit-by-distance table: one row per (layer, head), `logit_mean` as numpy arrays."""
    pf = open_dump(path, kind="profile")
    try:
        t = pf.read()
    except _DAMAGED as err:
        raise UserError(f"{path}: unreadable ({type(err).__name__}); the file is truncated") from None
    df = _filter(t, layers, heads, None).to_pandas()
    df["logit_mean"] = df["logit_mean"].map(lambda v: np.asarray(v, dtype=np.float64))
    return df


RESULT_COLUMNS = ("cell_id", "status", "dedup_of", "run_dir", "pe_kind", "pe_label", "rotation_dim", "basis", "theta")


REPO_ROOT = Path(__file__).resolve().parent.parent


def find_sweep_dir(sweep_dir: str | Path) -> Path:
    """The sweep directory a notebook or script names, from any working directory: the path as given, else
    relative to the repository root (where `hdrope sweep run` writes runs/sweeps/NAME), else runs/sweeps/NAME."""
    given = Path(sweep_dir).expanduser()
    tried = [given] if given.is_absolute() else [given, REPO_ROOT / given, REPO_ROOT / "runs" / "sweeps" / given]
    for path in tried:
        if (path / "results.parquet").is_file() or (path / "plan.json").is_file():
            return path.resolve()
    raise UserError(f"sweep_dir={str(sweep_dir)!r}: no sweep there (no results.parquet or plan.json) in "
                    f"{', '.join(str(t) for t in tried)}; run `hdrope sweep run SPEC` first or give its directory")


def load_results(sweep_dir: str | Path) -> pd.DataFrame:
    """The sweep's results.parquet (one row per cell); `attrs` holds its axes and seed axes.

    A missing, unreadable, empty or foreign table is a UserError that says how to rewrite it."""
    path = Path(sweep_dir) / "results.parquet"
    fix = "rewrite it with `hdrope sweep results NAME`"
    if not path.is_file():
        raise UserError(f"{sweep_dir}: no results.parquet; run `hdrope sweep results NAME` first")
    try:
        table = pq.read_table(path)
    except _DAMAGED as err:
        raise UserError(f"{path}: unreadable ({type(err).__name__}); {fix}") from None
    missing = [c for c in RESULT_COLUMNS if c not in table.column_names]
    if missing:
        raise UserError(f"{path}: not a results table of this version (missing columns {missing}); {fix}")
    if table.num_rows == 0:
        raise UserError(f"{path}: has no rows (no cell was planned?); {fix}")
    meta = table.schema.metadata or {}
    df = table.to_pandas()
    cells = Path(sweep_dir).resolve() / "cells"
    if "trained_cell" in df and cells.is_dir():  # the sweep's own cells, wherever it was copied or moved to
        df["run_dir"] = [str(cells / c) if isinstance(c, str) and c else d
                         for c, d in zip(df["trained_cell"], df["run_dir"], strict=True)]
    df.attrs["axes"] = json.loads(meta.get(b"hdrope.axes", b"[]"))
    df.attrs["seed_axes"] = json.loads(meta.get(b"hdrope.seed_axes", b"[]"))
    return df


def sweep_cells(sweep_dir: str | Path) -> pd.DataFrame:
    """Trained cells of a sweep with their variant and the paths of their dumps and passkey tables
    (dedup duplicates dropped)."""
    from analysis.variants import trained

    df = trained(load_results(sweep_dir))
    run = df["run_dir"].map(Path)
    df["attention_path"] = run.map(lambda p: p / "attention" / "attention.parquet")
    df["profile_path"] = run.map(lambda p: p / "attention" / "logit_profile.parquet")
    df["passkey_path"] = run.map(lambda p: p / "passkey.parquet")
    return df.reset_index(drop=True)


def missing_run_dirs(cells: pd.DataFrame) -> list[str]:
    """The ids of the cells whose run directory is gone (their tables and dumps cannot be read)."""
    return [str(c) for c, d in zip(cells["cell_id"], cells["run_dir"], strict=True) if not Path(d).is_dir()]


def load_passkey(sweep_dir: str | Path) -> pd.DataFrame:
    """All trained cells' passkey rows with the cell's id and variant (for the polar fan heatmaps)."""
    frames = []
    for _, cell in sweep_cells(sweep_dir).iterrows():
        if cell["passkey_path"].is_file():
            t = read_passkey_table(cell["passkey_path"]).to_pandas()
            t["cell_id"], t["variant"], t["variant_rank"] = cell["cell_id"], cell["variant"], cell["variant_rank"]
            frames.append(t)
    if not frames:
        raise UserError(f"{sweep_dir}: no passkey.parquet in any cell; enable eval.passkey")
    return pd.concat(frames, ignore_index=True)


def read_json(path: Path) -> dict:
    """A JSON object from a file, or {} when absent; UserError naming the file when it is corrupt."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({type(err).__name__}: truncated or edited)") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data
