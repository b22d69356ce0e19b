"""What one position-encoding kind says about itself (`EncodingKind`), and the helpers its module fills it with.

Each kind's module under `trainer.model.encodings` holds its typed config, its builder and every fact
below in one `KIND`; `trainer.model.position` registers them, and nothing else names a kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hdrope import HDRotary
from hdrope.errors import UserError
from hdrope.frequencies import block_layout
from trainer.model.encodings.base import EncodingShape, PositionModule

__all__ = ["EncodingKind", "LengthField", "identity_row", "ladder_frequencies", "no_problems", "pct", "problems_of",
           "scaling_text"]


def no_problems(pe: Any, shape: EncodingShape) -> list[str]:
    """A kind whose every config builds."""
    return []


def _none(pe: Any, shape: EncodingShape) -> int:
    return 0


def _as_is(pe: Any) -> Any:
    return pe


@dataclass(frozen=True)
class LengthField:
    """A config field of a kind that is a length in tokens, and what the kind does at positions past it.

    `value(pe, shape)` is the length the built module uses (a default such as 0 resolved to the model's), or None
    when the field is off; `fix` says how to bring it inside the evaluated lengths."""

    key: str  # the field under model.pe., as a spec sets it
    meaning: str  # what happens past the length, e.g. "FIRE's progressive interpolation starts past it"
    value: Callable[[Any, EncodingShape], float | None]
    fix: str


def ladder_frequencies(theta: float, head_dim: int, rotation_dim: int) -> np.ndarray:
    """The distinct angular frequencies (radians per token) of HD-RoPE's ladder at (head_dim, rotation_dim):
    theta^(-e) for each exponent of `hdrope.frequencies.block_layout` (RoPE at rotation_dim 2)."""
    return float(theta) ** -block_layout(head_dim, rotation_dim).exponents()


@dataclass(frozen=True)
class EncodingKind:
    """One encoding kind: its config class, builder and every fact the lab reads about it."""

    name: str  # model.pe.kind
    config: type  # the typed config dataclass (`kind` its first field)
    build: Callable[[Any, EncodingShape], PositionModule]
    identity: Callable[[Any], dict[str, Any]]  # the run's IDENTITY_COLUMNS row (see `identity_row`)
    identity_keys: tuple[str, ...]  # config fields (under model.pe.) the label is a function of
    is_rope: Callable[[Mapping[str, Any]], bool]  # an identity row of this kind is exactly RoPE (what dedup says)
    # q'·k' (plus any score bias) depends only on m - n: for every config, or as a config says (`invariant`)
    translation_invariant: bool | Callable[[Any], bool]
    dedup: Callable[[Any], Any] = _as_is  # the canonical config of the model's equivalence class
    problems: Callable[[Any, EncodingShape], list[str]] = no_problems  # every reason `build` would refuse, unbuilt
    tables: bool = True  # builds cos/sin tables of max_seq_len positions (checked against the table limit)
    hf_rotary: Callable[[Any, EncodingShape], HDRotary] | None = None  # its exact HF Llama rotary; None: none
    no_export: str = "it has no exact rotary equivalent there"  # why not exportable (when hf_rotary is None)
    params: Callable[[Any, EncodingShape], int] = _none  # trainable parameters of the built module
    flops: Callable[[Any, EncodingShape], float] = _none  # matmul FLOPs per token of its transform, fwd + bwd
    cost_keys: tuple[str, ...] = ()  # config fields besides the kind that change the training step time
    # its distinct rotation frequencies (radians per token) for a model of that shape; None: no frequency ladder
    frequencies: Callable[[Any, EncodingShape], np.ndarray] | None = None
    lengths: tuple[LengthField, ...] = ()  # its config fields that are lengths in tokens (the planner checks them)
    positionless: bool = False  # its attention sees no position at all (NoPE): HF holds it as a no-RoPE layer
    # (query heads projected, KV heads projected, attention heads) of a layer from model.n_heads and n_kv_heads;
    # None: as configured, one attention head per query head (RoPE++ doubles them, or halves the projections)
    heads: Callable[[Any, int, int], tuple[int, int, int]] | None = None
    whole_model: str = ""  # why the kind must take every layer of its model (TAPE's stream); "": it can share one

    def invariant(self, pe: Any) -> bool:
        """Whether a config of this kind is translation-invariant: its logits depend only on m - n."""
        claim = self.translation_invariant
        return bool(claim(pe) if callable(claim) else claim)

    @property
    def exportable(self) -> bool:
        """Whether the kind has an exact Hugging Face Llama equivalent."""
        return self.hf_rotary is not None


def scaling_text(scaling: Mapping[str, Any] | None) -> str:
    """The scaling identity column: sorted JSON, or 'none'."""
    return json.dumps(dict(scaling), sort_keys=True, default=str) if scaling else "none"


def identity_row(kind: str, label: str, rotation_dim: int, basis: str, seed: int | None, theta: float | None,
                 scaling: str = "none") -> dict[str, Any]:
    """An identity row (the columns of `trainer.model.position.IDENTITY_COLUMNS`)."""
    return {"pe_kind": kind, "pe_label": label, "rotation_dim": rotation_dim, "basis": basis, "basis_seed": seed,
            "theta": None if theta is None else float(theta), "scaling": scaling}


def pct(x: float) -> str:
    """A fraction as a label percentage, e.g. 0.25 -> '25%'."""
    return f"{100 * float(x):g}%"


def problems_of(kind: str, check: Callable[[], object]) -> list[str]:
    """[] when check() passes, else its UserError as one problem, named under model.pe (kind) unless it names its
    model.pe key already."""
    try:
        check()
    except UserError as err:
        text = str(err)
        return [text if text.startswith("model.pe.") else f"model.pe ({kind}): {text}"]
    return []
