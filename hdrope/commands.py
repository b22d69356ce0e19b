"""`hdrope bases`: print the facts of every mixing basis kind at every order it can make."""

from __future__ import annotations

import argparse
import csv
import sys

from hdrope.bases import BASIS_KINDS, describe_basis
from hdrope.conference import is_paley_order
from hdrope.errors import UserError

__all__ = ["bases_main", "basis_orders"]


def basis_orders(kind: str, max_n: int) -> list[int]:
    """Even orders 2..max_n that `kind` can make (rotation dims must be even)."""
    evens = range(2, max_n + 1, 2)
    if kind == "paley":
        return [n for n in evens if is_paley_order(n)]
    if kind == "hadamard":
        return [n for n in evens if n & (n - 1) == 0]
    return list(evens)


def bases_main(argv: list[str]) -> int:
    """Print orthogonality error, det, μ(Q), and K = QJQᵀ's density and μ(K), per kind and order."""
    ap = argparse.ArgumentParser(prog="hdrope bases", description=bases_main.__doc__)
    ap.add_argument("--max-n", type=int, default=32, help="largest order to list (default 32)")
    ap.add_argument("--kind", action="append", choices=sorted(BASIS_KINDS), help="only these kinds")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random basis (default 0)")
    ap.add_argument("--csv", action="store_true", help="write CSV instead of a table")
    args = ap.parse_args(argv)
    if args.max_n < 2:
        raise UserError(f"--max-n must be ≥ 2, got {args.max_n}")
    header = ["kind", "n", "orth_err", "det", "mu_Q", "K_nnz", "K_nnz_frac", "mu_K"]
    rows = []
    for kind in args.kind or list(BASIS_KINDS):
        for n in basis_orders(kind, args.max_n):
            r = describe_basis(kind, n, args.seed)
            rows.append(
                [
                    kind,
                    str(n),
                    f"{r.orthogonality_error:.1e}",
                    f"{r.det:+.0f}",
                    f"{r.mu_q:.3f}",
                    str(r.k_nonzero),
                    f"{r.k_nonzero_fraction:.3f}",
                    f"{r.mu_k:.3f}",
                ]
            )
    if args.csv:
        w = csv.writer(sys.stdout)
        w.writerow(header)
        w.writerows(rows)
        return 0
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    print(fmt.format(*header))
    for r in rows:
        print(fmt.format(*r))
    print(
        "\nK = Q·J·Qᵀ (the block generator); mu = √n·max|entry| (the paper's incoherence); "
        f"K_nnz counts |K_ij| > 1e-12 of n² (max n(n−1)). random uses seed {args.seed}."
    )
    return 0
