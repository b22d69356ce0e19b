"""What a planned sweep cannot measure, said before it runs: warnings `hdrope sweep plan` prints with the plan.

Three checks, each naming the cells and the fix (docs/sweeps.md, "Design warnings"):

- frequencies: a rotary encoding with fewer than MIN_FREQUENCIES distinct frequencies at the cell's head_dim (HD-RoPE
  at rotation_dim N has head_dim / N), read from the kind's declared frequency ladder;
- lengths: a length field of the kind (each kind declares its own: `EncodingKind.lengths`) at or beyond every
  evaluated length, so the behaviour it switches on past that length is never evaluated;
- windows: when the sweep compares variants, validation windows too few for the window noise of a paired difference
  to stay under MAX_WINDOW_SE (or a quarter of --detect), from the per-window spread measured in
  docs/length-generalisation.md.

Nothing here names an encoding kind: the registry (`trainer.model.position`) answers for each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from hdrope.errors import UserError
from trainer.config import RunConfig, validation_windows
from trainer.model.pe_layers import stack_groups
from trainer.model.pe_schedule import run_identity
from trainer.model.position import encoding_frequencies, encoding_lengths

__all__ = ["DETECT_FRACTION", "MAX_WINDOW_SE", "MIN_FREQUENCIES", "PAIRED_WINDOW_SD", "SMALLEST_BREAK_128",
           "design_warnings", "evaluated_lengths", "frequency_warnings", "length_warnings", "paired_window_sd",
           "starved_periods", "window_warning", "windows_needed"]

# Below 4 distinct frequencies the ladder's periods are more than θ^(1/4) apart (10x at θ 10⁴): HD-RoPE at 8D and
# head_dim 16 keeps 2 (periods 6.3 and 628 tokens), with nothing near a train length of 128 (issue 33 §6).
MIN_FREQUENCIES = 4
# The per-window SD of a paired difference of mean losses (two variants on the same windows), in nats: measured on the
# quickstart's model at 256 windows (docs/length-generalisation.md, "The measurement behind 128"): 0.041 at 1x and
# 0.075, 0.079 and 0.071 at 2x, 4x and 8x; the largest of those stands for every length past 1x.
PAIRED_WINDOW_SD = {1: 0.041, 2: 0.079}  # key: the factor from which the SD holds
# The most window noise (standard error of a paired difference, nats) a comparison may carry without --detect: just
# above what the documented 128 windows give past 1x (0.079 / √128 = 0.0070); 1x needs 30 windows for it.
MAX_WINDOW_SE = 0.0075
# With --detect D the window SE must be at most D / 4: then a window set two SEs off (1 in 20) moves the difference
# by at most half of D. The windows are the same for every seed, so their error is shared by all seeds and more seeds
# do not average it away.
DETECT_FRACTION = 0.25
# The smallest break (nats, a step at 2.5 L) the paired loss effective length finds in 80% of window sets at 128
# windows at 4x on the quickstart design, simulated on the real per-window noise of its RoPE and 4D identity models
# (`analysis.loss_power`, docs/length-generalisation.md, "How small a break it finds"; a test ties these to it).
SMALLEST_BREAK_128 = {"RoPE": 0.25, "4D identity": 0.35}


def evaluated_lengths(cfg: RunConfig) -> list[int]:
    """Every length in tokens a run of cfg evaluates at: the train length, the extrapolation windows, the passkey
    prompts and the task prompts, as configured."""
    seq, e = cfg.model.max_seq_len, cfg.eval
    factors: list[float] = [1.0]
    if e.extrapolation_batches > 0:
        factors += [float(f) for f in e.extrapolation]
    if e.passkey.enabled:
        factors += [float(f) for f in e.passkey.length_factors]
    if cfg.data.tasks and e.tasks.enabled:
        factors += [float(f) for f in e.tasks.length_factors]
    return sorted({round(seq * f) for f in factors})


def _cells_text(ids: list[str], total: int) -> str:
    if len(ids) == total and total > 1:
        return f"all {total} cells"
    shown = ", ".join(ids[:3])
    return f"cell{'s' if len(ids) > 1 else ''} {shown}" + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def starved_periods(cfg: RunConfig) -> np.ndarray | None:
    """The periods in tokens of the cell's distinct rotation frequencies when they are fewer than MIN_FREQUENCIES
    at its head_dim, else None (also for kinds without a frequency ladder)."""
    for group in stack_groups(cfg.model):  # a hybrid stack: each encoding at the layers it serves
        freqs = encoding_frequencies(group.pe, group.shape)
        if freqs is None:
            continue
        distinct = np.unique(np.round(freqs, 12))
        if len(distinct) < MIN_FREQUENCIES:
            return np.sort(2 * math.pi / distinct)
    return None


def frequency_warnings(cells: Sequence[PlannedCell], total: int) -> list[str]:
    """One warning per (head_dim, frequency count) of frequency-starved cells, naming their encodings, cells and
    periods, with the fix."""
    groups: dict[tuple[int, int], list[tuple[PlannedCell, np.ndarray]]] = {}
    for c in cells:
        periods = starved_periods(c.config)
        if periods is not None:
            groups.setdefault((c.config.model.encoding_shape.head_dim, len(periods)), []).append((c, periods))
    found = []
    for (d, n), members in groups.items():
        names = list(dict.fromkeys(run_identity(c.config)["pe_label"] for c, _ in members))
        labels = ", ".join(names)
        spans = {tuple(np.round(p, 6)) for _, p in members}
        if len(spans) == 1:
            periods = "periods " + " and ".join(f"{x:.3g}" for x in members[0][1]) + " tokens"
        else:
            longest = sorted(p[-1] for _, p in members)
            periods = f"longest period {longest[0]:.3g} to {longest[-1]:.3g} tokens over the cells' θ"
        found.append(f"{_cells_text([c.cell_id for c, _ in members], total)}: {labels} at head_dim {d} "
                     f"{'has' if len(names) == 1 else 'have'} {n} distinct frequenc{'y' if n == 1 else 'ies'} "
                     f"({periods}), fewer than {MIN_FREQUENCIES}: a frequency-starved encoding, whatever its basis; "
                     f"use a rotation_dim of at most {max(2, d // MIN_FREQUENCIES)} or a head_dim of at least "
                     f"{math.ceil(d * MIN_FREQUENCIES / n)} (model.dim / model.n_heads)")
    return found


def length_warnings(cfg: RunConfig) -> list[str]:
    """Each length field of the cell's encoding that is at or beyond every evaluated length (with the fix)."""
    longest = max(evaluated_lengths(cfg))
    found = []
    groups = stack_groups(cfg.model)
    for group in groups:
        where = "model.pe" if len(groups) == 1 else f"model.pe_layers (layers {', '.join(map(str, group.layers))}) pe"
        for f, value in encoding_lengths(group.pe, group.shape):
            if value < longest:
                continue
            label = run_identity(cfg)["pe_label"]
            found.append(f"{label}: {where}.{f.key}={value:g} is at or beyond every evaluated length (the longest "
                         f"is {longest} tokens, train length {cfg.model.max_seq_len}): {f.meaning}, so that is "
                         f"never evaluated; {f.fix}")
    return found


def paired_window_sd(factor: int) -> float:
    """The measured per-window SD of a paired difference of losses at `factor` x the train length (nats)."""
    return PAIRED_WINDOW_SD[max(k for k in PAIRED_WINDOW_SD if k <= max(factor, 1))]


def windows_needed(factor: int, max_se: float) -> int:
    """Validation windows at `factor` x the train length for the window SE of a paired difference to be max_se."""
    return math.ceil((paired_window_sd(factor) / max_se) ** 2)


def window_warning(cfg: RunConfig, detect: float | None = None) -> str | None:
    """Why the cell's validation windows are too few for a paired comparison (with the fix), or None."""
    if detect is not None and not (math.isfinite(detect) and detect > 0):
        raise UserError(f"--detect {detect!r}: the difference to detect must be a positive number, e.g. --detect 0.05")
    max_se = MAX_WINDOW_SE if detect is None else DETECT_FRACTION * detect
    e = cfg.eval
    factors = [1, *(e.extrapolation if e.extrapolation_batches > 0 else [])]
    short = [(f, validation_windows(e, f), windows_needed(f, max_se)) for f in factors]
    short = [(f, have, need) for f, have, need in short if have < need]
    if not short:
        return None
    scored = ", ".join(f"{f}x on {have} (needs {need})" for f, have, need in short)
    worst = max(paired_window_sd(f) / math.sqrt(have) for f, have, _ in short)
    bound = (f"a quarter of --detect {detect:g}, {max_se:.3g} nats" if detect is not None
             else f"{MAX_WINDOW_SE} nats, what the documented 128 windows keep it under")
    advice = 2 ** math.ceil(math.log2(max(need for _, _, need in short)))
    return (f"too few validation windows for a paired comparison: scored {scored}; the window noise of a paired "
            f"difference reaches {worst:.3g} nats (measured per-window spread / √windows), over {bound}, and the "
            f"windows are shared by every seed, so more seeds do not average it away; set eval.windows={advice} "
            f"(even at 128 the paired loss effective length finds only breaks of "
            f"{' to '.join(f'+{v:.2f}' for v in sorted(SMALLEST_BREAK_128.values()))} nats at 4x in 80% of window "
            "sets, "
            f"on the noise of the quickstart's {' and '.join(SMALLEST_BREAK_128)}; fewer windows, only larger ones)")


class PlannedCell(Protocol):
    """What the checks read of a planned cell (`sweeps.plan.Cell`)."""

    cell_id: str
    config: RunConfig


def _grouped(cells: Sequence[PlannedCell], total: int, check: Callable[[RunConfig], list[str]]) -> list[str]:
    """Each distinct warning `check` gives, once, naming the cells it holds for."""
    where: dict[str, list[str]] = {}
    for c in cells:
        for text in check(c.config):
            where.setdefault(text, []).append(c.cell_id)
    return [f"{_cells_text(ids, total)}: {text}" for text, ids in where.items()]


def design_warnings(cells: Sequence[PlannedCell], compares: bool, detect: float | None = None) -> list[str]:
    """Every design warning of a plan's cells (frequency-starved encodings, length fields past every evaluated
    length, and when the cells are compared, too few validation windows for a paired difference at `detect`), each
    naming its cells and the fix."""
    total = len(cells)
    found = frequency_warnings(cells, total)
    found += _grouped(cells, total, length_warnings)
    if compares:
        found += _grouped(cells, total, lambda cfg: [w for w in [window_warning(cfg, detect)] if w])
    return found
