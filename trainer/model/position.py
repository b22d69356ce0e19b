"""The registry of position-encoding kinds for the compact Llama, chosen by `model.pe.kind`: the only list of kinds.

Each kind's module under `trainer.model.encodings` (one per name in `KIND_MODULES` below) holds one
`EncodingKind`: its typed config, its builder, its identity row and identity keys, whether a config of it is
exactly RoPE, its dedup-canonical config, its problems (found without building), whether q·k depends only on
m - n, its exact Hugging Face Llama rotary (exportability), and its parameter and FLOP contributions.
`register_kind` adds one; everything else reads them here.

`encoding_identity(pe)` is the one place that says which encoding a run used: every artifact
(results table, passkey table, attention dumps), the plan, MLflow run names, the report and the
notebooks write or read its columns. `dedup_pe(pe)` is the canonical config of the model's
equivalence class, from which the sweep plan derives its dedup key. Adding a baseline means adding
one module with its `KIND` and its name in `KIND_MODULES` below.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from hdrope import HDRotary
from hdrope.errors import UserError
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.kind import EncodingKind, LengthField
from trainer.model.encodings.rotary import PEConfig
from trainer.model.identity import IDENTITY_COLUMNS

__all__ = [
    "IDENTITY_COLUMNS",
    "POSITION_ENCODINGS",
    "EncodingKind",
    "EncodingShape",
    "PEConfig",
    "PositionEncoding",
    "attention_heads",
    "build_position_encoding",
    "check_exportable",
    "dedup_pe",
    "encoding_class",
    "encoding_flops",
    "encoding_frequencies",
    "encoding_identity",
    "encoding_lengths",
    "encoding_params",
    "encoding_problems",
    "encoding_scores",
    "hf_rotary",
    "identity_is_rope",
    "identity_keys",
    "pe_config_class",
    "register_kind",
    "step_cost_key",
]

PositionEncoding = PositionModule  # what the model calls: tables / rotate / the tile hooks its attention reads

# Building an encoding fills its cos/sin tables for model.max_seq_len positions: float64 phases, then float32
# cos and sin of head_dim channels, about TABLE_BYTES_PER_VALUE bytes per position and channel at the peak.
TABLE_BYTES_PER_VALUE = 28
TABLE_LIMIT_BYTES = 4 * 2**30
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed and numpy take any seed in [0, SEED_MAX]

POSITION_ENCODINGS: dict[str, EncodingKind] = {}


def register_kind(kind: EncodingKind) -> EncodingKind:
    """Add a kind to the registry (UserError if its name is taken); remove it with POSITION_ENCODINGS.pop(name)."""
    if kind.name in POSITION_ENCODINGS:
        raise UserError(f"model.pe.kind={kind.name!r} is registered already")
    POSITION_ENCODINGS[kind.name] = kind
    return kind


# The lab's kinds: the modules under trainer/model/encodings/ that hold one KIND each. Adding a kind is its module
# and its name here.
KIND_MODULES = ("rope", "hdrope", "nope", "partial_rope", "p_rope", "xpos", "alibi", "fope", "rpe3d", "learned_basis",
                "fire", "kerple", "t5_bias", "cope", "liere", "comrope", "string", "rope_mixed", "pope", "hope", "fox",
                "stickbreaking", "grape_m", "grape_a", "dape", "path", "rope_pp", "selective_rope", "tape")

for _name in KIND_MODULES:
    register_kind(importlib.import_module(f"trainer.model.encodings.{_name}").KIND)


def identity_keys() -> tuple[str, ...]:
    """Config keys the label is a function of (every registered kind's, and the kind): a report never needs them
    as extra grouping columns."""
    keys = dict.fromkeys(["kind", *(k for kind in POSITION_ENCODINGS.values() for k in kind.identity_keys)])
    # a label also says what each layer takes and which layers see a window (trainer.model.pe_layers.stack_identity)
    # and which encodings a schedule switches to (trainer.model.pe_schedule.run_identity)
    return (*(f"model.pe.{k}" for k in keys), "model.pe_layers", "model.window", "model.layer_pattern",
            "train.pe_schedule")


def identity_is_rope(row: Mapping[str, Any]) -> bool:
    """Whether an identity row (pe_kind, pe_label, rotation_dim, ...) is exactly RoPE, as its kind says
    (False for a kind no longer registered)."""
    kind = POSITION_ENCODINGS.get(str(row["pe_kind"]))
    return bool(kind is not None and kind.is_rope(row))


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
    seed = _seed_problem(pe)
    problems = [p for p in (seed, _table_problem(shape) if kind.tables else None) if p]
    return problems + ([] if seed else kind.problems(pe, shape))  # a kind's own checks may use the seed


def _kind(kind: str) -> EncodingKind:
    if kind not in POSITION_ENCODINGS:
        raise UserError(f"model.pe.kind={kind!r} is unknown; choose one of {sorted(POSITION_ENCODINGS)}")
    return POSITION_ENCODINGS[kind]


def pe_config_class(kind: str) -> type:
    """The typed config dataclass of `kind`; UserError naming model.pe.kind and the choices."""
    return _kind(kind).config


def _checked(pe: Any) -> EncodingKind:
    kind = _kind(pe.kind)
    if not isinstance(pe, kind.config):
        raise UserError(f"model.pe.kind={pe.kind!r} takes a {kind.config.__name__}, got a {type(pe).__name__}; "
                        "assemble configs with trainer.presets.merge_config")
    return kind


def encoding_identity(pe: Any) -> dict[str, Any]:
    """Which encoding a run used, as the columns of IDENTITY_COLUMNS (pe_kind, pe_label, rotation_dim, ...)."""
    return _checked(pe).identity(pe)


def dedup_pe(pe: Any) -> Any:
    """The canonical config of pe's equivalence class: settings that cannot change the model fixed."""
    return copy.deepcopy(_checked(pe).dedup(pe))


def check_exportable(pe: Any) -> None:
    """UserError, saying why, unless the kind has an exact Hugging Face Llama equivalent (rope, hdrope, string)."""
    kind = _checked(pe)
    if not kind.exportable:
        exportable = sorted(k for k, v in POSITION_ENCODINGS.items() if v.exportable)
        raise UserError(f"model.pe.kind={pe.kind!r} is not exportable to HF Llama: {kind.no_export} (only "
                        f"{', '.join(exportable)}, whose rotation folds into W_q/W_k, are)")


def hf_rotary(pe: Any, shape: EncodingShape) -> HDRotary:
    """The hdrope rotary that is pe's exact Hugging Face Llama equivalent; UserError unless exportable."""
    check_exportable(pe)
    return _checked(pe).hf_rotary(pe, shape)


def encoding_params(pe: Any, shape: EncodingShape) -> int:
    """Trainable parameters of pe's module for a model of `shape`, counted without building it."""
    return int(_checked(pe).params(pe, shape))


def encoding_flops(pe: Any, shape: EncodingShape) -> float:
    """Matmul FLOPs per token of pe's transform over every layer, forward plus backward."""
    return float(_checked(pe).flops(pe, shape))


def encoding_frequencies(pe: Any, shape: EncodingShape) -> np.ndarray | None:
    """pe's distinct rotation frequencies (radians per token) for a model of `shape`, as its kind declares them;
    None for a kind without a frequency ladder (bias kinds, NoPE, the kinds with their own frequency sets)."""
    kind = _checked(pe)
    return None if kind.frequencies is None else np.asarray(kind.frequencies(pe, shape), dtype=np.float64)


def encoding_lengths(pe: Any, shape: EncodingShape) -> list[tuple[LengthField, float]]:
    """pe's config fields that are lengths in tokens, each with the length it sets for a model of `shape` (fields
    that are off left out), as its kind declares them."""
    found = [(f, f.value(pe, shape)) for f in _checked(pe).lengths]
    return [(f, float(v)) for f, v in found if v is not None]


def attention_heads(pe: Any, n_heads: int, n_kv_heads: int) -> tuple[int, int, int]:
    """(query heads projected, KV heads projected, attention heads) of a layer taking pe in a model of n_heads
    query and n_kv_heads KV heads: as configured, unless the kind says otherwise (RoPE++)."""
    kind = _checked(pe)
    return (n_heads, n_kv_heads, n_heads) if kind.heads is None else kind.heads(pe, n_heads, n_kv_heads)


def step_cost_key(pe: Any) -> dict[str, Any]:
    """The settings of pe that change the training step time: the kind and its cost keys."""
    return {"kind": pe.kind, **{k: getattr(pe, k) for k in _checked(pe).cost_keys}}


def encoding_class(pe: Any, shape: EncodingShape) -> type[PositionModule]:
    """The module class pe builds (what its attention scores are, `scores_kind`, and whether it widens q and k),
    from a build at a short length; UserError for a config that does not build."""
    small = EncodingShape(shape.head_dim, shape.n_heads, shape.n_kv_heads, shape.n_layers, min(shape.max_seq_len, 64),
                          shape.model_dim)
    return type(build_position_encoding(pe, small))


def encoding_scores(pe: Any, shape: EncodingShape) -> str:
    """What pe's attention scores are (`PositionModule.scores_kind`: plain, bias, flex-bias or own)."""
    return encoding_class(pe, shape).scores_kind()


def build_position_encoding(cfg: Any, shape: EncodingShape | int) -> PositionModule:
    """Instantiate the configured encoding module; an int shape is a head_dim with one head and layer.

    UserError names the field and the choices (every problem `encoding_problems` finds, before building)."""
    if isinstance(shape, int):
        shape = EncodingShape(shape, 1, 1, 1, 1)
    problems = encoding_problems(cfg, shape)
    if problems:
        raise UserError("; ".join(problems))
    return _checked(cfg).build(cfg, shape)
