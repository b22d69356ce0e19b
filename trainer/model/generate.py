"""Greedy decoding with the model's KV cache (same position handling as training)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.model.llama import KVCache, Llama

__all__ = ["greedy_generate", "greedy_generate_batch"]


@torch.no_grad()
def greedy_generate(
    model: Llama,
    prompt: list[int],
    max_new_tokens: int,
    stop: Callable[[list[int]], bool] | None = None,
) -> list[int]:
    """Greedy continuation of prompt (token ids) until max_new_tokens or stop(generated) is true."""
    device = next(model.parameters()).device
    cache = KVCache(model.args.n_layers)
    logits = model(torch.tensor([prompt], device=device), cache=cache)
    out: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if stop is not None and stop(out):
            break
        logits = model(torch.tensor([[nxt]], device=device), cache=cache)
    return out


@torch.no_grad()
def greedy_generate_batch(model: Llama, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuations, (batch, new_tokens), of prompts of one length, (batch, length) token ids: one
    prefill, then one cached step per token for the whole batch."""
    cache = KVCache(model.args.n_layers)
    logits = model(prompts.to(next(model.parameters()).device), cache=cache)
    out = []
    for _ in range(new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        if len(out) < new_tokens:
            logits = model(nxt, cache=cache)
    return torch.cat(out, dim=1) if out else prompts.new_zeros((len(prompts), 0))
