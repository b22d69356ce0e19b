"""`hdrope bench rotary`: HD-RoPE kernels vs the project's RoPE and the elementwise floor, side by side.

Every variant is timed round-robin in one process (each round times every variant once, in a
freshly shuffled order), and the median over rounds is reported, so drift on a shared machine
hits all variants alike.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from hdrope.errors import UserError
from hdrope.rotary import HDRotary

__all__ = ["BenchRow", "main", "median_round_robin", "run_rotary_bench"]


@dataclass
class BenchRow:
    """One measured variant; ratios are against RoPE in the same mode and the elementwise floor."""

    name: str
    mode: str  # eager | fused
    impl: str
    fwd_ms: float
    fwdbwd_ms: float
    fwd_vs_rope: float = float("nan")
    fwd_vs_floor: float = float("nan")
    fwdbwd_vs_rope: float = float("nan")


def median_round_robin(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median wall time (ms) of each callable, timed round-robin in a shuffled order each round."""
    for fn in fns.values():  # warm-up (and compile) twice
        fn()
        fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)  # no variant always runs right after the same neighbour
        for key in order:
            t0 = time.perf_counter()
            fns[key]()
            samples[key].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def run_rotary_bench(
    shape: tuple[int, int, int, int] = (8, 8, 1024, 64),
    dims: tuple[int, ...] = (4, 8, 32),
    bases: tuple[str, ...] = ("identity", "random", "paley"),
    modes: tuple[str, ...] = ("eager", "fused"),
    rounds: int = 15,
    theta: float = 1e4,
) -> tuple[list[BenchRow], float]:
    """Time forward and forward+backward of every variant; return rows and the floor in ms."""
    torch.manual_seed(0)
    _b, _h, s, d = shape
    x = torch.randn(shape)
    xg = x.clone().requires_grad_(True)
    grad = torch.randn(shape)
    positions = torch.arange(s)
    variants = [("rope", 2, "identity")] + [(f"{n}D-{basis}", n, basis) for n in dims for basis in bases]
    fwd: dict[str, Callable[[], object]] = {"floor": lambda: x * 2.0}
    bwd: dict[str, Callable[[], object]] = {}
    impls: dict[str, str] = {}
    for mode in modes:
        for name, n, basis in variants:
            rot = HDRotary(d, n, theta, basis=basis, fused=(mode == "fused"))
            cos, sin = rot.cos_sin(positions)
            key = f"{name}|{mode}"
            impls[key] = rot.plan.impl
            fwd[key] = lambda rot=rot, cos=cos, sin=sin: rot.apply(x, cos, sin)
            bwd[key] = lambda rot=rot, cos=cos, sin=sin: rot.apply(xg, cos, sin).backward(grad)
    t_fwd = median_round_robin(fwd, rounds)
    t_bwd = median_round_robin(bwd, rounds)
    floor = t_fwd.pop("floor")
    rows = []
    for key, ms in t_fwd.items():
        name, mode = key.split("|")
        rope_f, rope_b = t_fwd[f"rope|{mode}"], t_bwd[f"rope|{mode}"]
        rows.append(BenchRow(name, mode, impls[key], ms, t_bwd[key], ms / rope_f, ms / floor, t_bwd[key] / rope_b))
    return rows, floor


def main(argv: list[str]) -> int:
    """Run the rotary benchmark and print a table of times and ratios."""
    ap = argparse.ArgumentParser(prog="hdrope bench rotary", description=__doc__)
    ap.add_argument("--shape", type=int, nargs=4, default=[8, 8, 1024, 64], metavar=("B", "H", "S", "D"))
    ap.add_argument("--dims", type=int, nargs="+", default=[4, 8, 32], help="rotation dims besides RoPE")
    ap.add_argument("--bases", nargs="+", default=["identity", "random", "paley"])
    ap.add_argument("--modes", nargs="+", default=["eager", "fused"], choices=["eager", "fused"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        raise UserError(f"--rounds must be ≥ 1, got {args.rounds}")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, floor = run_rotary_bench(
        tuple(args.shape), tuple(args.dims), tuple(args.bases), tuple(args.modes), args.rounds
    )
    print(
        f"shape {tuple(args.shape)} fp32, {torch.get_num_threads()} threads, median of {args.rounds} "
        f"round-robin rounds; elementwise floor (x*2) = {floor:.3f} ms"
    )
    print(
        f"{'variant':<14}{'mode':<7}{'impl':<12}{'fwd ms':>8}{'fwd/RoPE':>10}{'fwd/floor':>10}"
        f"{'fwd+bwd ms':>12}{'f+b/RoPE':>10}"
    )
    for r in rows:
        print(
            f"{r.name:<14}{r.mode:<7}{r.impl:<12}{r.fwd_ms:>8.3f}{r.fwd_vs_rope:>10.2f}{r.fwd_vs_floor:>10.2f}"
            f"{r.fwdbwd_ms:>12.3f}{r.fwdbwd_vs_rope:>10.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"floor_ms": floor, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0
