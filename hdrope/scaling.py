"""Context-extension variants applied to HD-RoPE block frequencies, with HF `rope_scaling` keys.

A registry maps `rope_type` → (validator spec, frequency function), in the manner of HF
transformers' rope utilities, so a Llama `rope_scaling` dict carries over unchanged. Each
variant acts on the per-block frequencies θ_f (not on d/2 pair frequencies); where HF indexes
pairs by i, a block with θ_f = theta^(−e_f) is placed at i_f = e_f·d/2, which is exactly HF's
index when N = 2. `attention_factor` scales cos and sin, as in HF.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hdrope.errors import UserError

__all__ = ["SCALING_TYPES", "ScaledFrequencies", "is_seq_dependent", "scale_frequencies", "validate_scaling"]


@dataclass(frozen=True)
class ScaledFrequencies:
    """Frequencies after scaling and the factor applied to cos and sin."""

    freqs: np.ndarray  # float64, one per block/pair
    attention_factor: float


@dataclass(frozen=True)
class _Spec:
    required: tuple[str, ...]
    optional: tuple[str, ...]
    fn: Callable[..., ScaledFrequencies]
    seq_dependent: bool = False


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _linear(freqs, exps, d, base, p, seq_len) -> ScaledFrequencies:
    return ScaledFrequencies(freqs / p["factor"], 1.0)


def _dynamic(freqs, exps, d, base, p, seq_len) -> ScaledFrequencies:
    orig, factor = p["original_max_position_embeddings"], p["factor"]
    if seq_len is None or seq_len <= orig:
        return ScaledFrequencies(freqs, 1.0)
    new_base = base * ((factor * seq_len / orig) - (factor - 1)) ** (d / (d - 2))
    return ScaledFrequencies(new_base ** (-exps), 1.0)


def _yarn(freqs, exps, d, base, p, seq_len) -> ScaledFrequencies:
    factor, orig = p["factor"], p["original_max_position_embeddings"]
    beta_fast, beta_slow = p.get("beta_fast") or 32.0, p.get("beta_slow") or 1.0  # HF: null means the default
    af = p.get("attention_factor")
    if af is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            af = _yarn_mscale(factor, p["mscale"]) / _yarn_mscale(factor, p["mscale_all_dim"])
        else:
            af = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    pair_index = exps * d / 2
    ramp = np.clip((pair_index - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1 → extrapolate (keep θ), 0 → interpolate (θ / factor)
    return ScaledFrequencies(freqs / factor * (1 - keep) + freqs * keep, float(af))


def _longrope(freqs, exps, d, base, p, seq_len) -> ScaledFrequencies:
    orig = p["original_max_position_embeddings"]
    short, long_ = np.asarray(p["short_factor"], float), np.asarray(p["long_factor"], float)
    for key, arr in (("short_factor", short), ("long_factor", long_)):
        if arr.shape != freqs.shape:
            raise UserError(
                f"rope_scaling.{key} must list one factor per block frequency "
                f"({freqs.shape[0]} = head_dim/rotation_dim + leftover pairs), got {arr.shape[0]}"
            )
    af = p.get("attention_factor")
    if af is None:
        factor = p.get("factor", 1.0)
        af = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = long_ if (seq_len is not None and seq_len > orig) else short
    return ScaledFrequencies(freqs / ext, float(af))


def _llama3(freqs, exps, d, base, p, seq_len) -> ScaledFrequencies:
    factor, orig = p["factor"], p["original_max_position_embeddings"]
    lo, hi = p["low_freq_factor"], p["high_freq_factor"]
    low_wavelen, high_wavelen = orig / lo, orig / hi
    wavelen = 2 * math.pi / freqs
    out = np.where(wavelen > low_wavelen, freqs / factor, freqs)
    smooth = (orig / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return ScaledFrequencies(np.where(medium, smoothed, out), 1.0)


_ORIG = "original_max_position_embeddings"
SCALING_TYPES: dict[str, _Spec] = {
    "linear": _Spec(("factor",), (), _linear),
    "dynamic": _Spec(("factor", _ORIG), (), _dynamic, seq_dependent=True),
    "yarn": _Spec(
        ("factor", _ORIG),
        ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
        _yarn,
    ),
    "longrope": _Spec(("short_factor", "long_factor", _ORIG), ("attention_factor", "factor"), _longrope, True),
    "llama3": _Spec(("factor", _ORIG, "low_freq_factor", "high_freq_factor"), (), _llama3),
}
# Keys HF fills from the model config when a rope_parameters dict leaves them out: given the model's
# max length (`max_position`), these are filled the same way instead of being required.
def _lengths(p: dict[str, Any], m: int) -> dict[str, Any]:
    """yarn / longrope: the original length defaults to the model's; the factor is their ratio (Phi-3 style)."""
    orig = m if p.get(_ORIG) is None else p[_ORIG]
    return {_ORIG: orig, "factor": m / orig}


def _original_length(p: dict[str, Any], m: int) -> dict[str, Any]:
    """dynamic / llama3: the original length defaults to the model's (HF `standardize_rope_params`)."""
    return {_ORIG: m}


_FROM_MODEL: dict[str, Callable[[dict[str, Any], int], dict[str, Any]]] = {
    "dynamic": _original_length,  # HF's dynamic NTK grows past max_position_embeddings
    "llama3": _original_length,
    "yarn": _lengths,
    "longrope": _lengths,  # so the attention factor follows from the two lengths, as in HF
}

_NUMBER_KEYS = {
    "factor": 1.0,
    "attention_factor": 0.0,
    "beta_fast": 0.0,
    "beta_slow": 0.0,
    "mscale": 0.0,
    "mscale_all_dim": 0.0,
    "low_freq_factor": 0.0,
    "high_freq_factor": 0.0,
}


def _model_keys(p: dict[str, Any], theta: float | None) -> None:
    """Check and drop the keys a HF rope_parameters dict carries for the model (rope_theta, partial_rotary_factor)."""
    rope_theta = p.pop("rope_theta", None)
    if rope_theta is not None and theta is not None and not math.isclose(float(rope_theta), theta, rel_tol=1e-9):
        raise UserError(f"rope_scaling.rope_theta={rope_theta!r} disagrees with theta={theta!r}; drop one or make "
                        "them equal")
    partial = p.pop("partial_rotary_factor", 1.0)
    if partial not in (1, 1.0, None):
        raise UserError(f"rope_scaling.partial_rotary_factor={partial!r}: HD-RoPE rotates every channel of a head; "
                        "remove the key (or 1.0)")


def validate_scaling(scaling: Mapping[str, Any] | None, max_position: int | None = None,
                     theta: float | None = None) -> dict[str, Any] | None:
    """Check a rope_scaling / rope_parameters dict and return a normalised copy (None: no scaling).

    A HF `rope_parameters` dict is accepted as it is (its rope_theta must equal theta). Keys HF fills from
    the model config are filled from `max_position` (the model's max length) when left out. UserError
    names the bad key or value."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise UserError(f"rope_scaling must be a mapping with a 'rope_type' key, got {scaling!r}")
    p = dict(scaling)
    if "type" in p and "rope_type" not in p:  # HF's legacy key
        p["rope_type"] = p.pop("type")
    _model_keys(p, theta)
    kind = p.pop("rope_type", None)
    if kind in (None, "default"):
        if p:
            said = "rope_type=default" if kind else "no rope_type"
            raise UserError(f"rope_scaling has key(s) {sorted(p)} with {said}; give rope_type, one of "
                            f"{sorted(SCALING_TYPES)}")
        return None
    if kind not in SCALING_TYPES:
        raise UserError(f"rope_scaling.rope_type={kind!r} is unknown; choose one of {sorted(SCALING_TYPES)}")
    spec = SCALING_TYPES[kind]
    if max_position is not None and kind in _FROM_MODEL:  # only what the dict leaves out (or null)
        p.update({k: v for k, v in _FROM_MODEL[kind](p, int(max_position)).items() if p.get(k) is None})
    missing = [k for k in spec.required if p.get(k) is None]
    if missing:
        raise UserError(f"rope_scaling ({kind}) is missing required key(s) {missing}")
    unknown = sorted(set(p) - set(spec.required) - set(spec.optional))
    if unknown:
        allowed = sorted(spec.required + spec.optional)
        raise UserError(f"rope_scaling ({kind}) has unknown key(s) {unknown}; allowed: {allowed}")
    if "truncate" in p and not isinstance(p["truncate"], bool):
        raise UserError(f"rope_scaling.truncate must be true or false, got {p['truncate']!r}")
    for key, lowest in _NUMBER_KEYS.items():
        if key in p and p[key] is not None:
            v = p[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise UserError(f"rope_scaling.{key} must be a number, got {v!r}")
            if v < lowest or (lowest == 0.0 and v == 0 and key != "attention_factor"):
                raise UserError(f"rope_scaling.{key}={v!r} is out of range; it must be ≥ {lowest} and > 0")
    if _ORIG in p:
        v = p[_ORIG]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"rope_scaling.{_ORIG} must be a positive integer, got {v!r}")
    if kind == "llama3" and not p["high_freq_factor"] > p["low_freq_factor"]:
        raise UserError("rope_scaling (llama3): high_freq_factor must be greater than low_freq_factor")
    for key in ("short_factor", "long_factor"):
        if key in p:
            vals = p[key]
            if not isinstance(vals, (list, tuple)) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in vals
            ):
                raise UserError(f"rope_scaling.{key} must be a list of positive numbers, got {vals!r}")
            p[key] = [float(v) for v in vals]
    p["rope_type"] = kind
    return p


def scale_frequencies(
    freqs: np.ndarray,
    exponents: np.ndarray,
    head_dim: int,
    base: float,
    scaling: Mapping[str, Any] | None,
    seq_len: int | None = None,
) -> ScaledFrequencies:
    """Apply a validated scaling to block frequencies; seq_len matters for dynamic and longrope."""
    if scaling is None:
        return ScaledFrequencies(freqs, 1.0)
    spec = SCALING_TYPES[scaling["rope_type"]]
    return spec.fn(freqs, exponents, head_dim, base, scaling, seq_len)


def is_seq_dependent(scaling: Mapping[str, Any] | None) -> bool:
    """True when the frequencies depend on the current sequence length."""
    return scaling is not None and SCALING_TYPES[scaling["rope_type"]].seq_dependent
