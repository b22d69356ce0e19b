"""`hdrope bench train`: training-step time of RoPE vs HD-RoPE, tokens/s vs HF Llama, and MFU, side by side.

Every variant is a full optimizer step (forward, cross-entropy, backward, AdamW) on the same
batch, timed round-robin in one process (shuffled order each round, median over rounds), so
ratios are measured under the same conditions.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F

from hdrope.bench import bench_device, median_round_robin
from hdrope.bench_args import non_negative_int, positive_int
from trainer.model.llama import Llama, ModelArgs, validate_model_args
from trainer.model.position import build_position_encoding, pe_config_class
from trainer.model.throughput import flops_per_token, peak_flops
from trainer.presets import load_model_args

__all__ = ["main", "run_train_bench", "step_seconds", "train_step_fn"]


def train_step_fn(model: torch.nn.Module, tokens: torch.Tensor, hf: bool = False, autocast: bool = False,
                  opt: torch.optim.Optimizer | None = None, pe: torch.nn.Module | None = None,
                  forward: Callable | None = None) -> Callable[[], None]:
    """One full optimizer step (forward, cross-entropy, backward, AdamW) of model on tokens, as a closure.

    `pe` swaps the model's position encoding in before each step (variants sharing one model's weights and
    optimizer); `forward` replaces model.__call__ (e.g. a torch.compile'd model). CUDA steps are waited for."""
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    run = forward if forward is not None else model
    device = tokens.device

    def step() -> None:
        if pe is not None:
            model.pe = pe
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = run(inputs)
        logits = out.logits if hf else out
        F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step


def _variant_args(base: ModelArgs, kind: str, n: int, basis: str, fused: bool | None) -> ModelArgs:
    return replace(base, pe=replace(base.pe, kind=kind, rotation_dim=n, basis=basis, fused=fused))


def run_train_bench(
    preset: str = "compact",
    batch: int = 8,
    dims: tuple[int, ...] = (4, 8, 32),
    rounds: int = 10,
    dtype: str = "fp32",
    with_hf: bool = True,
    device: str = "cpu",
    compile_model: bool = False,
    kinds: tuple[str, ...] = (),
) -> dict:
    """Measure step times on `device`; return {rows: [...], tokens_per_step, peak_flops}.

    The lab's variants share one model's weights and optimizer and differ only in the position encoding
    module swapped in before each step (so a 1.3B preset fits once in memory); HF Llama has its own. `kinds`
    adds each named kind at its default config (its own parameters are trained by backward, not stepped)."""
    base = load_model_args(preset)
    dev = torch.device(device)
    torch.manual_seed(0)
    tokens = torch.randint(0, base.vocab_size, (batch, base.max_seq_len + 1), device=dev)
    bf16 = dtype == "bf16"
    variants: dict[str, ModelArgs] = {"rope": _variant_args(base, "rope", 2, "identity", False)}
    for n in dims:
        variants[f"{n}D-paley"] = _variant_args(base, "hdrope", n, "paley", False)
        variants[f"{n}D-paley-fused"] = _variant_args(base, "hdrope", n, "paley", True)
    for kind in kinds:
        variants[kind] = replace(base, pe=pe_config_class(kind)(kind=kind))
    torch.manual_seed(0)
    model = Llama(variants["rope"]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    forward = torch.compile(model) if compile_model else None
    fns: dict[str, Callable[[], None]] = {}
    for name, args in variants.items():
        validate_model_args(args)
        pe = build_position_encoding(args.pe, args.encoding_shape).to(dev)
        fns[name] = train_step_fn(model, tokens, autocast=bf16, opt=opt, pe=pe, forward=forward)
    if with_hf:
        from transformers import LlamaForCausalLM

        from trainer.export.hf_compat import hf_config

        hf = LlamaForCausalLM(hf_config(variants["rope"], attn_implementation="sdpa")).to(dev)
        fns["hf-llama"] = train_step_fn(hf, tokens, hf=True, autocast=bf16,
                                        forward=torch.compile(hf) if compile_model else None)
    ms = median_round_robin(fns, rounds)
    tokens_per_step = batch * base.max_seq_len
    fpt = flops_per_token(base, base.max_seq_len)
    peak = peak_flops(dev, torch.bfloat16 if bf16 else torch.float32)
    rows = []
    for name, t in ms.items():
        tps = tokens_per_step / (t / 1e3)
        rows.append({"variant": name, "step_ms": t, "vs_rope": t / ms["rope"], "tokens_per_s": tps,
                     "mfu": tps * fpt / peak, "vs_hf_tokens_per_s": ms["hf-llama"] / t if with_hf else None})
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"rows": rows, "tokens_per_step": tokens_per_step, "peak_tflops": peak / 1e12,
            "threads": torch.get_num_threads(), "dtype": dtype, "preset": preset, "device": where,
            "compiled": compile_model}


def step_seconds(args: ModelArgs, batch: int, threads: int = 1, steps: int = 3) -> float:
    """Seconds per training step of a model of shape args at this batch size on `threads` CPU threads."""
    import time

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        torch.manual_seed(0)
        step = train_step_fn(Llama(args), torch.randint(0, args.vocab_size, (batch, args.max_seq_len + 1)))
        step()  # warm-up: allocator, kernels
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - t0) / steps
    finally:
        torch.set_num_threads(before)


def main(argv: list[str]) -> int:
    """CLI entry of `hdrope bench train`."""
    p = argparse.ArgumentParser(prog="hdrope bench train", description=__doc__)
    p.add_argument("--preset", default="compact")
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--dims", type=positive_int, nargs="+", default=[4, 8, 32])
    p.add_argument("--rounds", type=positive_int, default=10)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0: default)")
    p.add_argument("--no-hf", action="store_true", help="skip the HF LlamaForCausalLM comparison")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda or cuda:N")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="torch.compile every model (auto: on CUDA)")
    p.add_argument("--kinds", nargs="+", default=[], metavar="KIND",
                   help="also time these model.pe.kind values at their defaults (e.g. fire kerple t5_bias cope)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = str(bench_device(a.device))
    compiled = a.compile == "on" or (a.compile == "auto" and device.startswith("cuda"))
    res = run_train_bench(a.preset, a.batch, tuple(a.dims), a.rounds, a.dtype, not a.no_hf, device, compiled,
                          tuple(a.kinds))
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    peak_kind = "known GPU" if res["device"] != "cpu" else "measured matmul"
    print(f"# {res['preset']} batch={a.batch} seq={res['tokens_per_step'] // a.batch} {res['dtype']} "
          f"on {res['device']} threads={res['threads']} compiled={res['compiled']} "
          f"{peak_kind} peak {res['peak_tflops']:.3f} TFLOP/s")
    print(f"{'variant':>18} {'step_ms':>9} {'vs_rope':>8} {'tok/s':>9} {'mfu':>6} {'tok/s vs HF':>12}")
    for r in res["rows"]:
        vs_hf = f"{r['vs_hf_tokens_per_s']:.3f}x" if r["vs_hf_tokens_per_s"] is not None else "-"
        print(f"{r['variant']:>18} {r['step_ms']:9.2f} {r['vs_rope']:7.3f}x {r['tokens_per_s']:9.0f} "
              f"{r['mfu']:6.3f} {vs_hf:>12}")
    return 0
