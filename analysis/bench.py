"""`hdrope bench analysis`: effective-rank throughput over a stored ≥ 1 GiB attention dump.

Writes a synthetic dump in the trainer's schema (random causal softmax maps at L = 256 and
L = 1024, 1 GiB by default), then streams it back by row group and times the shipped path
(`analysis.load.iter_maps` + batched float64 `effective_rank`) against a per-map NumPy SVD loop on the
same maps, side by side. Each L is timed for at most --seconds; the projected time for the whole
file is printed with the measured rate.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hdrope.bench_args import positive_float
from hdrope.errors import UserError

__all__ = ["main", "write_synthetic_dump"]


def write_synthetic_dump(path: Path, length: int, n_maps: int, per_group: int = 64, seed: int = 0) -> int:
    """Write n_maps random causal softmax maps (L × L, fp16) in the dump schema; return bytes of map data."""
    from trainer.evals.attention_dump import DUMP_SCHEMA_VERSION

    rng = np.random.default_rng(seed)
    tensor_type = pa.fixed_shape_tensor(pa.float16(), [length, length])
    mask = np.tril(np.ones((length, length), dtype=bool))
    writer = None
    for start in range(0, n_maps, per_group):
        n = min(per_group, n_maps - start)
        logits = rng.standard_normal((n, length, length), dtype=np.float32) * 2
        logits[:, ~mask] = -np.inf
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        storage = pa.FixedSizeListArray.from_arrays(pa.array(p.astype(np.float16).reshape(-1)), length * length)
        table = pa.table({
            "run_id": ["bench"] * n, "config_hash": ["0"] * n, "step": pa.array([0] * n, pa.int64()),
            "sample": pa.array(np.arange(start, start + n), pa.int32()), "layer": pa.array([start // per_group] * n,
                                                                                         pa.int32()),
            "head": pa.array([0] * n, pa.int32()), "seq_len": pa.array([length] * n, pa.int32()),
            "pe_kind": ["synthetic"] * n, "basis": [""] * n, "rotation_dim": pa.array([0] * n, pa.int32()),
            "theta": pa.array([0.0] * n), "attn": pa.ExtensionArray.from_storage(tensor_type, storage),
            "entropy": pa.array(np.zeros(n, np.float32)), "erank": pa.array(np.zeros(n, np.float32)),
        }).replace_schema_metadata({b"hdrope.dump_schema": DUMP_SCHEMA_VERSION.encode()})
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="none")
        writer.write_table(table)
    writer.close()
    return n_maps * length * length * 2


def _time_shipped(path: Path, budget: float, method: str = "svd") -> tuple[int, float]:
    from analysis.load import iter_maps
    from analysis.rank import effective_rank

    done, t0 = 0, time.perf_counter()
    for _, maps in iter_maps(path):
        for i in range(0, len(maps), 16):
            effective_rank(maps[i : i + 16], method=method)
            done += len(maps[i : i + 16])
            if time.perf_counter() - t0 > budget:
                return done, time.perf_counter() - t0
    return done, time.perf_counter() - t0


def _time_numpy(path: Path, budget: float) -> tuple[int, float]:
    done, t0 = 0, time.perf_counter()
    pf = pq.ParquetFile(path)
    for g in range(pf.num_row_groups):
        for m in pf.read_row_group(g, columns=["attn"]).column(0).combine_chunks().to_numpy_ndarray():
            s = np.linalg.svd(m.astype(np.float64), compute_uv=False)
            p = s / s.sum()
            np.exp(-(p[p > 0] * np.log(p[p > 0])).sum())
            done += 1
            if time.perf_counter() - t0 > budget:
                return done, time.perf_counter() - t0
    return done, time.perf_counter() - t0


def main(argv: list[str]) -> int:
    """CLI entry of `hdrope bench analysis`."""
    p = argparse.ArgumentParser(prog="hdrope bench analysis", description=__doc__)
    p.add_argument("--gib", type=positive_float, default=1.0,
                   help="dump size in GiB (split 1:3 between L=256 and L=1024)")
    p.add_argument("--seconds", type=positive_float, default=20.0, help="time budget per (L, method)")
    p.add_argument("--dir", default="", help="where to write the dump (default: a temporary directory)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.dir and not (Path(a.dir).is_dir() and os.access(a.dir, os.W_OK)):
        why = "is not a writable directory" if Path(a.dir).exists() else "does not exist"
        raise UserError(f"--dir {a.dir}: {why}; the benchmark writes its {a.gib:g} GiB dump there, so create it first "
                        "(mkdir -p) or leave --dir out for a temporary directory")
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir or None) as tmp:
        for length, share in ((256, 0.25), (1024, 0.75)):
            n = max(1, int(a.gib * share * 2**30 // (length * length * 2)))
            path = Path(tmp) / f"dump_{length}.parquet"
            nbytes = write_synthetic_dump(path, length, n)
            shipped, t_s = _time_shipped(path, a.seconds)
            gram, t_g = _time_shipped(path, a.seconds, method="gram")
            naive, t_n = _time_numpy(path, a.seconds)
            rate_s, rate_g, rate_n = shipped / t_s, gram / t_g, naive / t_n
            rows.append({"L": length, "maps_in_dump": n, "dump_mib": nbytes / 2**20, "maps_per_s": rate_s,
                         "gram_maps_per_s": rate_g, "numpy_loop_maps_per_s": rate_n, "speedup": rate_s / rate_n,
                         "gram_speedup": rate_g / rate_n, "projected_full_dump_s": n / rate_s})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    total = sum(r["dump_mib"] for r in rows) / 1024
    print(f"# effective rank (Roy–Vetterli, float64 SVD) over a {total:.2f} GiB dump, streamed by row group")
    print(f"{'L':>5} {'maps':>6} {'MiB':>7} {'svd maps/s':>11} {'gram maps/s':>12} {'numpy loop':>11} "
          f"{'svd/loop':>9} {'gram/loop':>10} {'whole file (svd)':>17}")
    for r in rows:
        print(f"{r['L']:>5} {r['maps_in_dump']:>6} {r['dump_mib']:>7.0f} {r['maps_per_s']:>11.1f} "
              f"{r['gram_maps_per_s']:>12.1f} {r['numpy_loop_maps_per_s']:>11.1f} {r['speedup']:>8.2f}x "
              f"{r['gram_speedup']:>9.2f}x {r['projected_full_dump_s']:>16.0f}s")
    return 0
