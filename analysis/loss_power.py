"""The power of the paired loss effective length: the smallest break it finds, on real per-window noise (issue 38).

On each model's measured d (`analysis.window_noise`: quickstart RoPE and 4D identity, 8 disjoint sets of the
design's windows at its longest factor), the model's own signal is removed (each bin's mean over every window) and a
step of `step` nats is put in at STEP_AT × the train length: a model that costs nothing up to there and `step` past
it. `paired_effective_length` reads each window set. A reading is *found* when it lies within one tested bin of
STEP_AT, *early* when it lies before. Each step is read on the 8 real sets and on RESAMPLES sets drawn from them,
each of the design's window count drawn without replacement from all the measured windows (windows are independent
units; each keeps its own correlation between bins).
The smallest break is the smallest step of STEPS found in at least POWER of the resampled sets and of the real ones,
for each model.
`python -m analysis.loss_power` prints the docs' generated block (`<!-- known-answers:power -->`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.lengthgen import LOSS_TOLERANCE
from analysis.loss_length import paired_effective_length, resolution_width
from analysis.window_noise import NOISE_FILE, WindowNoise, read_window_noise

__all__ = ["POWER", "RESAMPLES", "STEPS", "STEP_AT", "StepPower", "power_markdown", "smallest_breaks", "step_power"]

STEP_AT = 2.5  # × the train length: where the simulated break starts
STEPS = tuple(round(0.05 * k, 2) for k in range(2, 21))  # 0.10 … 1.00 nats
POWER = 0.8
RESAMPLES = 1000
SEED = 0


@dataclass(frozen=True)
class StepPower:
    """One model and step: how the instrument read it on the real sets and on the resampled ones."""

    model: str
    step: float
    found_real: int
    early_real: int
    real_sets: int
    found: float  # share of resampled sets
    early: float
    censored: float  # share of resampled sets read censored (no break found)


def _resolution(noise: WindowNoise) -> float:
    """One tested bin, in train lengths."""
    width = int(np.diff(np.append(noise.positions, noise.length)).min())
    return resolution_width(noise.diff.shape[1], width) / noise.train_length


def _read(noise: WindowNoise, d: np.ndarray) -> float:
    """The reading of one window set's d (windows × bins)."""
    windows = d.shape[0]
    mean, se = d.mean(axis=0), d.std(axis=0, ddof=1) / math.sqrt(windows)
    return paired_effective_length(noise.positions, mean, se, windows, noise.train_length, noise.length,
                                   LOSS_TOLERANCE)


def step_power(noise: WindowNoise, step: float, resamples: int = RESAMPLES, seed: int = SEED) -> StepPower:
    """How often a break of `step` nats at STEP_AT × L is found (and read early) on this model's noise."""
    centred = noise.diff - noise.diff.mean(axis=(0, 1), keepdims=True)
    d = centred + step * (noise.positions >= STEP_AT * noise.train_length)
    tol = _resolution(noise) + 1e-9
    real = np.array([_read(noise, one) for one in d])
    rng = np.random.default_rng(seed)
    sets, windows = d.shape[:2]
    pooled = d.reshape(sets * windows, -1)  # windows are independent units
    drawn = np.array([_read(noise, pooled[rng.choice(len(pooled), windows, replace=False)])
                      for _ in range(resamples)])
    found = lambda r: np.abs(r - STEP_AT) <= tol  # noqa: E731
    early = lambda r: r < STEP_AT - tol  # noqa: E731
    return StepPower(noise.model, step, int(found(real).sum()), int(early(real).sum()), sets,
                     float(found(drawn).mean()), float(early(drawn).mean()),
                     float(np.mean(drawn == noise.length / noise.train_length)))


def smallest_breaks(noises: list[WindowNoise] | None = None, resamples: int = RESAMPLES) -> tuple[dict[str, float],
                                                                                                 list[StepPower]]:
    """Each model's smallest step of STEPS found in at least POWER of the resampled sets and of the real ones (nan
    when none is), and every step's reading."""
    noises = read_window_noise(NOISE_FILE) if noises is None else noises
    rows, smallest = [], {}
    for noise in noises:
        mine = [step_power(noise, s, resamples) for s in STEPS]
        rows += mine
        smallest[noise.model] = next((p.step for p in mine if p.found >= POWER
                                      and p.found_real >= math.ceil(POWER * p.real_sets)), math.nan)
    return smallest, rows


def power_markdown(breaks: tuple[dict[str, float], list[StepPower]] | None = None, resamples: int = RESAMPLES) -> str:
    """The docs' generated block: the design, the smallest break per model, and the readings around it (of
    `breaks`, a `smallest_breaks` result, when given)."""
    noises = read_window_noise(NOISE_FILE)
    smallest, rows = smallest_breaks(noises, resamples) if breaks is None else breaks
    n = noises[0]
    table = pd.DataFrame([p.__dict__ for p in rows])
    worst = max(smallest.values())
    shown = table[(table["step"] >= 0.1) & (table["step"] <= max(0.3, worst + 0.1) + 1e-9)]
    lines = [f"Measured noise: `{NOISE_FILE.relative_to(NOISE_FILE.parents[2])}` (quickstart design: L = "
             f"{n.train_length}, {n.length // n.train_length}x on {n.diff.shape[1]} windows, {n.diff.shape[0]} sets). "
             f"A step put in at {STEP_AT:g} L, over a tolerance of {LOSS_TOLERANCE:g} nats; found = read within one "
             f"tested bin ({_resolution(n):g} L) of {STEP_AT:g}, in {resamples} resampled sets and the "
             f"{n.diff.shape[0]} real ones.", "",
             "| model | step (nats) | found (resampled) | early (resampled) | found (real sets) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r.model} | +{r.step:.2f} | {r.found:.0%} | {r.early:.1%} | {r.found_real} of {r.real_sets} |"
              for r in shown.itertuples()]
    lines += ["", "Smallest break found in at least " + f"{POWER:.0%} of the resampled and of the real window sets: " +
              ", ".join(f"{m} +{v:.2f} nats" for m, v in smallest.items()) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Print the docs' generated block."""
    print(power_markdown(), end="")


if __name__ == "__main__":
    main()
