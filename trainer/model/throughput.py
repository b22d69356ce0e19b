"""Model FLOPs per token and an MFU estimate against a peak (given, known for the GPU, or measured).

FLOPs follow the PaLM appendix: 6·N for the matmuls (N = parameters without the input embedding)
plus 12·n_layers·n_heads·head_dim·seq for attention scores and values, forward plus backward, plus the
matmuls of the position encoding's own transform (its kind's FLOPs; zero for the elementwise rotary kinds).
`param_count` is the model's parameter count, the encoding's own parameters included (its kind's count).
On a CPU, the peak is the measured throughput of a large fp32/bf16 matmul on the threads in use,
so CPU MFU reads as "fraction of achievable GEMM speed".
"""

from __future__ import annotations

import functools
import time

import torch

from trainer.model.args import ModelArgs
from trainer.model.pe_layers import layer_heads, stack_groups
from trainer.model.position import encoding_flops, encoding_params

__all__ = ["flops_per_token", "matmul_params", "param_count", "peak_flops"]

# Dense bf16 tensor-core peaks (FLOP/s) of common accelerators, by a substring of the device name.
_GPU_PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "4090": 165e12}


def matmul_params(a: ModelArgs) -> int:
    """Weights every token multiplies by: each layer's attention and feed-forward projections and the output
    projection (not the input embedding, a lookup, nor the norms or the encoding's own parameters)."""
    hd = a.resolved_head_dim
    attn = sum(a.dim * hd * (q + 2 * kv + out) for q, kv, out in layer_heads(a))  # wq, wk and wv, wo
    ffn = 3 * a.dim * a.ffn_hidden
    return attn + a.n_layers * ffn + a.dim * a.vocab_size


def param_count(a: ModelArgs) -> int:
    """Parameters of `Llama(a)` (tied weights counted once), the encoding's own included, without building it."""
    embedding = 0 if a.tie_embeddings else a.vocab_size * a.dim
    norms = (2 * a.n_layers + 1) * a.dim
    return matmul_params(a) + embedding + norms + sum(encoding_params(g.pe, g.shape) for g in stack_groups(a))


def flops_per_token(a: ModelArgs, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token at sequence length seq_len."""
    attention = 12.0 * sum(out for _, _, out in layer_heads(a)) * a.resolved_head_dim * seq_len
    return 6.0 * matmul_params(a) + attention + sum(encoding_flops(g.pe, g.shape) for g in stack_groups(a))


@functools.lru_cache(maxsize=4)
def _measured(device: str, dtype: torch.dtype, threads: int) -> float:  # threads: part of the cache key
    n = 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        a @ b
        reps += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2.0 * n**3 * reps / (time.perf_counter() - t0)


def peak_flops(device: torch.device, dtype: torch.dtype, configured_tflops: float = 0.0) -> float:
    """Peak FLOP/s for MFU: configured, else a known GPU peak, else a measured matmul rate."""
    if configured_tflops > 0:
        return configured_tflops * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in _GPU_PEAKS.items():
            if key in name:
                return peak
    return _measured(str(device), dtype, torch.get_num_threads())
