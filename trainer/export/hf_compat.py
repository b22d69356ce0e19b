"""Mapping between this model and HF transformers' LlamaForCausalLM: config and weight names (HD-RoPE's fold is
in trainer.export.hf_export).

Both pair channel j with j + head_dim/2 (rotate-half), so a `rope` model maps onto HF Llama by
renaming weights: w1/w3/w2 are gate/up/down, attention_norm/ffn_norm are input/post-attention norms.
`hf_config_dict` is the LlamaConfig as plain JSON-able data (the export writes it without transformers);
`hf_config` builds the transformers object from it.
"""

from __future__ import annotations

from typing import Any

import torch

from hdrope.errors import UserError
from trainer.model.llama import Llama, ModelArgs
from trainer.model.position import POSITION_ENCODINGS

__all__ = ["hf_config", "hf_config_dict", "special_token_ids", "to_hf_state_dict"]


def special_token_ids(tok: Any) -> dict[str, int | None]:
    """bos/eos/pad token ids of a lab tokenizer (None where it has none), under HF's config keys."""
    return {f"{name}_token_id": getattr(tok, f"{name}_id", None) for name in ("bos", "eos", "pad")}


def hf_config_dict(a: ModelArgs, rope_parameters: dict[str, Any] | None = None,
                   token_ids: dict[str, int | None] | None = None) -> dict[str, Any]:
    """The keyword arguments of a transformers LlamaConfig with the same architecture: plain RoPE at pe.theta
    unless rope_parameters are given (an HD-RoPE fold's), special-token ids from `special_token_ids`."""
    return {
        "vocab_size": a.vocab_size,
        "hidden_size": a.dim,
        "intermediate_size": a.ffn_hidden,
        "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads,
        "num_key_value_heads": a.n_kv_heads,
        "head_dim": a.resolved_head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": a.norm_eps,
        "max_position_embeddings": a.max_seq_len,
        "initializer_range": a.init_std,
        "rope_parameters": rope_parameters or {"rope_type": "default", "rope_theta": float(a.pe.theta)},
        "tie_word_embeddings": a.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "use_cache": True,
        **(token_ids or {}),
    }


def hf_config(a: ModelArgs, **extra: Any):
    """A transformers LlamaConfig with the same architecture (needs an encoding whose HF rotary is plain unscaled
    RoPE on the same channels: rope, or hdrope at N = 2 with the identity basis)."""
    from transformers import LlamaConfig

    kind = POSITION_ENCODINGS.get(a.pe.kind)
    rot = kind.hf_rotary(a.pe, a.encoding_shape) if kind is not None and kind.hf_rotary is not None else None
    if rot is None or rot.rotation_dim != 2 or rot.basis != "identity" or rot.scaling:
        raise UserError(f"model.pe.kind={a.pe.kind!r}: only unscaled `rope` has an HF Llama equivalent")
    return LlamaConfig(**hf_config_dict(a), **extra)


_LAYER_NAMES = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def to_hf_state_dict(model: Llama) -> dict[str, torch.Tensor]:
    """Our weights under HF LlamaForCausalLM names (the encoding's own tensors left out)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name.startswith("pe."):  # the encoding's own tensors (STRING's basis): folded into q/k by the export
            continue
        if name == "tok_embeddings.weight":
            out["model.embed_tokens.weight"] = t
        elif name == "norm.weight":
            out["model.norm.weight"] = t
        elif name == "output.weight":
            out["lm_head.weight"] = t
        else:
            _, idx, rest = name.split(".", 2)
            module, _, leaf = rest.rpartition(".")
            out[f"model.layers.{idx}.{_LAYER_NAMES[module]}.{leaf}"] = t
    return out
