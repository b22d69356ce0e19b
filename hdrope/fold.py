"""HD-RoPE with a fixed basis is the identity-basis encoding on re-parameterised queries and keys (NOTES §2).

`fold_matrix(rot)` is the orthogonal (head_dim × head_dim) B with

    R_Q(m) = B · R_I(m) · Bᵀ   for every position m,

where R_Q is `rot`'s rotation and R_I that of the identity basis with the same rotation dim, θ and
scaling. So (R_Q(m) q)·(R_Q(n) k) = (R_I(m) Bᵀq)·(R_I(n) Bᵀk): a model with basis Q equals the
identity-basis model whose W_q and W_k rows, head by head, are premultiplied by Bᵀ. B is block
diagonal over the channels that share a frequency, so it commutes with the cos/sin tables; it is
built from the encoding's own generator, whatever the kernel's channel layout.
"""

from __future__ import annotations

import numpy as np

from hdrope.rotary import HDRotary

__all__ = ["fold_matrix", "identity_twin"]


def identity_twin(rot: HDRotary) -> HDRotary:
    """The identity-basis encoding with rot's head_dim, rotation dim, θ and scaling."""
    # rot.scaling is already validated, with the keys HF takes from the model filled in
    return HDRotary(rot.head_dim, rot.rotation_dim, rot.theta, basis="identity", scaling=rot.scaling)


def _adapted_frame(k: np.ndarray) -> np.ndarray:
    """Orthonormal U with K·u_{2i} = u_{2i+1} (so Uᵀ K U is the standard pair structure), for K skew with K² = −I."""
    n = k.shape[0]
    cols: list[np.ndarray] = []
    for e in np.eye(n):
        if len(cols) == n:
            break
        v = e - sum((c @ e) * c for c in cols) if cols else e.copy()
        norm = np.linalg.norm(v)
        if norm < 1e-6:
            continue
        v /= norm
        cols += [v, k @ v]  # span(cols) is K-invariant, so K v is already orthogonal to it and to v
    return np.stack(cols, axis=1)


def fold_matrix(rot: HDRotary) -> np.ndarray:
    """The orthogonal B (float64, head_dim × head_dim) with rot's rotation R_Q(m) = B · R_I(m) · Bᵀ for all m."""
    g_q = rot.plan.generator
    g_i = identity_twin(rot).plan.generator
    index = rot.layout.channel_frequency_index()
    b = np.zeros((rot.head_dim, rot.head_dim))
    for f in np.unique(index):
        ch = np.flatnonzero(index == f)
        block = np.ix_(ch, ch)
        b[block] = _adapted_frame(g_q[block]) @ _adapted_frame(g_i[block]).T
    return b
