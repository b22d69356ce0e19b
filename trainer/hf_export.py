"""Exact export of a trained model to a standard Hugging Face `LlamaForCausalLM` directory.

HD-RoPE with a fixed basis is RoPE on re-parameterised queries and keys (NOTES §2): with B from
`hdrope.fold.fold_matrix`, R_Q(m) = B·R_I(m)·Bᵀ, where R_I is the identity-basis rotation (plain
2×2 pairs). A channel permutation P puts those pairs where HF's rotate-half expects them (pair k =
channels k and k + d/2), so each head's W_q and W_k rows become P·Bᵀ·W, and attention scores are
unchanged at every position. The pairs' frequencies (several pairs share one at N > 2, scaled or not)
are written as HF `longrope` per-frequency factors (short and long lists equal, the attention factor
explicit); unscaled N = 2 with the identity basis is plain `default` RoPE. Inference then runs at
RoPE's cost in any HF-compatible engine. Encodings without a rotary form (NoPE) and sequence-length
dependent scalings (dynamic, longrope) are refused with a clear error.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hdrope import HDRotary
from hdrope.errors import UserError
from hdrope.fold import fold_matrix, identity_twin
from hdrope.scaling import is_seq_dependent
from trainer.config import RunConfig, config_hash
from trainer.hf_compat import hf_config, to_hf_state_dict
from trainer.model import Llama, ModelArgs
from trainer.trained import load_trained

__all__ = ["export_checkpoint", "export_model", "hf_rotary_map"]


def _rotary(a: ModelArgs) -> HDRotary:
    pe = a.pe
    if pe.kind not in ("rope", "hdrope"):
        raise UserError(f"model.pe.kind={pe.kind!r} is not exportable to HF Llama (only rope and hdrope, whose "
                        "rotation folds into W_q/W_k, are)")
    n, basis = (2, "identity") if pe.kind == "rope" else (pe.rotation_dim, pe.basis)
    return HDRotary(a.resolved_head_dim, n, pe.theta, basis, pe.seed, pe.scaling, max_position=a.max_seq_len)


def _pairs(generator: np.ndarray) -> list[tuple[int, int]]:
    """(a, b) channel pairs of a plain pair generator: (R x)_a = x_a·cos − x_b·sin, (R x)_b = x_b·cos + x_a·sin."""
    b_of = {int(a): int(np.flatnonzero(generator[:, a] > 0.5)[0]) for a in range(generator.shape[0])
            if (generator[:, a] > 0.5).any()}
    return [(a, b) for a, b in b_of.items() if generator[a, b] < -0.5]


def hf_rotary_map(a: ModelArgs) -> tuple[np.ndarray, dict[str, Any]]:
    """(M, rope_parameters): HF's q/k of a head are M·(ours), M = P·Bᵀ (head_dim²), with HF rope parameters
    reproducing the pair frequencies exactly."""
    rot = _rotary(a)
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
    theta = float(a.pe.theta)
    hf_base = theta ** (-np.arange(0, d, 2) / d)
    if sf.attention_factor == 1.0 and np.array_equal(freqs, hf_base):  # RoPE itself (N = 2, unscaled)
        return m, {"rope_type": "default", "rope_theta": theta}
    factors = (hf_base / freqs).tolist()  # HF longrope: inv_freq_k = hf_base_k / factor_k
    return m, {"rope_type": "longrope", "rope_theta": theta, "short_factor": factors, "long_factor": factors,
               "original_max_position_embeddings": a.max_seq_len, "attention_factor": float(sf.attention_factor)}


def export_model(cfg: RunConfig, model: Llama, out_dir: Path) -> Path:
    """Write config.json + model.safetensors of an HF LlamaForCausalLM computing exactly what `model` computes
    (and the run's tokenizer.json when it has one); returns out_dir."""
    from dataclasses import replace

    from transformers import LlamaForCausalLM

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir}: not empty; export into a new or empty directory")
    a = cfg.model
    m, rope_parameters = hf_rotary_map(a)
    config = hf_config(replace(a, pe=replace(a.pe, kind="rope", scaling=None)))
    config.rope_parameters = rope_parameters
    hd = a.resolved_head_dim
    state = to_hf_state_dict(model)
    mt = torch.from_numpy(m)
    for name, w in state.items():
        if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = w.double().reshape(-1, hd, w.shape[-1])
            state[name] = torch.einsum("ij,hjk->hik", mt, heads).reshape(w.shape).to(w.dtype)
    hf = LlamaForCausalLM(config)
    hf.load_state_dict(state, strict=True)
    hf.save_pretrained(out_dir)
    tok = Path(cfg.data.tokenizer)
    if tok.suffix == ".json" and tok.is_file():
        shutil.copy(tok, out_dir / "tokenizer.json")
    note = "ids 0-255 are UTF-8 bytes, 256 <bos>, 257 <eos>, 258 <pad>" if cfg.data.tokenizer == "bytes" else ""
    (out_dir / "hdrope_export.json").write_text(json.dumps({"config_hash": config_hash(cfg), "tokenizer":
                                                            cfg.data.tokenizer, "note": note}, indent=1))
    return out_dir


def export_checkpoint(checkpoint: Path, out_dir: Path) -> Path:
    """Export a run's checkpoint (weights checksum-verified) as an HF LlamaForCausalLM directory."""
    trained = load_trained(checkpoint)
    return export_model(trained.cfg, trained.model, out_dir)
