"""Real per-window noise of the paired loss instrument, measured once and shipped (issue 38).

The paired loss effective length (`analysis.loss_length`) reads the mean over windows of d[w, b], each window's
full-context minus train-length-context loss in bin b (`trainer.evals.paired_loss.window_differences`). How small a
break it can find depends on how much d varies from window to window, which no synthetic model shows (an n-gram
model's d is exactly 0). `python -m analysis.window_noise` trains the quickstart design's RoPE and 4D identity
models (`sweeps/quickstart.yaml`, seed 42, its 300 steps) and scores each on SETS disjoint eighths of the validation
split at the design's longest factor, with its window count and eval.sliding_stride: the windows × bins matrix of
d per model and set, written to experiments/pilots/window_noise.parquet. `read_window_noise` reads it
back through one schema; `analysis.loss_power` simulates the instrument on it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hdrope.errors import UserError

__all__ = ["MODELS", "NOISE_FILE", "SCHEMA", "SETS", "SPEC", "WindowNoise", "measure_window_noise",
           "read_window_noise"]

ROOT = Path(__file__).resolve().parents[1]
SPEC = "sweeps/quickstart.yaml"
MODELS = {"RoPE": {"kind": "rope"}, "4D identity": {"kind": "hdrope", "rotation_dim": 4, "basis": "identity"}}
SEED = 42
SETS = 8
NOISE_FILE = ROOT / "experiments" / "pilots" / "window_noise.parquet"
SCHEMA = pa.schema([("model", pa.string()), ("set", pa.int32()), ("window", pa.int32()), ("position", pa.int32()),
                    ("diff", pa.float64())])
VERSION = "1"


@dataclass(frozen=True)
class WindowNoise:
    """One model's measured d: `diff[set]` is windows × bins; bins start at `positions` of windows of `length`
    tokens, scored at a model of train length `train_length`."""

    model: str
    diff: np.ndarray  # sets × windows × bins
    positions: np.ndarray
    train_length: int
    length: int


def measure_window_noise(out: Path = NOISE_FILE, cache_dir: str = "") -> Path:
    """Train MODELS on the quickstart design, score their per-window d on SETS validation slices, write `out`."""
    import torch

    from analysis.known_answers import validation_tokens
    from sweeps.plan import cell_config
    from sweeps.spec import load_spec
    from trainer.evals.evaluate import evaluate_validation
    from trainer.evals.paired_loss import window_differences
    from trainer.evals.position_loss import bin_starts
    from trainer.run.loop import train
    from trainer.run.trained import load_trained

    spec = load_spec(ROOT / SPEC)
    _, val = validation_tokens(cache_dir)
    tables, meta = [], {"version": VERSION, "spec": SPEC, "seed": SEED, "sets": SETS, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for label, pe in MODELS.items():
            cfg = cell_config(spec, {"model.pe": pe, "train.seed": SEED}, f"window-noise-{pe['kind']}",
                              Path(tmp) / label.replace(" ", "_"))
            cfg.dump.enabled, cfg.data.cache_dir = False, cache_dir
            result = train(cfg)
            model = load_trained(result.checkpoint).model
            torch.set_num_threads(1)
            e, seq = cfg.eval, cfg.model.max_seq_len
            factor = max(e.extrapolation)
            starts = bin_starts(factor * seq, e.position_bins, e.position_spacing)
            for s, part in enumerate(np.array_split(val, SETS)):
                v = evaluate_validation(model, part, seq, e, 1.0, contextlib.nullcontext)
                d = window_differences(v.by_position[factor].per_window, v.limited[factor].per_window, starts)
                w, b = np.meshgrid(np.arange(d.shape[0]), starts, indexing="ij")
                tables.append(pa.table({"model": [label] * d.size, "set": np.full(d.size, s, np.int32),
                                        "window": w.ravel().astype(np.int32), "position": b.ravel().astype(np.int32),
                                        "diff": d.ravel()}, schema=SCHEMA))
            meta["models"][label] = {"pe": pe, "steps": cfg.train.steps, "val_loss": result.metrics["val_loss"],
                                     f"val_loss_x{factor}": result.metrics[f"val_loss_x{factor}"]}
            meta.update(train_length=seq, length=factor * seq, windows=int(d.shape[0]),
                        sliding_stride=e.sliding_stride, torch=torch.__version__)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = pa.concat_tables(tables).replace_schema_metadata({"hdrope.window_noise": json.dumps(meta)})
    pq.write_table(table, out)
    return out


def _refuse(path: Path, what: str) -> UserError:
    return UserError(f"{path}: {what}; regenerate it with `python -m analysis.window_noise`")


def read_window_noise(path: Path = NOISE_FILE) -> list[WindowNoise]:
    """The measured noise of each model, checked against one schema: the columns and their types, the metadata,
    finite values, every (model, set, window, position) once, and the same windows and bins in every set."""
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as err:
        raise _refuse(path, f"cannot be read as Parquet ({err})") from err
    if table.schema.remove_metadata() != SCHEMA:
        raise _refuse(path, f"columns {table.schema.remove_metadata().to_string()!r}, expected {SCHEMA.to_string()!r}")
    try:
        meta = json.loads((table.schema.metadata or {})[b"hdrope.window_noise"])
        train_length, length, windows = int(meta["train_length"]), int(meta["length"]), int(meta["windows"])
        sets = int(meta["sets"])
    except (KeyError, ValueError, TypeError) as err:  # metadata absent, damaged or mistyped
        raise _refuse(path, f"its hdrope.window_noise metadata is missing or incomplete ({err})") from err
    if meta.get("version") != VERSION:
        raise _refuse(path, f"version {meta.get('version')!r}, this reader reads {VERSION!r}")
    df = table.to_pandas()
    if not np.isfinite(df["diff"]).all():
        raise _refuse(path, f"{int((~np.isfinite(df['diff'])).sum())} values of diff are not finite")
    if df.duplicated(["model", "set", "window", "position"]).any():
        raise _refuse(path, "a (model, set, window, position) appears more than once")
    out = []
    for model, g in df.groupby("model", sort=False):
        positions = np.sort(g["position"].unique())
        if not (positions[0] == 0 and positions[-1] < length and train_length < length):
            raise _refuse(path, f"model {model!r}: bins {positions.tolist()} do not lie in 0..{length - 1}")
        expected = sets * windows * len(positions)
        if len(g) != expected or sorted(g["set"].unique()) != list(range(sets)) or g["window"].max() >= windows:
            raise _refuse(path, f"model {model!r}: {len(g)} rows, expected {sets} sets × {windows} windows × "
                          f"{len(positions)} bins = {expected}")
        g = g.sort_values(["set", "window", "position"])
        diff = g["diff"].to_numpy().reshape(sets, windows, len(positions))
        out.append(WindowNoise(str(model), diff, positions, train_length, length))
    if sorted(w.model for w in out) != sorted(MODELS):
        raise _refuse(path, f"models {[w.model for w in out]}, expected {list(MODELS)}")
    return out


def main(argv: list[str] | None = None) -> None:
    """Measure and write the noise file (minutes on one core: two 300-step trainings and their evaluations)."""
    parser = argparse.ArgumentParser(prog="python -m analysis.window_noise", description=main.__doc__)
    parser.add_argument("--out", type=Path, default=NOISE_FILE)
    parser.add_argument("--cache-dir", default="")
    a = parser.parse_args(argv)
    path = measure_window_noise(a.out, a.cache_dir)
    noise = read_window_noise(path)
    for n in noise:
        past = n.positions >= n.train_length
        sd = float(np.mean(n.diff[:, :, past].std(axis=1, ddof=1)))
        print(f"{n.model}: {n.diff.shape[0]} sets × {n.diff.shape[1]} windows × {len(n.positions)} bins; "
              f"per-window SD of d past L {sd:.3f} nats (mean over bins and sets; √ of it over windows: "
              f"{sd / math.sqrt(n.diff.shape[1]):.4f})")


if __name__ == "__main__":
    main()
