"""`hdrope bench encodings`: the q/k transform of every registered position encoding, side by side.

Each kind is built with its default config for one attention shape and timed on the same q and k
(tables for the positions, then the transform of one layer; a kind with a bias or scores of its own times its whole
attention on the dense path (FoX's gates read from a random input of heads × head_dim channels), and TAPE its
attention over the values and its position features and the update of those features, to be read against the fused
causal SDPA row beside it),
round-robin in one process with `hdrope.bench.median_round_robin`, against RoPE and an
elementwise floor (q*2 and k*2). The default encoding (HD-RoPE N = 4 Paley) is listed eager and compiled.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from hdrope.bench import DTYPES, bench_device, median_round_robin, synced
from hdrope.bench_args import non_negative_int, positive_int, writable_file
from hdrope.errors import UserError
from trainer.model.args import ModelArgs
from trainer.model.attention.call import AttentionCall, AttentionMask
from trainer.model.attention.dense import dense_attention
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.position import POSITION_ENCODINGS, build_position_encoding, encoding_identity, identity_is_rope

__all__ = ["DEFAULT_ROUNDS", "DEFAULT_SHAPE", "SDPA", "dense_bytes", "main", "run_encodings_bench"]


def _available(device: str) -> int:
    """Bytes of memory free for the benchmark's tensors on `device`."""
    if str(device).startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)

SDPA = "SDPA attention (reference)"  # the row a kind with its own attention (CoPE) is read against


def _variants() -> dict[str, Any]:
    """Every kind's default config, eager (labelled by its identity), plus the default encoding compiled."""
    default = ModelArgs().pe
    out: dict[str, Any] = {}
    for kind, entry in POSITION_ENCODINGS.items():
        cfg = entry.config(kind=kind)
        if hasattr(cfg, "fused"):
            cfg.fused = False  # eager everywhere
        label = encoding_identity(cfg)["pe_label"]
        out[label + (" eager" if kind == default.kind else "")] = cfg
    compiled = copy.copy(default)
    compiled.fused = True
    out[encoding_identity(default)["pe_label"] + " compiled"] = compiled
    return out


def _transform(enc: PositionModule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
               backward: bool) -> Callable[[], None]:
    # the attention input a data-dependent kind reads (FoX's gates), heads x head_dim wide
    x = torch.randn(q.shape[0], q.shape[2], q.shape[1] * q.shape[3], device=q.device, dtype=q.dtype,
                    generator=torch.Generator(q.device).manual_seed(1)).requires_grad_(backward)
    plain = type(enc).scores_kind() == "plain"
    rows = pos.unsqueeze(0)

    def fwd() -> None:
        tables = enc.tables(pos, q.dtype, q.shape[-2])
        qq, kk = enc.rotate(q, k, tables, 0)
        out = [qq, kk]
        if enc.streams:  # TAPE: its attention averages the position features beside v, which the feed-forward
            # output then updates: its cost is that whole attention and update, read against the SDPA row
            wide = torch.cat((v, enc.stream_values(tables, 0).expand_as(v).to(v.dtype)), dim=-1)
            y = dense_attention(enc, AttentionCall(qq, kk, wide, rows, rows, AttentionMask(), None, 0))
            enc.stream_attended(tables, 0, y[..., v.shape[-1]:])
            enc.stream_feed_forward(tables, 0, x)
            out = [y[..., :v.shape[-1]], tables.cos, tables.sin]
        elif not plain:  # a kind with a bias or scores of its own: its cost is its whole attention (dense), to be
            call = AttentionCall(qq, kk, v, rows, rows, AttentionMask(), enc.token_state(x, 0), 0)
            out = [dense_attention(enc, call)]  # read against the SDPA row
        if backward and any(t.requires_grad for t in out):
            sum(t.sum() for t in out if t.requires_grad).backward()

    return fwd


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool) -> Callable[[], None]:
    def fwd() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backward:
            out.sum().backward()

    return fwd


DEFAULT_SHAPE = (2, 4, 512, 64)  # B H S D: on 2 CPU cores every kind at 5 rounds in about a minute (measured)
DEFAULT_ROUNDS = 5


def dense_bytes(shape: tuple[int, int, int, int]) -> int:
    """An upper bound on the bytes the heaviest kind's dense attention holds at once for q and k of `shape`: scores
    of every head and a 32-unit hidden layer per query-key pair (FIRE's and DAPE's MLPs), float32."""
    b, h, s, _ = shape
    return 4 * s * s * (8 * b * h + 96 * b)


def run_encodings_bench(shape: tuple[int, int, int, int] = DEFAULT_SHAPE, rounds: int = DEFAULT_ROUNDS,
                        device: str = "cpu", dtype: torch.dtype = torch.float32,
                        progress: Callable[[str], None] | None = None) -> list[dict]:
    """Forward and forward+backward ms of each kind's transform of q and k in `dtype` on `device`; ratios to
    RoPE and to the floor. UserError, before anything is allocated, when the shape's dense attention would not fit
    in the memory available."""
    _b, h, s, d = shape
    need, have = dense_bytes(shape), _available(device)
    if need > have:
        fits = int(s * math.sqrt(have / need))
        raise UserError(f"--shape {' '.join(map(str, shape))}: the dense attention of the heaviest kinds (FIRE's and "
                        f"DAPE's MLP over every query-key pair) would hold about {need / 2**30:.3g} GiB at S={s}, "
                        f"over the {have / 2**30:.3g} GiB available; use S <= {fits} (the benchmark times each kind's "
                        "transform and its dense attention; `hdrope bench length` times long sequences on the tiled "
                        "path)")
    say = progress or (lambda line: None)
    torch.manual_seed(0)
    dev = torch.device(device)
    dims = EncodingShape(d, h, h, 1, s)
    variants = _variants()
    encodings = {}
    for label, cfg in variants.items():  # every kind takes this shape, or the bench stops before it allocates
        try:
            encodings[label] = build_position_encoding(cfg, dims).to(dev)
        except UserError as err:
            raise UserError(f"--shape {' '.join(map(str, shape))}: the head dim D={d} does not suit {label} at its "
                            f"defaults ({err}); choose a D that every kind takes, e.g. 64") from None
    q, k, v = (torch.randn(shape, device=dev, dtype=dtype) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    pos = torch.arange(s, device=dev)
    fwd: dict[str, Callable[[], object]] = {"floor": lambda: (q * 2.0, k * 2.0), SDPA: _sdpa(q, k, v, False)}
    bwd: dict[str, Callable[[], object]] = {SDPA: _sdpa(qg, kg, vg, True)}
    rope = next(label for label, cfg in variants.items() if identity_is_rope(encoding_identity(cfg)))
    for label, enc in encodings.items():
        fwd[label] = _transform(enc, q, k, v, pos, backward=False)
        bwd[label] = _transform(enc, qg, kg, vg, pos, backward=True)
    say(f"timing {len(fwd) - 1} variants' forward, {rounds} round(s)")
    t_f = median_round_robin(synced(fwd, dev), rounds)
    say(f"timing their forward and backward, {rounds} round(s)")
    t_b = median_round_robin(synced(bwd, dev), rounds)
    floor = t_f.pop("floor")
    return [{"encoding": name, "fwd_ms": ms, "fwd_vs_rope": ms / t_f[rope], "fwd_vs_floor": ms / floor,
             "fwdbwd_ms": t_b[name], "fwdbwd_vs_rope": t_b[name] / t_b[rope], "floor_ms": floor}
            for name, ms in t_f.items()]


def main(argv: list[str]) -> int:
    """Run the encodings benchmark and print one row per kind."""
    ap = argparse.ArgumentParser(prog="hdrope bench encodings", description=__doc__)
    ap.add_argument("--shape", type=positive_int, nargs=4, default=list(DEFAULT_SHAPE), metavar=("B", "H", "S", "D"))
    ap.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS)
    ap.add_argument("--threads", type=non_negative_int, default=1,
                    help="torch threads (default 1: on a loaded machine more threads than free cores can stall; 0: "
                         "torch's default)")
    ap.add_argument("--json", type=writable_file, default=None, help="also write the rows to this JSON file")
    ap.add_argument("--device", default="cpu", help="cpu (default), auto (cuda when available), cuda or cuda:N")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="dtype of q and k")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = bench_device(args.device)
    print(f"hdrope bench encodings: {len(POSITION_ENCODINGS) + 1} variants, {args.rounds} round-robin rounds of the "
          "forward and of the forward and backward (at the default shape, about a minute on 2 CPU cores; progress on "
          "stderr)", flush=True)
    rows = run_encodings_bench(tuple(args.shape), args.rounds, str(dev), DTYPES[args.dtype],
                               lambda line: print(line, file=sys.stderr, flush=True))
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"q and k {tuple(args.shape)} {args.dtype} on {where}, median of {args.rounds} "
          f"round-robin rounds; floor (q*2, k*2) = {rows[0]['floor_ms']:.3f} ms")
    print(f"{'encoding':<24}{'fwd ms':>9}{'fwd/RoPE':>10}{'fwd/floor':>10}{'fwd+bwd ms':>12}{'f+b/RoPE':>10}")
    for r in rows:
        print(f"{r['encoding']:<24}{r['fwd_ms']:>9.3f}{r['fwd_vs_rope']:>10.2f}{r['fwd_vs_floor']:>10.2f}"
              f"{r['fwdbwd_ms']:>12.3f}{r['fwdbwd_vs_rope']:>10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
