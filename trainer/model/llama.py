"""A compact Llama-3-style decoder with a pluggable position encoding (one readable file).

RMSNorm, SwiGLU, grouped-query attention through the encoding's `attend` (F.scaled_dot_product_attention,
causal, with the encoding's score bias as a float mask where it has one), no biases, N(0, init_std) init (the
paper's 0.02), optional depth-scaled output projections and tied embeddings. Its arguments, `ModelArgs`, sit
beside it in `trainer.model.args`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.args import ModelArgs, validate_model_args
from trainer.model.position import PositionEncoding, build_position_encoding

__all__ = ["Captured", "KVCache", "Llama", "ModelArgs", "validate_model_args"]


class Captured(NamedTuple):
    """One layer's transformed queries and keys in a forward pass, and the keys' token state (None for a kind of
    positions alone): what the kind's `logits` and `weights` take."""

    q: torch.Tensor
    k: torch.Tensor
    state: torch.Tensor | None = None


@dataclass
class _Context:
    """What one forward pass carries through its layers: the KV cache, the (q, k) capture, and the attention masks
    already built in this pass (layers that share a score bias build its mask once)."""

    cache: KVCache | None = None
    capture: dict[int, Captured] | None = None
    masks: dict = field(default_factory=dict)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class KVCache:
    """Rotated keys and values per layer for incremental decoding, with the keys' token state where the encoding
    reads one (FoX's log forget gates); `length` is the cached prefix."""

    def __init__(self, n_layers: int) -> None:
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers
        self.state: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        first = self.kv[0]
        return 0 if first is None else first[0].shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The layer's keys, values and token state (batch, heads, seq, ...) so far, these new ones appended."""
        past, past_state = self.kv[layer], self.state[layer]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if past_state is not None and state is not None:
            state = torch.cat([past_state, state], dim=2)
        self.kv[layer], self.state[layer] = (k, v), state
        return k, v, state


class Attention(nn.Module):
    def __init__(self, a: ModelArgs, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.resolved_head_dim
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor, pe: PositionEncoding, tables: object, ctx: _Context) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = pe.rotate(q, k, tables, self.layer)
        state = pe.token_state(x, self.layer)
        past = 0
        if ctx.cache is not None:
            prev = ctx.cache.kv[self.layer]
            past = 0 if prev is None else prev[0].shape[2]
            k, v, state = ctx.cache.update(self.layer, k, v, state)
        if ctx.capture is not None:
            ctx.capture[self.layer] = Captured(q, k, state)
        y = pe.attend(q, k, v, past, self.layer, ctx.masks, state)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn_hidden, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn_hidden, bias=False)
        self.w2 = nn.Linear(a.ffn_hidden, a.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, a: ModelArgs, layer: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.attention = Attention(a, layer)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.feed_forward = FeedForward(a)

    def forward(self, x: torch.Tensor, pe: PositionEncoding, tables: object, ctx: _Context) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), pe, tables, ctx)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Decoder-only transformer; forward(tokens, positions=None) returns logits (batch, seq, vocab)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        validate_model_args(args)
        self.pe = build_position_encoding(args.pe, args.encoding_shape)
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, i) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, init_std) for every matrix (depth-scaled for wo/w2 when enabled); norms at 1.

        The position encoding's own parameters (`pe.*`) keep the initialisation their module gave them."""
        std = self.args.init_std
        out_std = std / math.sqrt(2 * self.args.n_layers) if self.args.depth_scaled_init else std
        for name, p in self.named_parameters():
            if name.startswith("pe."):
                continue
            if p.dim() == 1:
                p.fill_(1.0)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def num_params(self, include_embeddings: bool = True) -> int:
        """Parameter count (tied weights counted once)."""
        n = sum(p.numel() for p in self.parameters())
        return n if include_embeddings else n - self.tok_embeddings.weight.numel()

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        capture: dict[int, Captured] | None = None,
    ) -> torch.Tensor:
        """Logits for tokens (batch, seq). With a cache, tokens continue the cached prefix (positions
        default to follow it). With capture, each layer stores its rotated q, k (and token state) under its index."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq) integer ids, got shape {tuple(tokens.shape)}")
        length = None
        if positions is None:
            start = cache.length if cache is not None else 0
            length = start + tokens.shape[1]  # known here: the tables need not read positions (no GPU sync)
            positions = torch.arange(start, length, device=tokens.device)
        h = self.tok_embeddings(tokens)
        tables = self.pe.tables(positions, h.dtype, length)
        ctx = _Context(cache, capture)
        for layer in self.layers:
            h = layer(h, self.pe, tables, ctx)
        return self.output(self.norm(h))
