"""NoPE: no position encoding, causal attention alone."""

from __future__ import annotations

from trainer.model.encodings.base import PositionModule
from trainer.model.encodings.kind import EncodingKind, identity_row
from trainer.model.encodings.rotary import PEConfig, ignored_field_problems


class NoPE(PositionModule):
    """No position encoding: causal attention alone."""


KIND = EncodingKind(
    "nope", PEConfig, lambda c, s: NoPE(), lambda pe: identity_row("nope", "NoPE", 0, "none", None, None),
    identity_keys=(), is_rope=lambda row: False, translation_invariant=True,
    dedup=lambda pe: PEConfig(kind="nope", rotation_dim=0, theta=0.0, basis="none", seed=0, scaling=None),
    tables=False, cost_keys=("rotation_dim", "fused"), positionless=True,
    problems=lambda c, s: ignored_field_problems(c, "nope", ("basis", "rotation_dim")))
