"""Exact export of a trained model to a standard Hugging Face `LlamaForCausalLM` directory.

HD-RoPE with a fixed basis is RoPE on re-parameterised queries and keys (NOTES §2): with B from
`hdrope.fold.fold_matrix`, R_Q(m) = B·R_I(m)·Bᵀ, where R_I is the identity-basis rotation (plain
2×2 pairs). A channel permutation P puts those pairs where HF's rotate-half expects them (pair k =
channels k and k + d/2), so each head's W_q and W_k rows become P·Bᵀ·W, and attention scores are
unchanged at every position. A kind with a basis of its own (Cayley-STRING's learned C per layer and head,
`PositionModule.fold`) is R in that basis, so its rows become P·Bᵀ·C_hᵀ·W. The pairs' frequencies (several
pairs share one at N > 2, scaled or not) are written as HF `longrope` per-frequency factors (short and long
lists equal, the attention factor explicit); unscaled N = 2 with the identity basis is plain `default` RoPE.
Inference then runs at RoPE's cost in any HF-compatible engine. Kinds without a rotary form and sequence-length
dependent scalings (dynamic, longrope) are refused with a clear error.

A hybrid stack (`model.pe_layers`) or a model with sliding windows exports as `SmolLM3ForCausalLM`, whose weights
are Llama's: NoPE layers as its `no_rope_layers`, windowed layers as `layer_types` "sliding_attention" with
`sliding_window`, and the rotary layers through the one rotary HF holds per model (they must share it: a stack that
mixes, say, RoPE and 4D Paley layers is refused, naming the layers).

The directory is written as plain files, without transformers: config.json and generation_config.json
(the run tokenizer's bos/eos/pad ids), model.safetensors, the run's tokenizer.json when it has one and
hdrope_export.json; they are written into a temporary sibling and renamed into place whole.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from hdrope.errors import UserError
from hdrope.fold import fold_matrix, identity_twin
from hdrope.scaling import is_seq_dependent
from trainer.config import RunConfig, config_hash
from trainer.export.hf_compat import hf_config_dict, special_token_ids, to_hf_state_dict
from trainer.files.dir_lock import refuse_non_directory
from trainer.model.llama import Llama, ModelArgs
from trainer.model.pe_layers import stack_groups
from trainer.model.position import POSITION_ENCODINGS, hf_rotary
from trainer.run.trained import load_trained, run_tokenizer

__all__ = ["HFStack", "export_checkpoint", "export_model", "hf_architecture", "hf_rotary_map", "hf_stack"]


def _pairs(generator: np.ndarray) -> list[tuple[int, int]]:
    """(a, b) channel pairs of a plain pair generator: (R x)_a = x_a·cos − x_b·sin, (R x)_b = x_b·cos + x_a·sin."""
    b_of = {int(a): int(np.flatnonzero(generator[:, a] > 0.5)[0]) for a in range(generator.shape[0])
            if (generator[:, a] > 0.5).any()}
    return [(a, b) for a, b in b_of.items() if generator[a, b] < -0.5]


def hf_rotary_map(a: ModelArgs, pe: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """(M, rope_parameters): HF's q/k of a head are M·(ours), M = P·Bᵀ (head_dim²), with HF rope parameters
    reproducing the pair frequencies exactly; of `pe` (default: model.pe) in a model of `a`'s shape."""
    pe = a.pe if pe is None else pe
    rot = hf_rotary(pe, a.encoding_shape)  # the kind's exact HF rotary; UserError unless exportable
    if is_seq_dependent(rot.scaling):
        raise UserError(f"model.pe.scaling={rot.scaling['rope_type']!r} depends on the sequence length: not "
                        "exportable with per-frequency factors; export an unscaled or linear/yarn/llama3 model")
    d = rot.head_dim
    twin = identity_twin(rot)
    pairs = _pairs(twin.plan.generator)
    sf = rot.scaled_frequencies()
    channel_freq = sf.freqs[rot.layout.channel_frequency_index()]
    pairs.sort(key=lambda p: -channel_freq[p[0]])  # HF's order: fastest first
    perm = np.zeros((d, d))
    for k, (ca, cb) in enumerate(pairs):
        perm[k, ca] = perm[k + d // 2, cb] = 1.0
    m = perm @ fold_matrix(rot).T
    freqs = np.array([channel_freq[ca] for ca, _ in pairs])
    theta = float(pe.theta)
    hf_base = theta ** (-np.arange(0, d, 2) / d)
    if sf.attention_factor == 1.0 and np.array_equal(freqs, hf_base):  # RoPE itself (N = 2, unscaled)
        return m, {"rope_type": "default", "rope_theta": theta}
    factors = (hf_base / freqs).tolist()  # HF longrope: inv_freq_k = hf_base_k / factor_k
    return m, {"rope_type": "longrope", "rope_theta": theta, "short_factor": factors, "long_factor": factors,
               "original_max_position_embeddings": a.max_seq_len, "attention_factor": float(sf.attention_factor)}


@dataclass(frozen=True)
class HFStack:
    """How a model's layers map onto HF: the one rotary its position-carrying layers share (M and rope_parameters,
    `hf_rotary_map`), which layers carry no position (HF's `no_rope_layers`: 0) and each layer's sliding window."""

    m: np.ndarray
    rope_parameters: dict[str, Any]
    no_rope: tuple[int, ...]
    windows: tuple[int, ...]

    @property
    def plain(self) -> bool:
        """Whether a LlamaForCausalLM holds it: every layer rotary, none windowed."""
        return not self.no_rope and not any(self.windows)


def hf_stack(a: ModelArgs) -> HFStack:
    """The model's layers as HF holds them (`HFStack`); UserError naming the layers and the reason where HF cannot:
    a layer of a kind without an exact HF rotary, or rotary layers that need two rotaries (HF has one per model)."""
    groups = stack_groups(a)
    hybrid = len(groups) > 1
    rotary = [g for g in groups if not POSITION_ENCODINGS[g.pe.kind].positionless]
    maps = []
    for g in rotary:
        try:
            maps.append(hf_rotary_map(a, g.pe))
        except UserError as err:
            if not hybrid:
                raise
            raise UserError(f"model.pe_layers: layers {', '.join(map(str, g.layers))} ({g.pe.kind}): {err}; export "
                            "a stack whose layers are NoPE or share one exportable rotary") from None
    for g, (m, params) in zip(rotary[1:], maps[1:], strict=True):
        if params != maps[0][1] or not np.array_equal(m, maps[0][0]):
            first = rotary[0]
            raise UserError(f"model.pe_layers: layers {', '.join(map(str, g.layers))} ({g.pe.kind}) and layers "
                            f"{', '.join(map(str, first.layers))} ({first.pe.kind}) need two different rotaries, and "
                            "HF holds one rotary for every layer of a model; export a stack whose rotary layers share "
                            "one encoding (the others NoPE)")
    m, params = maps[0] if maps else (np.eye(a.resolved_head_dim), {"rope_type": "default", "rope_theta": 10000.0})
    no_rope = tuple(sorted(i for g in groups if POSITION_ENCODINGS[g.pe.kind].positionless for i in g.layers))
    return HFStack(m, params, no_rope, tuple(a.layer_windows))


def hf_architecture(a: ModelArgs, stack: HFStack) -> dict[str, Any]:
    """The config.json keys that name the HF architecture and its per-layer choices: LlamaForCausalLM for a plain
    stack, else SmolLM3ForCausalLM (Llama's weights, with `no_rope_layers` and per-layer `layer_types`)."""
    if stack.plain:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    window = max(stack.windows)
    return {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3",
            "no_rope_layers": [int(i not in stack.no_rope) for i in range(a.n_layers)],
            "use_sliding_window": bool(window), "sliding_window": window or None,
            "layer_types": ["sliding_attention" if w else "full_attention" for w in stack.windows]}


def _check_out_dir(out_dir: Path) -> None:
    """UserError unless OUT_DIR is missing or an empty directory (not a file, not under one)."""
    refuse_non_directory(out_dir, "OUT_DIR")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir}: not empty; export into a new or empty directory")


def _head_maps(model: Llama, m: np.ndarray, layer: int, heads: int) -> torch.Tensor:
    """(heads, d, d): m·B_hᵀ per head of q or k at layer, B the encoding's own basis there (`fold`; I if none)."""
    mt = torch.from_numpy(m)
    with torch.no_grad():
        basis = model.pe.fold(layer)
    if basis is None:
        return mt.expand(heads, -1, -1)
    basis = basis.detach().cpu().double()
    return mt @ basis.repeat_interleave(heads // basis.shape[0], dim=0).transpose(-1, -2)


def _hf_state(model: Llama, m: np.ndarray, head_dim: int, tied: bool) -> dict[str, torch.Tensor]:
    """Our weights under HF names with each head's q/k rows mapped by m and the encoding's basis (`fold`), lm_head
    left out when tied, as HF saves."""
    state = to_hf_state_dict(model)
    for name, w in state.items():
        if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = w.double().reshape(-1, head_dim, w.shape[-1])
            maps = _head_maps(model, m, int(name.split(".")[2]), heads.shape[0])
            state[name] = torch.einsum("hij,hjk->hik", maps, heads).reshape(w.shape).to(w.dtype)
    if tied:
        state.pop("lm_head.weight")
    return {name: w.detach().cpu().contiguous() for name, w in state.items()}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def export_model(cfg: RunConfig, model: Llama, out_dir: Path, tok: Any = None) -> Path:
    """Write an HF LlamaForCausalLM directory computing exactly what `model` computes, with the special-token ids
    of `tok` (default: the run's tokenizer) and its tokenizer.json when it has one; returns out_dir."""
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    a = cfg.model
    stack = hf_stack(a)
    tok = tok if tok is not None else run_tokenizer(cfg)
    ids = special_token_ids(tok)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    config = {**hf_architecture(a, stack), "dtype": dtype, **hf_config_dict(a, stack.rope_parameters, ids)}
    state = _hf_state(model, stack.m, a.resolved_head_dim, a.tie_embeddings)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()  # with the umask's mode, as out_dir would have
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", {**{k: v for k, v in ids.items() if v is not None},
                                                      "use_cache": True})
        source = getattr(tok, "path", None)
        if source is not None:
            shutil.copyfile(source, tmp / "tokenizer.json")
        note = "ids 0-255 are UTF-8 bytes, 256 <bos>, 257 <eos>, 258 <pad>" if cfg.data.tokenizer == "bytes" else ""
        _write_json(tmp / "hdrope_export.json", {"config_hash": config_hash(cfg), "tokenizer": cfg.data.tokenizer,
                                                 "note": note})
        os.replace(tmp, out_dir)  # out_dir is missing or empty
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def export_checkpoint(checkpoint: Path, out_dir: Path) -> Path:
    """Export a run's checkpoint (weights checksum-verified, config checked against the checkpoint's hash) as an
    HF LlamaForCausalLM directory with the run's tokenizer."""
    _check_out_dir(Path(out_dir))  # before loading anything
    trained = load_trained(checkpoint)
    return export_model(trained.cfg, trained.model, out_dir, trained.tok)
