"""The decoder's architecture as a typed config (`ModelArgs`, the `model:` section of a run config) and its check.

Importing it loads neither torch nor the encodings: `import trainer.config` stays light (tested). The encoding
registry (`trainer.model.position`, whose kinds hold their config beside their torch builder) is imported when a
`ModelArgs` is made with its default `pe`, asked for its `encoding_shape`, or checked; checking builds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hdrope.errors import UserError

if TYPE_CHECKING:
    from trainer.model.position import EncodingShape

__all__ = ["ModelArgs", "validate_model_args"]


def _default_pe() -> Any:
    """RoPE's config (`model.pe.kind=rope`), from its kind's module."""
    from trainer.model.position import PEConfig

    return PEConfig()


@dataclass
class ModelArgs:
    """Architecture of the decoder; head_dim = dim // n_heads unless given."""

    vocab_size: int = 259
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int | None = None
    ffn_hidden: int = 768
    norm_eps: float = 1e-5
    max_seq_len: int = 256
    tie_embeddings: bool = False
    init_std: float = 0.02
    depth_scaled_init: bool = False  # scale wo / w2 init by 1/sqrt(2·n_layers)
    # one typed dataclass per kind (its module under trainer.model.encodings), chosen by pe.kind when merged
    pe: Any = field(default_factory=_default_pe)

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.dim // self.n_heads

    @property
    def encoding_shape(self) -> EncodingShape:
        """The dimensions the position encoding is built for."""
        from trainer.model.position import EncodingShape

        return EncodingShape(self.resolved_head_dim, self.n_heads, self.n_kv_heads, self.n_layers, self.max_seq_len,
                             self.dim)


def validate_model_args(a: ModelArgs) -> None:
    """Raise UserError naming the field, the value and the fix for an impossible architecture (builds nothing)."""
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len"):
        v = getattr(a, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"model.{name} must be a positive integer, got {v!r}")
    if a.head_dim is None and a.dim % a.n_heads:
        raise UserError(f"model.dim={a.dim} is not divisible by model.n_heads={a.n_heads}; set head_dim or change one")
    if a.n_heads % a.n_kv_heads:
        raise UserError(
            f"model.n_heads={a.n_heads} is not divisible by model.n_kv_heads={a.n_kv_heads}; "
            "grouped-query attention needs n_kv_heads to divide n_heads"
        )
    from trainer.model.position import encoding_problems

    problems = encoding_problems(a.pe, a.encoding_shape)
    if problems:
        raise UserError("; ".join(problems))
