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
| form | string | what `attn` holds (`trainer.config.DUMP_FORMS`): full, pooled or rows |
| pool | int32 | tokens per block of a pooled map (1 otherwise) |
| query_rows | list<int32> | the query positions of a rows map's rows (null otherwise) |
| attn | fixed_shape_tensor<float16>[M, N] | attention weights, each row a distribution (softmax, stick-breaking) |
| entropy | float32 | mean entropy (nats) of the true rows: every row (full, pooled), the sampled ones (rows) |
| erank | float32 | Roy–Vetterli effective rank (σ variant, float64 SVD) of the stored map (null for rows) |

`attn` is L × L (full), ⌈L/pool⌉ × ⌈L/pool⌉ (pooled: each query's weights summed over blocks of `pool` keys,
averaged over blocks of `pool` queries; its erank is that coarser map's) or rows × L (rows).

`logit_profile.parquet` holds one row per (layer, head) with the same identifier columns and
`logit_mean`: list<float32> of length L, the mean pre-softmax logit (the scores the weights are made of) at relative
distance Δ = 0..L-1 over the visible pairs and all probe samples, in every form. Both files carry the schema version
and the form in their key-value metadata (`hdrope.dump_schema`, `hdrope.dump_form`). Past the train length (or
whenever the map is not stored full) the maps are computed tile by tile (`trainer.model.attention.tiled
.tile_weights`), so no L² matrix per head is ever held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hdrope.diagnostics import effective_rank
from hdrope.errors import UserError
from trainer.config import DumpConfig
from trainer.model.attention.call import AttentionCall
from trainer.model.attention.dense import dense_logits, dense_weights
from trainer.model.attention.tiled import DEFAULT_BLOCK, tile_weights
from trainer.model.llama import Llama
from trainer.model.position import IDENTITY_COLUMNS

__all__ = ["DUMP_SCHEMA_VERSION", "DumpIds", "dump_attention", "dump_bytes", "dump_form", "dump_selection",
           "identity_arrays", "run_columns"]

DUMP_SCHEMA_VERSION = "3"  # 2: the full encoding identity columns; 3: form, pool, query_rows


@dataclass
class DumpIds:
    """Identifier columns written on every row."""

    run_id: str
    config_hash: str
    step: int
    encoding: dict  # trainer.model.position.encoding_identity of the run


@dataclass(frozen=True)
class DumpForm:
    """What a dump's maps hold at its length: `form`, the pooling block, the sampled rows, the map's shape."""

    form: str
    pool: int
    rows: tuple[int, ...]
    shape: tuple[int, int]


def dump_form(cfg: DumpConfig, length: int) -> DumpForm:
    """The form of a dump of `length` tokens under cfg (dump.form auto: full up to dump.full_max, pooled beyond)."""
    form = cfg.form if cfg.form != "auto" else ("full" if length <= cfg.full_max else "pooled")
    if form == "full":
        return DumpForm("full", 1, (), (length, length))
    if form == "pooled":
        pool = cfg.pool or math.ceil(length / 256)
        side = math.ceil(length / pool)
        return DumpForm("pooled", pool, (), (side, side))
    rows = tuple(sorted({int(r) for r in np.linspace(0, length - 1, min(cfg.rows, length)).round()}))
    return DumpForm("rows", 1, rows, (len(rows), length))


def dump_selection(cfg: DumpConfig, n_layers: int, n_heads: int, train_len: int) -> tuple[list[int], list[int], int]:
    """(layers, heads, L) the dump covers."""
    layers = list(cfg.layers) or list(range(n_layers))
    heads = list(cfg.heads) or list(range(n_heads))
    return layers, heads, cfg.seq_len or train_len


def dump_bytes(cfg: DumpConfig, n_layers: int, n_heads: int, train_len: int) -> int:
    """Bytes of attention maps (fp16) the dump would write, before compression."""
    layers, heads, length = dump_selection(cfg, n_layers, n_heads, train_len)
    rows, cols = dump_form(cfg, length).shape
    return cfg.samples * len(layers) * len(heads) * rows * cols * 2


def check_budget(cfg: DumpConfig, n_layers: int, n_heads: int, train_len: int) -> None:
    """UserError naming the knobs when the dump would exceed dump.byte_budget."""
    need = dump_bytes(cfg, n_layers, n_heads, train_len)
    if need > cfg.byte_budget:
        layers, heads, length = dump_selection(cfg, n_layers, n_heads, train_len)
        form = dump_form(cfg, length)
        raise UserError(
            f"attention dump needs {need / 2**20:.1f} MiB (samples={cfg.samples} x layers={len(layers)} x "
            f"heads={len(heads)} x {form.shape[0]}x{form.shape[1]} fp16, dump.form={form.form}) > "
            f"dump.byte_budget={cfg.byte_budget / 2**20:.1f} MiB; lower dump.samples, dump.seq_len, dump.layers or "
            "dump.heads, store the maps pooled (dump.form=pooled, a larger dump.pool) or as sampled rows "
            "(dump.form=rows), or raise dump.byte_budget"
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


class _Layer:
    """One layer's dump of one sample, gathered tile by tile: the stored maps, the row entropies and the logit sums
    and counts at each distance (heads, ...), float64."""

    def __init__(self, heads: int, length: int, form: DumpForm) -> None:
        self.form, self.length = form, length
        self.maps = torch.zeros(heads, *form.shape, dtype=torch.float64)
        self.entropy = torch.zeros(heads, length, dtype=torch.float64)
        self.logit_sum = torch.zeros(heads, length, dtype=torch.float64)
        self.logit_count = torch.zeros(length, dtype=torch.float64)

    def add(self, i0: int, i1: int, j0: int, j1: int, weights: torch.Tensor, scores: torch.Tensor) -> None:
        """Fold in one tile's weights and scores (heads, queries, keys)."""
        w, sc = weights.double(), scores.double()
        self.entropy[:, i0:i1] -= torch.xlogy(w, w).sum(-1)
        visible = torch.isfinite(sc)
        dist = (torch.arange(i0, i1)[:, None] - torch.arange(j0, j1)[None, :]).clamp(min=0)
        take = visible[0]  # the mask is the heads' own; within the causal part distances are >= 0
        self.logit_sum.index_add_(1, dist[take], sc[:, take])
        self.logit_count.index_add_(0, dist[take], torch.ones(int(take.sum()), dtype=torch.float64))
        f = self.form
        if f.form == "full":
            self.maps[:, i0:i1, j0:j1] = w
        elif f.form == "pooled":
            p = f.pool
            rows, cols = torch.arange(i0, i1) // p, torch.arange(j0, j1) // p
            per_row = torch.zeros(w.shape[0], i1 - i0, f.shape[1], dtype=torch.float64).index_add_(2, cols, w)
            self.maps.index_add_(1, rows, per_row)
        else:
            mine = [r for r in f.rows if i0 <= r < i1]
            if mine:
                at = [f.rows.index(r) for r in mine]
                self.maps[:, at, j0:j1] = w[:, [r - i0 for r in mine]]

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(maps, mean row entropy) per head: a pooled map's block sums become averages over its queries."""
        f = self.form
        maps = self.maps
        if f.form == "pooled":
            counts = torch.bincount(torch.arange(self.length) // f.pool, minlength=f.shape[0]).double()
            maps = maps / counts[None, :, None]
        entropy = self.entropy[:, list(f.rows)] if f.form == "rows" else self.entropy
        return maps, entropy.mean(-1)


def _layer_maps(model: Llama, layer: int, call: AttentionCall, heads: list[int], form: DumpForm
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(maps, entropy, logit sums, logit counts) of one sample's call of `layer`: the dense weights when the map is
    stored full at a length of one tile or less, else tile by tile."""
    length = call.q.shape[-2]
    pe = model.layer_encoding(layer)
    if form.form == "full" and length <= DEFAULT_BLOCK:
        logits = dense_logits(pe, call)[0, heads].double().cpu()
        maps = dense_weights(pe, call)[0, heads].double().cpu()
        layer = _Layer(len(heads), length, form)
        layer.add(0, length, 0, length, maps, logits)
        return (*layer.finish(), layer.logit_sum, layer.logit_count)
    layer = _Layer(len(heads), length, form)
    for i0, i1, j0, j1, weights, scores in tile_weights(pe, call, model.args.attention_block or DEFAULT_BLOCK):
        layer.add(i0, i1, j0, j1, weights[0, heads].cpu(), scores[0, heads].cpu())
    return (*layer.finish(), layer.logit_sum, layer.logit_count)


@torch.no_grad()
def dump_attention(model: Llama, tokens: torch.Tensor, cfg: DumpConfig, ids: DumpIds, out_dir: Path) -> list[Path]:
    """Write attention.parquet and logit_profile.parquet for probe tokens (samples, L); return their paths."""
    a = model.args
    layers, heads, length = dump_selection(cfg, a.n_layers, a.n_heads, tokens.shape[1])
    check_budget(cfg, a.n_layers, a.n_heads, tokens.shape[1])
    form = dump_form(cfg, length)
    tokens = tokens[: cfg.samples, :length]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    captured: list[dict[int, AttentionCall]] = []
    try:  # one sample at a time: only its layers' queries and keys are held
        for i in range(tokens.shape[0]):
            capture: dict[int, AttentionCall] = {}
            model(tokens[i:i + 1].to(device), capture=capture)
            captured.append(capture)
    finally:
        model.train(was_training)
    out_dir.mkdir(parents=True, exist_ok=True)
    attn_path, prof_path = out_dir / "attention.parquet", out_dir / "logit_profile.parquet"
    tensor_type = pa.fixed_shape_tensor(pa.float16(), list(form.shape))
    meta = {b"hdrope.dump_schema": DUMP_SCHEMA_VERSION.encode(), b"hdrope.dump_form": form.form.encode()}
    writer, profiles = None, []
    try:
        for layer in layers:
            # what the model's attention sees and does, score bias, CoPE's positions, FoX's gates and stick-breaking
            # included
            parts = [_layer_maps(model, layer, capture[layer], heads, form) for capture in captured]
            maps = torch.stack([p[0] for p in parts])  # (samples, heads, M, N)
            entropy = torch.stack([p[1] for p in parts]).reshape(-1).numpy()
            logit_sum, logit_count = sum(p[2] for p in parts), sum(p[3] for p in parts)
            profiles.append((logit_sum / logit_count.clamp(min=1)).numpy())
            n = maps.shape[0] * maps.shape[1]
            flat = maps.reshape(n, *form.shape)
            erank = effective_rank(flat).astype(np.float32) if form.form != "rows" else np.full(n, np.nan, np.float32)
            cols = {
                **_id_columns(ids, n),
                "sample": pa.array(np.repeat(np.arange(maps.shape[0]), len(heads)), pa.int32()),
                "layer": pa.array([layer] * n, pa.int32()),
                "head": pa.array(np.tile(np.asarray(heads), maps.shape[0]), pa.int32()),
                "seq_len": pa.array([length] * n, pa.int32()),
                **identity_arrays(ids.encoding, n),
                "form": pa.array([form.form] * n, pa.string()),
                "pool": pa.array([form.pool] * n, pa.int32()),
                "query_rows": pa.array([list(form.rows) if form.form == "rows" else None] * n, pa.list_(pa.int32())),
                "attn": pa.ExtensionArray.from_storage(
                    tensor_type,
                    pa.FixedSizeListArray.from_arrays(pa.array(flat.half().numpy().reshape(-1)),
                                                      form.shape[0] * form.shape[1]),
                ),
                "entropy": pa.array(entropy.astype(np.float32)),
                "erank": pa.array(erank, mask=np.isnan(erank)),
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
        **identity_arrays(ids.encoding, n),
        "logit_mean": pa.array([row.astype(np.float32) for p in profiles for row in p], pa.list_(pa.float32())),
    }
    pq.write_table(pa.table(prof_cols).replace_schema_metadata(meta), prof_path)
    return [attn_path, prof_path]

