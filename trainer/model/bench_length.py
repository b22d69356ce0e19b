"""`hdrope bench length`: every kind's training step at growing sequence lengths, side by side with RoPE.

For each length, every kind (at its defaults, `model.attention=auto`) runs one full optimizer step (forward,
cross-entropy, backward, AdamW) of the same preset on the same batch: the step times round-robin in this process
(`hdrope.bench.median_round_robin`), and, on a CPU, the peak memory each step adds in a process of its own (every
allocation of 64 KiB or more mapped and unmapped directly, so the resident set follows what is live, and the high-water
mark reset before the step). On CUDA the memory is the allocator's peak over the step, with tokens/s and MFU.
Each kind's memory slope over length is the least-squares slope of log memory on log length: about 1 is linear,
about 2 quadratic.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from hdrope.bench import bench_device, median_round_robin
from hdrope.bench_args import non_negative_int, positive_int, writable_file
from hdrope.errors import UserError
from trainer.model.args import ModelArgs
from trainer.model.llama import Llama
from trainer.model.position import POSITION_ENCODINGS, pe_config_class
from trainer.model.throughput import flops_per_token, peak_flops
from trainer.presets import load_model_args
from trainer.run.bench import train_step_fn

__all__ = ["DEFAULT_LENGTHS", "main", "memory_slope", "run_length_bench"]

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192)
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _args(preset: str, kind: str, seq: int) -> ModelArgs:
    return replace(load_model_args(preset), max_seq_len=seq, pe=pe_config_class(kind)(kind=kind))


def _step(args: ModelArgs, batch: int, device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    model = Llama(args).to(device)
    tokens = torch.randint(0, args.vocab_size, (batch, args.max_seq_len + 1), device=device,
                           generator=torch.Generator(device).manual_seed(1))
    return train_step_fn(model, tokens)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def _cpu_memory(preset: str, kinds: list[str], seq: int, batch: int, threads: int) -> dict[str, float]:
    """Bytes each kind's training step adds at its peak, measured one kind after another in this process."""
    torch.set_num_threads(threads)
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 65536)  # large blocks straight from and back to the kernel: RSS follows live bytes
    out = {}
    for kind in kinds:
        step = _step(_args(preset, kind, seq), batch, torch.device("cpu"))
        step()  # the optimizer's state and every cache, allocated
        libc.malloc_trim(0)
        before = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark
        step()
        out[kind] = float(_status("VmHWM") - before)
        del step
        libc.malloc_trim(0)
    return out


def _cpu_memory_in_child(preset: str, kinds: list[str], seq: int, batch: int, threads: int) -> dict[str, float]:
    with mp.get_context("spawn").Pool(1) as pool:  # a process whose allocator this one's history does not touch
        return pool.apply(_cpu_memory, (preset, kinds, seq, batch, threads))


def _cuda_memory(step: Callable[[], None], device: torch.device) -> float:
    step()
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    return float(torch.cuda.max_memory_allocated(device) - before)


def memory_slope(lengths: list[int], memory: list[float]) -> float:
    """The least-squares slope of log memory on log length (1: linear, 2: quadratic); nan with fewer than two."""
    if len(lengths) < 2:
        return float("nan")
    return float(np.polyfit(np.log(lengths), np.log(memory), 1)[0])


def run_length_bench(preset: str = "compact", lengths: tuple[int, ...] = DEFAULT_LENGTHS,
                     kinds: tuple[str, ...] = (), rounds: int = 2, batch: int = 1, threads: int = 1,
                     device: str = "cpu", memory: bool = True, progress: Callable[[str], None] | None = None,
                     done: Callable[[dict], None] | None = None) -> dict:
    """Step time and peak memory of every kind (or `kinds`, RoPE always among them) at each length, with ratios to
    RoPE's at the same length and each kind's memory slope; the machine and versions alongside. `done`, when given,
    receives the results of the lengths measured so far after each length, so a stopped run keeps them."""
    names = _kind_names(kinds)
    dev = bench_device(device)
    torch.set_num_threads(threads)
    say = progress or (lambda line: None)
    rows = []
    for seq in lengths:
        t0 = time.perf_counter()
        steps = {kind: _step(_args(preset, kind, seq), batch, dev) for kind in names}  # warmed twice when timed
        say(f"length {seq}: timing {len(names)} kinds, {rounds} round(s)")
        ms = median_round_robin(steps, rounds)
        if not memory:
            mem = dict.fromkeys(names, float("nan"))
        elif dev.type == "cuda":
            mem = {kind: _cuda_memory(step, dev) for kind, step in steps.items()}
        else:
            del steps
            say(f"length {seq}: peak memory of each kind's step")
            mem = _cpu_memory_in_child(preset, names, seq, batch, threads)
        peak = peak_flops(dev, torch.float32)
        for kind in names:
            tps = batch * seq / (ms[kind] / 1e3)
            mfu = tps * flops_per_token(_args(preset, kind, seq), seq) / peak
            rows.append({"kind": kind, "length": seq, "step_s": ms[kind] / 1e3, "step_vs_rope": ms[kind] / ms["rope"],
                         "memory_mb": mem[kind] / 2**20, "memory_vs_rope": mem[kind] / mem["rope"],
                         "tokens_per_s": tps, "tokens_per_s_vs_rope": ms["rope"] / ms[kind], "mfu": mfu})
        rope_mfu = next(r["mfu"] for r in rows if r["kind"] == "rope" and r["length"] == seq)
        for r in rows[-len(names):]:
            r["mfu_vs_rope"] = r["mfu"] / rope_mfu
        say(f"length {seq}: done in {time.perf_counter() - t0:.0f} s")
        if done is not None:
            done(_results(preset, batch, threads, dev, rounds, lengths[:lengths.index(seq) + 1], names, rows))
    return _results(preset, batch, threads, dev, rounds, lengths, names, rows)


def _kind_names(kinds: tuple[str, ...] | list[str]) -> list[str]:
    """RoPE, then `kinds` (every kind when none), each once; UserError naming a kind that is not one."""
    names = list(dict.fromkeys(["rope", *(kinds or sorted(POSITION_ENCODINGS))]))
    unknown = [k for k in names if k not in POSITION_ENCODINGS]
    if unknown:
        raise UserError(f"--kinds: {unknown[0]!r} is not a kind; choose from {', '.join(sorted(POSITION_ENCODINGS))}")
    return names


def _results(preset: str, batch: int, threads: int, dev: torch.device, rounds: int, lengths: tuple[int, ...],
             names: list[str], rows: list[dict]) -> dict:
    slopes = {kind: memory_slope([r["length"] for r in rows if r["kind"] == kind],
                                 [r["memory_mb"] for r in rows if r["kind"] == kind]) for kind in names}
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name()
    return {"preset": preset, "batch": batch, "threads": threads, "device": where, "rounds": rounds,
            "torch": torch.__version__, "cuda": torch.version.cuda, "lengths": list(lengths), "rows": list(rows),
            "slopes": slopes}


def _cpu_name() -> str:
    from trainer.files.machine import cpu_model

    return f"{cpu_model()} (CPU {torch.backends.cpu.get_cpu_capability()})"


def _table(res: dict) -> str:
    head = (f"# {res['preset']} batch={res['batch']} threads={res['threads']} on {res['device']}, torch {res['torch']}"
            f"{', CUDA ' + res['cuda'] if res['cuda'] else ''}; median of {res['rounds']} round-robin round(s)")
    by = {(r["kind"], r["length"]): r for r in res["rows"]}
    kinds = list(dict.fromkeys(r["kind"] for r in res["rows"]))
    lines = [head]
    for title, value, ratio, unit in (("peak memory added by one training step", "memory_mb", "memory_vs_rope", "MB"),
                                      ("training step time", "step_s", "step_vs_rope", "s")):
        lines += ["", f"{title}, {unit} (× RoPE's at the same length)",
                  f"{'kind':<14}" + "".join(f"{n:>17}" for n in res["lengths"])
                  + (f"{'memory slope':>18}" if value == "memory_mb" else "")]
        for kind in kinds:
            cells = []
            for n in res["lengths"]:
                r = by[(kind, n)]
                number = r[value]
                cells.append("-".rjust(17) if math.isnan(number) else
                             f"{number:.0f} ({r[ratio]:.2f})".rjust(17) if unit == "MB" else
                             f"{number:.2f} ({r[ratio]:.2f})".rjust(17))
            slope = res["slopes"][kind]
            tail = ("" if value != "memory_mb" or math.isnan(slope) else
                    f"{slope:.2f} {'linear' if slope < 1.3 else 'quadratic'}".rjust(18))
            lines.append(f"{kind:<14}" + "".join(cells) + tail)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the length benchmark and print the table (and write JSON with --json)."""
    ap = argparse.ArgumentParser(prog="hdrope bench length", description=__doc__)
    ap.add_argument("--preset", default="compact")
    ap.add_argument("--lengths", type=positive_int, nargs="+", default=list(DEFAULT_LENGTHS))
    ap.add_argument("--kinds", nargs="+", default=[], metavar="KIND", help="these kinds (RoPE always); default: all")
    ap.add_argument("--rounds", type=positive_int, default=2)
    ap.add_argument("--batch", type=positive_int, default=1)
    ap.add_argument("--threads", type=non_negative_int, default=1, help="torch threads (default 1)")
    ap.add_argument("--device", default="cpu", help="cpu (default), auto (cuda when available), cuda or cuda:N")
    ap.add_argument("--no-memory", action="store_true", help="time only")
    ap.add_argument("--json", type=writable_file, default=None,
                    help="also write the results to this JSON file (rewritten after each length)")
    ap.add_argument("--update", default=None, metavar="FILE",
                    help="re-measure --kinds beside RoPE and replace their rows in FILE, an earlier run's JSON at the "
                         "same preset, batch, threads, device and lengths (after a change to those kinds alone)")
    ap.add_argument("--measured", default=None, metavar="NEW",
                    help="with --update: take the kinds' rows from NEW, a --kinds run's --json, instead of measuring")
    ap.add_argument("--memory-alone", action="store_true",
                    help="on a CPU: each kind's peak memory alone, in a process of its own per kind, at --lengths "
                         "(for lengths whose round-robin would not fit); --json is rewritten after each kind")
    a = ap.parse_args(argv)
    if a.update:
        return _update(a)
    if a.memory_alone:
        return _memory_alone(a)
    n_kinds = len(set(["rope", *(a.kinds or POSITION_ENCODINGS)]))
    steps = 2 + a.rounds + (0 if a.no_memory else 2)  # two warm-ups, the timed rounds; memory: a warm-up, one step
    print(f"hdrope bench length: {n_kinds} kinds at {len(a.lengths)} lengths ({', '.join(map(str, a.lengths))}), "
          f"{steps} training steps of each (progress on stderr; docs/long-context.md gives the defaults' measured "
          "time)", flush=True)
    res = run_length_bench(a.preset, tuple(a.lengths), tuple(a.kinds), a.rounds, a.batch, a.threads or 1, a.device,
                           not a.no_memory, lambda line: print(line, file=sys.stderr, flush=True),
                           (lambda so_far: _write(so_far, a.json)) if a.json else None)
    print(_table(res))
    return 0


def _memory_alone(a: argparse.Namespace) -> int:
    """`--memory-alone`: every kind's peak step memory at each length, one process per kind, no timing."""
    if bench_device(a.device).type != "cpu":
        raise UserError(f"--memory-alone: measures a CPU's resident set; --device {a.device} is not a CPU (drop it)")
    names = _kind_names(a.kinds)
    res = {"preset": a.preset, "batch": a.batch, "threads": a.threads or 1, "device": _cpu_name(),
           "torch": torch.__version__, "lengths": list(a.lengths), "memory_mb": {}}
    for seq in a.lengths:
        got = res["memory_mb"].setdefault(str(seq), {})
        for kind in names:
            t0 = time.perf_counter()
            got[kind] = _cpu_memory_in_child(a.preset, [kind], seq, a.batch, a.threads or 1)[kind] / 2**20
            print(f"length {seq}: {kind} {got[kind]:.0f} MB ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                  flush=True)
            if a.json:
                _write(res, a.json)
        print(f"length {seq}: " + ", ".join(f"{k} {v:.0f} MB ({v / got['rope']:.2f}x)" for k, v in got.items()))
    return 0


def _update(a: argparse.Namespace) -> int:
    """`--update FILE`: the kinds' rows of FILE replaced by this run's, and FILE's `remeasured` list extended."""
    old = _read_json(a.update, "--update", "write one with --json first")
    new = _read_json(a.measured, "--measured", "write it with --kinds … --json") if a.measured else None
    kinds = [k for k in (a.kinds or ([r["kind"] for r in new["rows"]] if new else [])) if k != "rope"]
    kinds = list(dict.fromkeys(kinds))
    if not kinds:
        raise UserError("--update: name the kinds to re-measure with --kinds (RoPE, the reference, stays the file's)")
    if new is not None:  # a run made apart (while the file's run went on): its settings stand for this run's
        a.preset, a.batch, a.threads, a.lengths = new["preset"], new["batch"], new["threads"], new["lengths"]
    asked = {"preset": a.preset, "batch": a.batch, "threads": a.threads or 1, "lengths": list(a.lengths)}
    for key, value in asked.items():
        if old.get(key) != value:
            raise UserError(f"--update {a.update}: its {key} is {old.get(key)!r}, this run's {value!r}; re-measure "
                            f"at the file's ({'--' + key} {old.get(key)!r})")
    stale = sorted(set(kinds) - {r["kind"] for r in old.get("rows", [])})
    if stale:
        raise UserError(f"--update {a.update}: it has no rows of {stale[0]!r}; run the whole bench to add a kind")
    missing = sorted(set(kinds) - {r["kind"] for r in new["rows"]}) if new else []
    if missing:
        raise UserError(f"--measured {a.measured}: it has no rows of {missing[0]!r}; measure it with --kinds")
    if new is None:
        print(f"hdrope bench length --update: {', '.join(kinds)} beside RoPE at {', '.join(map(str, a.lengths))}",
              flush=True)
        new = run_length_bench(a.preset, tuple(a.lengths), tuple(kinds), a.rounds, a.batch, a.threads or 1,
                               a.device, not a.no_memory, lambda line: print(line, file=sys.stderr, flush=True))
    if new["device"] != old.get("device"):
        raise UserError(f"--update {a.update}: measured on {old.get('device')!r}, this run on {new['device']!r}; "
                        "re-measure on the file's machine")
    rows = [r for r in old["rows"] if r["kind"] not in kinds] + [r for r in new["rows"] if r["kind"] in kinds]
    order = {k: i for i, k in enumerate(dict.fromkeys(r["kind"] for r in old["rows"]))}
    rows.sort(key=lambda r: (r["length"], order[r["kind"]]))
    again = {"kinds": kinds, "torch": new["torch"], "rounds": new["rounds"], "when": time.strftime("%Y-%m-%d"),
             "rope_step_s": [r["step_s"] for r in new["rows"] if r["kind"] == "rope"]}
    merged = {**old, "rows": rows, "slopes": {**old["slopes"], **{k: new["slopes"][k] for k in kinds}},
              "remeasured": [*old.get("remeasured", []), again]}
    _write(merged, a.update)
    print(_table(merged))
    return 0


def _read_json(path: str, flag: str, fix: str) -> dict:
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError) as err:  # missing, unreadable or damaged JSON
        raise UserError(f"{flag} {path}: not a readable bench JSON ({type(err).__name__}); {fix}") from None
    if not isinstance(res, dict):
        raise UserError(f"{flag} {path}: holds a {type(res).__name__}, not a bench result; {fix}")
    for key, kind, word in (("preset", str, "a string"), ("batch", int, "an integer"), ("threads", int, "an integer"),
                            ("device", str, "a string"), ("lengths", list, "a list"), ("rows", list, "a list"),
                            ("slopes", dict, "a mapping")):
        if not isinstance(res.get(key), kind):
            raise UserError(f"{flag} {path}: field {key!r} is {res.get(key)!r}, not {word}; {fix}")
    if not all(isinstance(r, dict) and isinstance(r.get("kind"), str) and isinstance(r.get("length"), int)
               for r in res["rows"]):
        raise UserError(f"{flag} {path}: a row without its kind and length; {fix}")
    return res


def _write(res: dict, path: str) -> None:
    """Write the results to `path` whole or not at all (a stopped run leaves the last length's file)."""
    tmp = f"{path}.partial"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, path)

