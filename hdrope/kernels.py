"""Elementwise kernels for out = x·cos + (G·x)·sin, eager or fused with torch.compile.

All kernels take per-channel `cos`, `sin` broadcastable to x (…, seq, head_dim), computed in the
compute dtype (float64 for float64 inputs, else float32); x of any floating dtype is computed in the
tables' dtype and the result comes back in x's dtype (a compiled kernel does both casts inside its one
pass: with bf16 inputs on an H100, separate casts cost two more passes over x). Backward is the same kernel with −sin,
because the rotation is orthogonal up to the attention factor: R(m)ᵀ = cos·I − sin·G.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Kernel", "fused_by_default", "make_kernel", "rotate"]

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _rotate_half_eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[..., :h], sin[..., :h]  # both halves of a pair share one frequency
    if torch.compiler.is_compiling():  # inside a compiled model: out= into views breaks the graph (and torch 2.11's
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)  # inductor then fails); one fused kernel here
    out = torch.empty(torch.broadcast_shapes(x.shape, cos.shape), dtype=x.dtype, device=x.device)
    o1, o2 = out[..., :h], out[..., h:]
    # products rounded before the sum, as HF's x·cos + rotate_half(x)·sin (addcmul may fuse them: other bits)
    torch.mul(x1, c, out=o1)
    o1.sub_(x2 * s)
    torch.mul(x2, c, out=o2)
    o2.add_(x1 * s)
    return out


def _permute_eager(x, cos, sin, perms, coefs):
    mixed = x.index_select(-1, perms[0]).mul_(coefs[0])
    for t in range(1, perms.shape[0]):
        mixed.addcmul_(x.index_select(-1, perms[t]), coefs[t])
    return torch.addcmul(x * cos, mixed, sin)


def _permute_fused(x, cos, sin, coefs, structure):
    """Compiled form, written chunk by chunk with static slices so inductor emits one vectorised loop.

    In the chunk layout, term t's partner of block coordinate i is a whole chunk of b channels and its
    weight is one number per (t, i), so G·x needs no gather: chunk i of G·x = Σ_t w[t, i]·chunk(partner).
    """
    n, b, r2, shifts, use_xor = structure
    c, s = cos[..., :b], sin[..., :b]  # every coordinate of a block turns at the block's frequency

    def chunk(p: int) -> torch.Tensor:
        return x[..., p * b : (p + 1) * b]

    outs = []
    for i in range(n):
        mixed = None
        for t, sh in enumerate(shifts):
            term = chunk(i ^ sh if use_xor else (i + sh) % n) * coefs[t, i * b]
            mixed = term if mixed is None else mixed + term
        outs.append(chunk(i) * c + mixed * s)
    if r2:  # leftover pairs: plain rotate-half RoPE
        lo, hi = x[..., n * b : n * b + r2], x[..., n * b + r2 :]
        cl, sl = cos[..., n * b : n * b + r2], sin[..., n * b : n * b + r2]
        outs += [lo * cl - hi * sl, hi * cl + lo * sl]
    return torch.cat(outs, dim=-1)


def _dense(x, cos, sin, gen_t):
    return torch.addcmul(x * cos, x @ gen_t, sin)


def _negated_sin(fn):
    def mirrored(x, cos, sin, *extra):
        return fn(x, cos, -sin, *extra)

    return mirrored


def _in_table_dtype(fn):
    """fn computed in the tables' dtype, its result in x's dtype."""

    def cast(x, cos, sin, *extra):
        out = fn(x if x.dtype == cos.dtype else x.to(cos.dtype), cos, sin, *extra)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    return cast


_EAGER = {"rotate_half": _rotate_half_eager, "permute": _permute_eager, "dense": _dense}
_FUSED_SRC = {"permute": _in_table_dtype(_permute_fused), "dense": _in_table_dtype(_dense)}
_FUSED: dict[str, Callable] = {}


def _fused(impl: str) -> Callable:
    """One compiled function per impl, shared by all modules; plan data are arguments, not closures."""
    if impl not in _FUSED:
        # every (plan structure, shape, dtype) is its own graph; allow a lab's worth of them
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _FUSED[impl] = torch.compile(_FUSED_SRC[impl], dynamic=False)
    return _FUSED[impl]


def fused_by_default(device: torch.device) -> bool:
    """Whether `fused=None` compiles on this device: on CUDA with Triton, where the compiled kernel runs at
    memory bandwidth and compiling is cheap next to a GPU run; not on CPU, where inductor's C++ build costs
    5-20 s per run and shape (measured on the tiny preset) and the rotary is a few percent of a step."""
    if device.type != "cuda":
        return False
    try:
        from torch.utils._triton import has_triton
    except ImportError:  # pragma: no cover - torch without the helper
        return False
    return bool(has_triton())


def make_kernel(
    impl: str,
    *,
    sign: float = 1.0,
    perms: torch.Tensor | None = None,
    coefs: torch.Tensor | None = None,
    generator: torch.Tensor | None = None,
    structure: tuple | None = None,
    fused: bool = False,
) -> Kernel:
    """Build the kernel for a mixing plan; fused=True runs it through torch.compile (inductor)."""
    if impl not in _EAGER:
        raise ValueError(f"unknown kernel impl {impl!r}")
    if fused and impl == "rotate_half":  # measured faster than a compiled cat-based rotate_half
        impl = "permute"
    fn = _fused(impl) if fused else _in_table_dtype(_EAGER[impl])
    if impl == "permute":
        assert perms is not None and coefs is not None
        extra: tuple = (coefs, structure) if fused else (perms, coefs)
    elif impl == "dense":
        assert generator is not None
        extra = (generator.t().contiguous(),)
    else:
        extra = ()
        if sign != 1.0:  # the mirror image of RoPE: the angle is negated
            fn = _negated_sin(fn)

    def kernel(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return fn(x, cos, sin, *extra)

    return kernel


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, kernel):  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        ctx.kernel = kernel
        return kernel(x.detach(), cos, sin)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        return ctx.kernel(grad.contiguous(), cos, -sin), None, None, None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kernel: Kernel) -> torch.Tensor:
    """Apply a rotation kernel with an exact, allocation-light backward (the transpose rotation)."""
    if x.requires_grad and torch.is_grad_enabled():
        return _Rotate.apply(x, cos, sin, kernel)
    return kernel(x, cos, sin)
