"""Registry of position encodings for the compact Llama, chosen by `model.pe.kind`.

Each registry entry (`EncodingKind`) says how to build the encoding (an `nn.Module` registered in the
model, see `trainer.model.encodings`), which typed config it takes (`trainer.model.encodings.configs`), what the
run's encoding identity is, which settings provably cannot change the model (the dedup key), whether
q·k depends only on m - n (translation invariance, property-tested), and whether it has an exact
Hugging Face Llama equivalent.

`encoding_identity(pe)` is the one place that says which encoding a run used: every artifact
(results table, passkey table, attention dumps), the plan, MLflow run names, the report and the
notebooks write or read its columns. `dedup_pe(pe)` is the canonical config of the model's
equivalence class, from which the sweep plan derives its dedup key. Adding a baseline means adding
one config class and one registry entry.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hdrope import HDRotary
from hdrope.errors import UserError
from trainer.model.encodings.alibi import ALiBi
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.configs import (
    ALiBiConfig,
    AnyPEConfig,
    FoPEConfig,
    LearnedBasisConfig,
    PartialRoPEConfig,
    PEConfig,
    PRoPEConfig,
    RPE3DConfig,
    XPosConfig,
)
from trainer.model.encodings.fope import FoPE, fope_frequencies
from trainer.model.encodings.learned import LearnedBasis
from trainer.model.encodings.rotary import RPE3D, HDRotaryEncoding, NoPE, XPos, p_rope, partial_rope

__all__ = [
    "IDENTITY_COLUMNS",
    "IDENTITY_KEYS",
    "POSITION_ENCODINGS",
    "EncodingKind",
    "EncodingShape",
    "PEConfig",
    "PositionEncoding",
    "build_position_encoding",
    "check_exportable",
    "dedup_pe",
    "encoding_identity",
    "encoding_problems",
    "pe_config_class",
]

PositionEncoding = PositionModule  # what the model calls: tables / rotate / score_bias

# Building an encoding fills its cos/sin tables for model.max_seq_len positions: float64 phases, then float32
# cos and sin of head_dim channels, about TABLE_BYTES_PER_VALUE bytes per position and channel at the peak.
TABLE_BYTES_PER_VALUE = 28
TABLE_LIMIT_BYTES = 4 * 2**30
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed and numpy take any seed in [0, SEED_MAX]
_MAX_INDEX = 2**31 - 1


def _rope(cfg: PEConfig, s: EncodingShape) -> PositionModule:
    rot = HDRotary(s.head_dim, 2, cfg.theta, basis="identity", scaling=cfg.scaling, fused=cfg.fused,
                   max_position=s.max_seq_len)  # fills the scaling keys HF takes from the model config
    return HDRotaryEncoding(rot, s.max_seq_len)


def _hdrope(cfg: PEConfig, s: EncodingShape) -> PositionModule:
    rot = HDRotary(s.head_dim, cfg.rotation_dim, cfg.theta, cfg.basis, cfg.seed, cfg.scaling, fused=cfg.fused,
                   max_position=s.max_seq_len)
    return HDRotaryEncoding(rot, s.max_seq_len)


def _scaling_text(scaling: dict[str, Any] | None) -> str:
    return json.dumps(dict(scaling), sort_keys=True, default=str) if scaling else "none"


def _row(kind: str, label: str, rotation_dim: int, basis: str, seed: int | None, theta: float | None,
         scaling: str = "none") -> dict[str, Any]:
    return {"pe_kind": kind, "pe_label": label, "rotation_dim": rotation_dim, "basis": basis, "basis_seed": seed,
            "theta": None if theta is None else float(theta), "scaling": scaling}


def _rope_identity(pe: PEConfig) -> dict[str, Any]:
    return _row("rope", "RoPE", 2, "identity", None, pe.theta, _scaling_text(pe.scaling))


def _hdrope_identity(pe: PEConfig) -> dict[str, Any]:
    n, basis = int(pe.rotation_dim), str(pe.basis)
    label = "2D RoPE" if n == 2 and basis == "identity" else f"{n}D {'Paley' if basis == 'paley' else basis}"
    return _row("hdrope", label, n, basis, int(pe.seed) if basis == "random" else None, pe.theta,
                _scaling_text(pe.scaling))


def _rope_dedup(pe: Any) -> PEConfig:
    # N = 2 with any basis is RoPE or its mirror image, the same model in distribution (NOTES §1)
    return PEConfig(kind="hdrope", rotation_dim=2, theta=pe.theta, basis="identity", seed=0,
                    scaling=getattr(pe, "scaling", None))


def _hdrope_dedup(pe: PEConfig) -> PEConfig:
    if pe.rotation_dim == 2:
        return _rope_dedup(pe)
    return PEConfig(kind="hdrope", rotation_dim=pe.rotation_dim, theta=pe.theta, basis=pe.basis,
                    seed=pe.seed if pe.basis == "random" else 0, scaling=pe.scaling)


def _as_is(pe: Any) -> Any:
    return pe


def _fraction_dedup(pe: Any) -> Any:
    # fraction 1 rotates every channel at RoPE's frequencies: exactly RoPE
    return _rope_dedup(pe) if float(pe.fraction) == 1.0 else pe


def _learned_dedup(pe: LearnedBasisConfig) -> LearnedBasisConfig:
    return pe if pe.init == "random" else LearnedBasisConfig(**{**vars(pe), "seed": 0})


def _pct(x: float) -> str:
    return f"{100 * float(x):g}%"


def _no_problems(pe: Any, shape: EncodingShape) -> list[str]:
    return []


def _hdrope_problems(pe: PEConfig, s: EncodingShape) -> list[str]:
    n = pe.rotation_dim
    if not isinstance(n, int) or isinstance(n, bool) or n < 2 or n % 2:
        return [f"model.pe.rotation_dim={n!r}: must be an even integer >= 2 (the paper uses 2, 4, 8, 32)"]
    if s.head_dim % n:
        return [f"model.pe.rotation_dim={n} does not divide head_dim={s.head_dim}; choose a rotation_dim that "
                f"divides {s.head_dim} (leftover channels are only for direct HDRotary use)"]
    return []


def _fope_problems(pe: FoPEConfig, s: EncodingShape) -> list[str]:
    # the Fourier series has min(kept frequencies, head_dim/4) outputs; it needs at least one of each
    problems = []
    if s.head_dim < 4:
        problems.append(f"head_dim={s.head_dim}: model.pe.kind='fope' needs head_dim >= 4 (its series has head_dim/4 "
                        "terms); raise model.dim (or model.head_dim) or lower model.n_heads")
    try:
        kept = fope_frequencies(pe.theta, s.head_dim, s.max_seq_len).numel()
    except UserError as err:  # a bad theta, named by check_theta
        return [*problems, str(err)]
    if s.head_dim >= 2 and not kept:  # the fastest frequency (1 rad/token) needs 2π positions to finish a period
        problems.append(f"model.max_seq_len={s.max_seq_len}: FoPE keeps only frequencies that finish a period within "
                        f"the train length (θ_i >= 2π/{s.max_seq_len}) and none does; use model.max_seq_len >= "
                        f"{math.ceil(2 * math.pi)}")
    return problems


def _rpe3d_problems(pe: RPE3DConfig, s: EncodingShape) -> list[str]:
    problems = []
    c = pe.chunk_size
    if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= _MAX_INDEX:
        problems.append(f"model.pe.chunk_size={c!r}: must be a positive integer <= {_MAX_INDEX} "
                        "(a chunk longer than every position is plain RoPE), e.g. 128")
    b = pe.phi_base
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 1:
        problems.append(f"model.pe.phi_base={b!r}: must be > 1 (φ_j = phi_base^-j), e.g. 10000")
    return problems


@dataclass(frozen=True)
class EncodingKind:
    """One registered encoding: config class, builder, identity row, dedup-canonical config and flags."""

    config: type
    build: Callable[[Any, EncodingShape], PositionModule]
    identity: Callable[[Any], dict[str, Any]]
    dedup: Callable[[Any], Any]
    translation_invariant: bool  # q'·k' (plus any score bias) depends only on m - n
    exportable: bool  # has an exact Hugging Face Llama equivalent (the export itself is issue 11 §5)
    problems: Callable[[Any, EncodingShape], list[str]] = _no_problems  # what `build` cannot take, found first
    tables: bool = True  # builds cos/sin tables of max_seq_len positions (checked against TABLE_LIMIT_BYTES)


POSITION_ENCODINGS: dict[str, EncodingKind] = {
    "rope": EncodingKind(PEConfig, _rope, _rope_identity, _rope_dedup, True, True),
    "hdrope": EncodingKind(PEConfig, _hdrope, _hdrope_identity, _hdrope_dedup, True, True, _hdrope_problems),
    "nope": EncodingKind(
        PEConfig, lambda c, s: NoPE(), lambda pe: _row("nope", "NoPE", 0, "none", None, None),
        lambda pe: PEConfig(kind="nope", rotation_dim=0, theta=0.0, basis="none", seed=0, scaling=None), True, False,
        tables=False),
    "partial_rope": EncodingKind(
        PartialRoPEConfig, lambda c, s: partial_rope(c.theta, c.fraction, s.head_dim, s.max_seq_len),
        lambda pe: _row("partial_rope", f"Partial RoPE {_pct(pe.fraction)}", 2, "identity", None, pe.theta),
        _fraction_dedup, True, False),
    "p_rope": EncodingKind(
        PRoPEConfig, lambda c, s: p_rope(c.theta, c.fraction, s.head_dim, s.max_seq_len),
        lambda pe: _row("p_rope", f"p-RoPE {_pct(pe.fraction)}", 2, "identity", None, pe.theta),
        _fraction_dedup, True, False),
    "xpos": EncodingKind(
        XPosConfig, lambda c, s: XPos(c.theta, c.gamma, c.scale_base, s.head_dim, s.max_seq_len),
        lambda pe: _row("xpos", "xPos", 2, "identity", None, pe.theta), _as_is, True, False),
    "alibi": EncodingKind(
        ALiBiConfig, lambda c, s: ALiBi(s.n_heads), lambda pe: _row("alibi", "ALiBi", 0, "none", None, None),
        _as_is, True, False, tables=False),
    "fope": EncodingKind(
        FoPEConfig, lambda c, s: FoPE(c.theta, c.sigma, c.learnable, c.seed, s),
        lambda pe: _row("fope", "FoPE" + (" learned" if pe.learnable else ""), 2, "fourier", int(pe.seed), pe.theta),
        _as_is, False, False, _fope_problems),
    "rpe3d": EncodingKind(
        RPE3DConfig, lambda c, s: RPE3D(c.theta, c.chunk_size, c.phi_base, s.head_dim, s.max_seq_len),
        lambda pe: _row("rpe3d", f"3D-RPE c{pe.chunk_size}", 2, "identity", None, pe.theta), _as_is, False, False,
        _rpe3d_problems),
    "learned_basis": EncodingKind(
        LearnedBasisConfig,
        lambda c, s: LearnedBasis(c.rotation_dim, c.theta, c.init, c.seed, c.per_head, c.parameterisation, s),
        lambda pe: _row("learned_basis", f"{pe.rotation_dim}D learned ({pe.init}{', per head' if pe.per_head else ''})",
                        int(pe.rotation_dim), f"learned-{pe.init}", int(pe.seed) if pe.init == "random" else None,
                        pe.theta),
        _learned_dedup, True, False),
}

# The identity row's columns and their types, as every artifact writes them (None: null).
IDENTITY_COLUMNS: dict[str, type] = {"pe_kind": str, "pe_label": str, "rotation_dim": int, "basis": str,
                                     "basis_seed": int, "theta": float, "scaling": str}
# Config keys the label is a function of: a report never needs them as extra grouping columns.
IDENTITY_KEYS = ("model.pe.kind", "model.pe.rotation_dim", "model.pe.basis")


def _seed_problem(pe: Any) -> str | None:
    seed = getattr(pe, "seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        return f"model.pe.seed={seed!r}: must be an integer in [0, 2**63 - 1], e.g. 0"
    return None


def _table_problem(shape: EncodingShape) -> str | None:
    size = TABLE_BYTES_PER_VALUE * shape.max_seq_len * shape.head_dim
    if size <= TABLE_LIMIT_BYTES:
        return None
    most = TABLE_LIMIT_BYTES // (TABLE_BYTES_PER_VALUE * shape.head_dim)
    return (f"model.max_seq_len={shape.max_seq_len}: the position tables of {shape.max_seq_len} positions × head_dim "
            f"{shape.head_dim} take about {size / 2**30:.3g} GiB to build, over the {TABLE_LIMIT_BYTES / 2**30:g} GiB "
            f"limit; use model.max_seq_len <= {most}")


def encoding_problems(pe: Any, shape: EncodingShape) -> list[str]:
    """Every problem of `pe` for a model of `shape` (each naming the field, the value and the fix), found
    without building anything: the kind, the seed, the kind's own limits and the size of its tables."""
    if not hasattr(pe, "kind"):
        return [f"model.pe={pe!r}: must be a mapping with a kind, e.g. model.pe.kind=rope; one of "
                f"{sorted(POSITION_ENCODINGS)}"]
    try:
        kind = _checked(pe)
    except UserError as err:
        return [str(err)]
    problems = [p for p in (_seed_problem(pe), _table_problem(shape) if kind.tables else None) if p]
    return problems + kind.problems(pe, shape)


def _kind(kind: str) -> EncodingKind:
    if kind not in POSITION_ENCODINGS:
        raise UserError(f"model.pe.kind={kind!r} is unknown; choose one of {sorted(POSITION_ENCODINGS)}")
    return POSITION_ENCODINGS[kind]


def pe_config_class(kind: str) -> type:
    """The typed config dataclass of `kind`; UserError naming model.pe.kind and the choices."""
    return _kind(kind).config


def _checked(pe: AnyPEConfig) -> EncodingKind:
    kind = _kind(pe.kind)
    if not isinstance(pe, kind.config):
        raise UserError(f"model.pe.kind={pe.kind!r} takes a {kind.config.__name__}, got a {type(pe).__name__}; "
                        "assemble configs with trainer.presets.merge_config")
    return kind


def encoding_identity(pe: AnyPEConfig) -> dict[str, Any]:
    """Which encoding a run used, as the columns of IDENTITY_COLUMNS (pe_kind, pe_label, rotation_dim, ...)."""
    return _checked(pe).identity(pe)


def dedup_pe(pe: AnyPEConfig) -> AnyPEConfig:
    """The canonical config of pe's equivalence class: settings that cannot change the model fixed."""
    return copy.deepcopy(_checked(pe).dedup(pe))


def check_exportable(pe: AnyPEConfig) -> None:
    """UserError unless the kind has an exact Hugging Face Llama equivalent (rope, hdrope)."""
    if not _checked(pe).exportable:
        raise UserError(f"model.pe.kind={pe.kind!r} is not exportable to Hugging Face Llama: it has no exact "
                        "rotary equivalent there; exportable kinds: "
                        f"{sorted(k for k, v in POSITION_ENCODINGS.items() if v.exportable)}")


def build_position_encoding(cfg: AnyPEConfig, shape: EncodingShape | int) -> PositionModule:
    """Instantiate the configured encoding module; an int shape is a head_dim with one head and layer.

    UserError names the field and the choices (every problem `encoding_problems` finds, before building)."""
    if isinstance(shape, int):
        shape = EncodingShape(shape, 1, 1, 1, 1)
    problems = encoding_problems(cfg, shape)
    if problems:
        raise UserError("; ".join(problems))
    kind = _checked(cfg)
    try:
        return kind.build(cfg, shape)
    except UserError as err:
        text = str(err)
        raise UserError(text if text.startswith("model.pe.") else f"model.pe ({cfg.kind}): {text}") from None
