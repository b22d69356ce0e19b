"""A compact Llama-3-style decoder with a pluggable position encoding (one readable file).

RMSNorm, SwiGLU, grouped-query attention on the path `model.attention` chooses (`trainer.model.attention.paths`:
dense SDPA, tiles of linear memory, or FlexAttention) over the encoding's scores, causal, within a sliding window on
the layers `model.layer_pattern` makes local, and within each document when `documents` is set; no biases,
N(0, init_std) init (the paper's 0.02), optional depth-scaled output projections and tied embeddings. Its
arguments, `ModelArgs`, sit beside it in `trainer.model.args`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.args import ModelArgs, validate_model_args
from trainer.model.attention.call import AttentionCall, AttentionMask
from trainer.model.attention.documents import Documents
from trainer.model.attention.paths import choose_path, run_attention
from trainer.model.attention.tiled import DEFAULT_BLOCK
from trainer.model.kv_cache import KVCache
from trainer.model.pe_layers import build_stack, layer_heads
from trainer.model.position import PositionEncoding

__all__ = ["AttentionCall", "KVCache", "Llama", "ModelArgs", "validate_model_args"]


@dataclass
class _Context:
    """What one forward pass carries through its layers: the KV cache, the capture of each layer's attention call,
    the requested attention path, the tokens' positions (batch or 1, seq), their documents (batch, seq) and the
    token index of the first."""

    cache: KVCache | None
    capture: dict[int, AttentionCall] | None
    attention: str
    block: int
    positions: torch.Tensor
    segments: torch.Tensor | None
    first: int


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, a: ModelArgs, layer: int, heads: tuple[int, int, int]) -> None:
        super().__init__()
        self.layer, self.window = layer, a.layer_windows[layer]
        # query and KV heads projected, attention heads out: as configured unless the encoding says (RoPE++)
        (self.n_heads, self.n_kv_heads, out_heads), self.head_dim = heads, a.resolved_head_dim
        self.wq = nn.Linear(a.dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(out_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor, pe: PositionEncoding, tables: object, ctx: _Context) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        pe, tables, at = pe.layer_view(tables, self.layer)  # this layer's encoding (model.pe_layers) and its index
        q, k = pe.rotate(q, k, tables, at)
        if pe.streams:  # TAPE: the position features ride beside the values (as many heads as `rotate`'s keys)
            v = v.repeat_interleave(k.shape[1] // v.shape[1], dim=1)
            features = pe.stream_values(tables, at)
            v = torch.cat((v, features.expand(b, v.shape[1], -1, -1).to(v.dtype)), dim=-1)
        state = pe.token_state(x, at)
        k_index, k_pos, segments = ctx.first, ctx.positions, ctx.segments
        if ctx.cache is not None:  # a windowed layer keeps what its next queries can see (and the state reach)
            keep = max(1, self.window - 1 + pe.state_reach) if self.window else 0
            k, v, state, k_index = ctx.cache.update(self.layer, k, v, state, keep)
            k_pos = ctx.cache.positions[:, k_index:]
            segments = None if ctx.cache.segments is None else ctx.cache.segments[:, k_index:]
        call = AttentionCall(q, k, v, ctx.positions, k_pos, AttentionMask(ctx.first, k_index, self.window, segments),
                             state, at)
        if ctx.capture is not None:
            ctx.capture[self.layer] = call
        y = run_attention(pe, call, ctx.attention, ctx.block)
        if pe.streams:
            y, attended = y.split((self.head_dim, y.shape[-1] - self.head_dim), dim=-1)
            pe.stream_attended(tables, at, attended)
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
    def __init__(self, a: ModelArgs, layer: int, heads: tuple[int, int, int]) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.attention = Attention(a, layer, heads)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.feed_forward = FeedForward(a)

    def forward(self, x: torch.Tensor, pe: PositionEncoding, tables: object, ctx: _Context) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), pe, tables, ctx)
        out = self.feed_forward(self.ffn_norm(x))
        if pe.streams:  # TAPE (never in a hybrid stack): the feed-forward output updates the position features
            pe.stream_feed_forward(tables, self.attention.layer, out)
        return x + out


class Llama(nn.Module):
    """Decoder-only transformer; forward(tokens, positions=None) returns logits (batch, seq, vocab)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        validate_model_args(args)
        self.pe = build_stack(args)  # one encoding for every layer, or one per distinct model.pe_layers section
        self.args = args
        self.documents: Documents | None = None  # set by the trainer when data.documents.mask is on
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, i, heads) for i, heads in enumerate(layer_heads(args)))
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

    def attention_paths(self, device: str, lengths: dict[str, int], training_at: str = "train") -> dict[str, str]:
        """The attention path `model.attention` takes at each named sequence length on `device` ('cpu' or 'cuda'),
        training at `training_at` and evaluating elsewhere: one name, or each path with the layers that take it."""
        a = self.args
        block = a.attention_block or DEFAULT_BLOCK
        pes = [self.layer_encoding(i) for i in range(a.n_layers)]
        out = {}
        for name, length in lengths.items():
            chosen = [choose_path(a.attention, type(pe).scores_kind(), device, name == training_at, length, length,
                                  self.documents is None and not window, block, pe.fuses())
                      for pe, window in zip(pes, a.layer_windows, strict=True)]
            paths = dict.fromkeys(chosen)
            out[name] = chosen[0] if len(paths) == 1 else ", ".join(
                f"{p} (layers {', '.join(str(i) for i, c in enumerate(chosen) if c == p)})" for p in paths)
        return out

    def layer_encoding(self, layer: int) -> PositionEncoding:
        """The position-encoding module that serves layer `layer` (its attention calls carry that module's own index
        of the layer)."""
        return self.pe.layer_view(None, layer)[0]

    def num_params(self, include_embeddings: bool = True) -> int:
        """Parameter count (tied weights counted once)."""
        n = sum(p.numel() for p in self.parameters())
        return n if include_embeddings else n - self.tok_embeddings.weight.numel()

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        capture: dict[int, AttentionCall] | None = None,
    ) -> torch.Tensor:
        """Logits for tokens (batch, seq). With a cache, tokens continue the cached prefix (positions
        default to follow it). With `documents` set, attention stays within each document and positions restart
        at each (unless given). With capture, each layer stores its attention call under its index."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq) integer ids, got shape {tuple(tokens.shape)}")
        first = cache.length if cache is not None else 0
        length = first + tokens.shape[1]  # positions never exceed the token index: the tables need not read them
        segments = after = None
        if self.documents is not None:
            segments, restarted, after = self.documents.split(tokens, first, None if cache is None else cache.documents)
            if positions is None and restarted is not None:
                positions = restarted
        elif positions is not None:
            length = None  # the caller's own positions: the tables read their bound
        if positions is None:
            positions = torch.arange(first, length, device=tokens.device)
        rows = positions if positions.dim() == 2 else positions.unsqueeze(0)
        if cache is not None:
            cache.extend(rows, segments, after)
        h = self.tok_embeddings(tokens)
        tables = self.pe.tables(positions, h.dtype, length)
        ctx = _Context(cache, capture, self.args.attention, self.args.attention_block, rows, segments, first)
        for layer in self.layers:
            h = layer(h, self.pe, tables, ctx)
        return self.output(self.norm(h))
