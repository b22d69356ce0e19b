"""`hdrope bench rotary`: HD-RoPE kernels vs the project's RoPE and the elementwise floor, side by side.

Every variant is timed round-robin in one process (each round times every variant once, in a
freshly shuffled order), and the median over rounds is reported, so drift on a shared machine
hits all variants alike.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from hdrope.bench_args import non_negative_int, positive_int, writable_file
from hdrope.errors import UserError
from hdrope.rotary import HDRotary

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

__all__ = ["DTYPES", "HBM_PEAKS", "BenchRow", "bench_device", "hbm_peak", "main", "median_round_robin",
           "run_rotary_bench", "synced"]


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
    fwd_gbps: float = float("nan")  # bytes of x read plus output written, per second of the forward


# Peak memory bandwidth (bytes/s) by a substring of the CUDA device name; the most specific name first.
HBM_PEAKS = {"H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100-SXM4-80GB": 2.039e12,
             "A100": 1.555e12, "L40S": 0.864e12, "A10G": 0.6e12}


def hbm_peak(device: torch.device) -> float | None:
    """Peak memory bandwidth in bytes/s of a known CUDA device, else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in HBM_PEAKS.items() if key in name), None)


def bench_device(name: str) -> torch.device:
    """The device a `--device` value names: auto is CUDA when one is visible, else the CPU; a CUDA device that
    is not there is a UserError."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device here; use --device cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r}: not a device; use auto, cpu, cuda or cuda:N") from None


def synced(fns: dict[str, Callable[[], object]], device: torch.device) -> dict[str, Callable[[], object]]:
    """The callables, each waiting for the device to finish (CUDA runs asynchronously), for wall-clock timing."""
    if device.type != "cuda":
        return fns
    return {k: (lambda f=f: (f(), torch.cuda.synchronize(device))) for k, f in fns.items()}


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
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[list[BenchRow], float]:
    """Time forward and forward+backward of every variant on `device` with x in `dtype`; return rows and the
    floor in ms."""
    torch.manual_seed(0)
    dev = torch.device(device)
    _b, _h, s, d = shape
    x = torch.randn(shape, device=dev, dtype=dtype)
    xg = x.clone().requires_grad_(True)
    grad = torch.randn(shape, device=dev, dtype=dtype)
    positions = torch.arange(s, device=dev)
    variants = [("rope", 2, "identity")] + [(f"{n}D-{basis}", n, basis) for n in dims for basis in bases]
    fwd: dict[str, Callable[[], object]] = {"floor": lambda: x * 2.0}
    bwd: dict[str, Callable[[], object]] = {}
    impls: dict[str, str] = {}
    for mode in modes:
        for name, n, basis in variants:
            rot = HDRotary(d, n, theta, basis=basis, fused=(mode == "fused"))
            cos, sin = rot.cos_sin(positions, dtype)
            key = f"{name}|{mode}"
            impls[key] = rot.plan.impl
            fwd[key] = lambda rot=rot, cos=cos, sin=sin: rot.apply(x, cos, sin)
            bwd[key] = lambda rot=rot, cos=cos, sin=sin: rot.apply(xg, cos, sin).backward(grad)
    t_fwd = median_round_robin(synced(fwd, dev), rounds)
    t_bwd = median_round_robin(synced(bwd, dev), rounds)
    floor = t_fwd.pop("floor")
    moved = 2 * x.numel() * x.element_size()
    rows = []
    for key, ms in t_fwd.items():
        name, mode = key.split("|")
        rope_f, rope_b = t_fwd[f"rope|{mode}"], t_bwd[f"rope|{mode}"]
        rows.append(BenchRow(name, mode, impls[key], ms, t_bwd[key], ms / rope_f, ms / floor, t_bwd[key] / rope_b,
                             moved / (ms / 1e3) / 1e9))
    return rows, floor


def main(argv: list[str]) -> int:
    """Run the rotary benchmark and print a table of times and ratios."""
    ap = argparse.ArgumentParser(prog="hdrope bench rotary", description=__doc__)
    ap.add_argument("--shape", type=positive_int, nargs=4, default=[8, 8, 1024, 64], metavar=("B", "H", "S", "D"))
    ap.add_argument("--dims", type=positive_int, nargs="+", default=[4, 8, 32], help="rotation dims besides RoPE")
    ap.add_argument("--bases", nargs="+", default=["identity", "random", "paley"])
    ap.add_argument("--modes", nargs="+", default=["eager", "fused"], choices=["eager", "fused"])
    ap.add_argument("--rounds", type=positive_int, default=15)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="dtype of x (tables stay fp32)")
    ap.add_argument("--threads", type=non_negative_int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", type=writable_file, default=None, help="also write the rows to this JSON file")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda or cuda:N")
    args = ap.parse_args(argv)
    dev = bench_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, floor = run_rotary_bench(
        tuple(args.shape), tuple(args.dims), tuple(args.bases), tuple(args.modes), args.rounds, device=str(dev),
        dtype=DTYPES[args.dtype],
    )
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    peak = hbm_peak(dev)
    floor_gbps = 2 * math.prod(args.shape) * DTYPES[args.dtype].itemsize / (floor / 1e3) / 1e9
    print(
        f"shape {tuple(args.shape)} {args.dtype} on {where}, median of {args.rounds} round-robin rounds; "
        f"elementwise floor (x*2) = {floor:.3f} ms, {floor_gbps:.0f} GB/s"
        + (f" ({floor_gbps * 1e9 / peak:.0%} of peak)" if peak else "")
    )
    print(
        f"{'variant':<14}{'mode':<7}{'impl':<12}{'fwd ms':>8}{'fwd/RoPE':>10}{'fwd/floor':>10}"
        f"{'fwd+bwd ms':>12}{'f+b/RoPE':>10}{'fwd GB/s':>10}" + ("  of peak" if peak else "")
    )
    for r in rows:
        print(
            f"{r.name:<14}{r.mode:<7}{r.impl:<12}{r.fwd_ms:>8.3f}{r.fwd_vs_rope:>10.2f}{r.fwd_vs_floor:>10.2f}"
            f"{r.fwdbwd_ms:>12.3f}{r.fwdbwd_vs_rope:>10.2f}{r.fwd_gbps:>10.0f}"
            + (f"{r.fwd_gbps * 1e9 / peak:>9.0%}" if peak else "")
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"floor_ms": floor, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0
