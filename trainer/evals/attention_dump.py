"""Attention dumps: explicit attention maps of a fixed probe set, written to Parquet with pyarrow.

Schema (`attention.parquet`, one row per (sample, layer, head), one row group per layer):

| column | type | meaning |
|---|---|---|
| run_id, config_hash | string | which run |
| step | int64 | optimizer step of the weights |
| sample, layer, head | int32 | probe sample index, layer index, query head index |
| seq_len | int32 | L |
| pe_kind, pe_label, basis, scaling | string | the run's encoding identity (`trainer.model.position`) |
| rotation_dim | int32 | N (2 for rope, 0 for nope) |
| basis_seed | int64 | seed of a random basis (null otherwise) |
| theta | float64 | RoPE base (null for nope) |
| attn | fixed_shape_tensor<float16>[L, L] | attention weights, each row (query) sums to 1 (softmax, stick-breaking) |
| entropy | float32 | mean row entropy (nats) |
| erank | float32 | Roy–Vetterli effective rank (σ variant, float64 SVD) |

`logit_profile.parquet` holds one row per (layer, head) with the same identifier columns and
`logit_mean`: list<float32> of length L, the mean pre-softmax logit q·k/√d at relative distance
Δ = 0..L-1 over the causal part and all probe samples. Both files carry the schema version in
their key-value metadata (`hdrope.dump_schema`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hdrope.diagnostics import effective_rank, row_entropy
from hdrope.errors import UserError
from trainer.config import DumpConfig
from trainer.model.attention.call import AttentionCall
from trainer.model.attention.dense import dense_logits, dense_weights
from trainer.model.llama import Llama
from trainer.model.position import IDENTITY_COLUMNS

__all__ = ["DUMP_SCHEMA_VERSION", "DumpIds", "dump_attention", "dump_bytes", "dump_selection", "identity_arrays",
           "run_columns"]

DUMP_SCHEMA_VERSION = "2"  # 2: the full encoding identity columns


@dataclass
class DumpIds:
    """Identifier columns written on every row."""

    run_id: str
    config_hash: str
    step: int
    encoding: dict  # trainer.model.position.encoding_identity of the run


def dump_selection(cfg: DumpConfig, n_layers: int, n_heads: int, train_len: int) -> tuple[list[int], list[int], int]:
    """(layers, heads, L) the dump covers."""
    layers = list(cfg.layers) or list(range(n_layers))
    heads = list(cfg.heads) or list(range(n_heads))
    return layers, heads, cfg.seq_len or train_len


def dump_bytes(cfg: DumpConfig, n_layers: int, n_heads: int, train_len: int) -> int:
    """Bytes of attention maps (fp16) the dump would write, before compression."""
    layers, heads, length = dump_selection(cfg, n_layers, n_heads, train_len)
    return cfg.samples * len(layers) * len(heads) * length * length * 2


def check_budget(cfg: DumpConfig, n_layers: int, n_heads: int, train_len: int) -> None:
    """UserError naming the knobs when the dump would exceed dump.byte_budget."""
    need = dump_bytes(cfg, n_layers, n_heads, train_len)
    if need > cfg.byte_budget:
        layers, heads, length = dump_selection(cfg, n_layers, n_heads, train_len)
        raise UserError(
            f"attention dump needs {need / 2**20:.1f} MiB (samples={cfg.samples} x layers={len(layers)} x "
            f"heads={len(heads)} x {length}x{length} fp16) > dump.byte_budget={cfg.byte_budget / 2**20:.1f} MiB; "
            "lower dump.samples, dump.seq_len, dump.layers or dump.heads, or raise dump.byte_budget"
        )


def _id_columns(ids: DumpIds, n: int) -> dict[str, pa.Array]:
    return {
        "run_id": pa.array([ids.run_id] * n, pa.string()),
        "config_hash": pa.array([ids.config_hash] * n, pa.string()),
        "step": pa.array([ids.step] * n, pa.int64()),
    }


_ARROW_TYPES = {str: pa.string(), int: pa.int64(), float: pa.float64()}


def identity_arrays(encoding: dict, n: int) -> dict[str, pa.Array]:
    """The encoding identity as n-row Arrow columns, typed per IDENTITY_COLUMNS (rotation_dim int32)."""
    cols = {}
    for name, kind in IDENTITY_COLUMNS.items():
        typ = pa.int32() if name == "rotation_dim" else _ARROW_TYPES[kind]
        cols[name] = pa.array([encoding[name]] * n, typ)
    return cols


def run_columns(run_name: str, chash: str, encoding: dict, n: int) -> dict[str, pa.Array]:
    """The n-row columns that say which run a per-run table belongs to: run_name, config_hash, encoding identity."""
    return {"run_name": pa.array([run_name] * n, pa.string()), "config_hash": pa.array([chash] * n, pa.string()),
            **identity_arrays(encoding, n)}


def _pe_columns(ids: DumpIds, n: int) -> dict[str, pa.Array]:
    return identity_arrays(ids.encoding, n)


def _distance_profile(logits: torch.Tensor) -> np.ndarray:
    """(samples, heads, L, L) logits -> (heads, L) mean over the causal diagonal at each distance."""
    length = logits.shape[-1]
    prof = [torch.diagonal(logits, offset=-d, dim1=-2, dim2=-1).mean(dim=(0, -1)) for d in range(length)]
    return torch.stack(prof, dim=-1).numpy()


@torch.no_grad()
def dump_attention(model: Llama, tokens: torch.Tensor, cfg: DumpConfig, ids: DumpIds, out_dir: Path) -> list[Path]:
    """Write attention.parquet and logit_profile.parquet for probe tokens (samples, L); return their paths."""
    a = model.args
    layers, heads, length = dump_selection(cfg, a.n_layers, a.n_heads, tokens.shape[1])
    check_budget(cfg, a.n_layers, a.n_heads, tokens.shape[1])
    tokens = tokens[: cfg.samples, :length]
    was_training = model.training
    model.eval()
    capture: dict[int, AttentionCall] = {}
    try:
        model(tokens.to(next(model.parameters()).device), capture=capture)
    finally:
        model.train(was_training)
    out_dir.mkdir(parents=True, exist_ok=True)
    attn_path, prof_path = out_dir / "attention.parquet", out_dir / "logit_profile.parquet"
    tensor_type = pa.fixed_shape_tensor(pa.float16(), [length, length])
    meta = {b"hdrope.dump_schema": DUMP_SCHEMA_VERSION.encode()}
    writer, profiles = None, []
    try:
        for layer in layers:
            call = capture[layer]
            # what the model's attention sees and does, score bias, CoPE's positions, FoX's gates and stick-breaking
            # included; one sample at a time, so only the selected heads of every sample are held at once
            rows = [call.row(i) for i in range(call.q.shape[0])]
            logits = torch.cat([dense_logits(model.pe, row)[:, heads].float().cpu() for row in rows])
            profiles.append(_distance_profile(logits))
            probs = torch.cat([dense_weights(model.pe, row)[:, heads].float().cpu() for row in rows])
            # (samples, heads, L, L), causal mask applied
            n = probs.shape[0] * probs.shape[1]
            maps = probs.reshape(n, length, length)
            cols = {
                **_id_columns(ids, n),
                "sample": pa.array(np.repeat(np.arange(probs.shape[0]), len(heads)), pa.int32()),
                "layer": pa.array([layer] * n, pa.int32()),
                "head": pa.array(np.tile(np.asarray(heads), probs.shape[0]), pa.int32()),
                "seq_len": pa.array([length] * n, pa.int32()),
                **_pe_columns(ids, n),
                "attn": pa.ExtensionArray.from_storage(
                    tensor_type,
                    pa.FixedSizeListArray.from_arrays(pa.array(maps.half().numpy().reshape(-1)), length * length),
                ),
                "entropy": pa.array(row_entropy(maps).astype(np.float32)),
                "erank": pa.array(effective_rank(maps).astype(np.float32)),
            }
            table = pa.table(cols).replace_schema_metadata(meta)
            if writer is None:
                writer = pq.ParquetWriter(attn_path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    n = len(layers) * len(heads)
    prof_cols = {
        **_id_columns(ids, n),
        "layer": pa.array(np.repeat(layers, len(heads)), pa.int32()),
        "head": pa.array(np.tile(heads, len(layers)), pa.int32()),
        "seq_len": pa.array([length] * n, pa.int32()),
        **_pe_columns(ids, n),
        "logit_mean": pa.array([row.astype(np.float32) for p in profiles for row in p], pa.list_(pa.float32())),
    }
    pq.write_table(pa.table(prof_cols).replace_schema_metadata(meta), prof_path)
    return [attn_path, prof_path]
