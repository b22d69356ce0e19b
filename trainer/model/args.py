"""The decoder's architecture as a typed config (`ModelArgs`, the `model:` section of a run config) and its check.

Importing it loads neither torch nor the encodings: `import trainer.config` stays light (tested). The encoding
registry (`trainer.model.position`, whose kinds hold their config beside their torch builder) is imported when a
`ModelArgs` is made with its default `pe`, asked for its `encoding_shape`, or checked; checking builds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hdrope.errors import UserError
from trainer.model.layer_pattern import layer_windows
from trainer.new_setting import NEW_SETTING

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
    # the attention path (trainer.model.attention.paths): auto | dense | tiled | flex
    attention: str = field(default="auto", metadata=NEW_SETTING)
    attention_block: int = field(default=0, metadata=NEW_SETTING)  # tokens per tile of the tiled path; 0: 256
    window: int = field(default=0, metadata=NEW_SETTING)  # sliding window of the local layers in tokens; 0: none
    layer_pattern: str = field(default="", metadata=NEW_SETTING)  # e.g. "3 local, 1 global"; "": all alike
    # a position encoding per layer (trainer.model.pe_layers): [{layers: 'every 4th', pe: {kind: nope}}], or one
    # model.pe section per layer; []: every layer takes pe
    pe_layers: list[Any] = field(default_factory=list, metadata=NEW_SETTING)

    @property
    def layer_windows(self) -> list[int]:
        """Each layer's sliding window in tokens (0: it sees every earlier token)."""
        return layer_windows(self.layer_pattern, self.window, self.n_layers)

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
    from trainer.model.attention.paths import ATTENTION_CHOICES

    if a.attention not in ATTENTION_CHOICES:
        raise UserError(f"model.attention={a.attention!r}: choose one of {', '.join(ATTENTION_CHOICES)} (auto takes "
                        "the fastest path that serves the kind, device and length)")
    if isinstance(a.attention_block, bool) or not isinstance(a.attention_block, int) or a.attention_block < 0:
        raise UserError(f"model.attention_block={a.attention_block!r}: must be an integer >= 0 (tokens per tile of "
                        "the tiled attention path; 0: its default), e.g. 256")
    if isinstance(a.window, bool) or not isinstance(a.window, int) or not 0 <= a.window <= a.max_seq_len:
        raise UserError(f"model.window={a.window!r}: must be an integer in [0, model.max_seq_len={a.max_seq_len}] (a "
                        "window of that many tokens or more is global attention at the train length); use 0 for "
                        f"none or a smaller window, e.g. {max(1, a.max_seq_len // 2)}")
    a.layer_windows  # noqa: B018 -- parses model.layer_pattern: UserError naming it
    from trainer.model.pe_layers import stack_problems

    problems = stack_problems(a)
    if problems:
        raise UserError("; ".join(problems))
