"""Task accuracy by distance: bins past the longest distance trained on, and the effective length defined on them.

An example's distance is the number of tokens its answer must be carried across (`trainer.data.tasks.spec.TaskSpec`);
tasks.parquet records it with `trained_distance` (the longest distance a training example of the run can hold) and
`reach` (the longest its own evaluated length can hold).

- Bins (`distance_bins`), in multiples m of the trained distance D: [0, D], then (m_prev·D, m·D] for m in
  `BIN_EDGES` (1.5, 2, then doubling) up to the one that covers the longest reach. Every bin from the second on
  holds only distances no training example held.
- A bin is *kept* when the one-sided lower confidence bound of its exact-match accuracy (Wilson's, at
  `DistanceRule.level`) is at least `DistanceRule.threshold`: the prompts must show the accuracy above the rule, so
  binomial noise cannot lift a bin over it. A bin too small to be kept even if every prompt were right (empty, or
  2 prompts at the default rule) shows nothing either way and is skipped.
- Distance and position are separated by the evaluated window length (the prompt's length factor): a model can
  fail at long windows even where the answer is near (by position), or at long distances in any window (by
  distance), and pooling windows into a distance bin mixes the two in proportions set by where the prompts fell.
  - Position effective length (`position_effective_length`), in multiples of the train length: the longest length
    factor up to which, from the shortest on, no window's exact match on near prompts (distances ≤ D, which
    training covered) is shown below the shortest window's (one-sided Fisher exact test at
    `DistanceRule.position_alpha`, Bonferroni over the longer windows: a window with two near prompts, both right,
    fails nothing); 0 when the shortest window does not keep its near bin.
  - Distance effective length (`distance_effective_length`), in multiples of D, on the prompts of the windows within
    the position effective length only (where near answers hold, so what fails there fails by distance): the upper
    edge of the last bin of the run of kept bins that starts at the first bin (the last one capped at the longest
    reach of those windows); 0 when the position effective length is 0, nan without rows.
  - `distance_grid`: exact match on the window length × distance grid, the table both are read from.
- `stability`: the share of independent prompt sets that give the most common effective length, simulated for an
  accuracy curve over distance and window (docs/length-generalisation.md gives the prompts the rule needs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.stats import proportion_interval
from hdrope.errors import UserError
from trainer.evals.tasks_table import TASKS_FILE, read_tasks_table

__all__ = ["BIN_EDGES", "DEFAULT_DISTANCE_RULE", "RULE_VERSION", "DistanceRule", "accuracy_by_distance", "bin_label",
           "distance_bins", "distance_effective_length", "distance_grid", "position_effective_length",
           "simulated_readings", "stability", "task_rows"]

BIN_EDGES = (1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)  # upper edges, × the trained distance
# The definition the task effective lengths follow, recorded in every shipped study: 1 pooled every window into a
# distance bin; 2 reads position and distance apart (issue 47 case 37). A study shipped under another keeps its
# cells but not their task effective lengths (`analysis.shipped`).
RULE_VERSION = 2


@dataclass(frozen=True)
class DistanceRule:
    """A distance bin is kept when the one-sided `level` lower bound of its accuracy (Wilson) is ≥ threshold."""

    threshold: float = 0.5
    level: float = 0.95
    position_alpha: float = 0.05  # a window fails by position when its near answers are shown worse than the shortest's

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1 or not 0.5 < self.level < 1:
            raise ValueError(f"DistanceRule({self.threshold}, {self.level}): need a threshold in (0, 1) and a level "
                             "in (0.5, 1)")

    def kept(self, k: int, n: int) -> bool:
        """Whether k right of n prompts show an accuracy at or above the threshold."""
        return n > 0 and proportion_interval(k, n, 2 * self.level - 1).lo >= self.threshold

    def kept_many(self, k: np.ndarray, n: np.ndarray) -> np.ndarray:
        """`kept` of each (k, n) pair at once (False where n is 0)."""
        from statsmodels.stats.proportion import proportion_confint

        k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
        lo, _ = proportion_confint(k, np.maximum(n, 1), alpha=2 * (1 - self.level), method="wilson")
        return (n > 0) & (np.asarray(lo) >= self.threshold)

    def text(self) -> str:
        """The rule in words, for captions."""
        return (f"the one-sided {self.level:.0%} lower bound (Wilson) of the bin's exact match is at least "
                f"{self.threshold:g}")


DEFAULT_DISTANCE_RULE = DistanceRule()


def distance_bins(trained: int, reach: int) -> list[tuple[int, int, float]]:
    """(first, last, m) of each bin: distances first..last inclusive, m its upper edge in multiples of the trained
    distance; bins until one covers `reach`, the last one cut at it."""
    if trained <= 0:
        raise ValueError(f"trained distance {trained}: need a positive distance")
    out, first = [], 0
    for m in BIN_EDGES:
        last = math.floor(m * trained)
        if last >= reach:  # the last bin ends where the evaluation does
            return [*out, (first, reach, max(reach / trained, 1.0) if out else m)]
        out.append((first, last, m))
        first = last + 1
    raise ValueError(f"reach {reach} is more than {BIN_EDGES[-1]:g}× the trained distance {trained}")


def bin_label(first: int, last: int, m: float, trained: int) -> str:
    """A bin's column header: its range in multiples of the trained distance and in tokens, † when unseen."""
    lo = (first - 1) / trained  # the previous bin's upper edge
    return f"{'≤' if first == 0 else f'{lo:.3g}–'}{m:.3g}× ({first}–{last}){' †' if first > trained else ''}"


def _counts(distance: np.ndarray, correct: np.ndarray, bins: list[tuple[int, int, float]]) -> tuple[np.ndarray, ...]:
    """k and n per bin and each prompt's bin."""
    which = np.searchsorted([last for _, last, _ in bins], distance, side="left")
    n = np.bincount(which, minlength=len(bins))
    k = np.bincount(which, weights=correct.astype(float), minlength=len(bins)).round().astype(int)
    return k, n, which


def accuracy_by_distance(rows: pd.DataFrame) -> pd.DataFrame:
    """first, last, m, unseen, k, n, skill of each distance bin for rows of one task (columns distance, correct,
    trained_distance, reach, token_skill): k right of n prompts and the mean chance-corrected token accuracy."""
    trained, reach = int(rows["trained_distance"].max()), int(rows["reach"].max())
    bins = distance_bins(trained, reach)
    k, n, which = _counts(rows["distance"].to_numpy(), rows["correct"].to_numpy(), bins)
    skill = np.bincount(which, weights=rows["token_skill"].to_numpy(dtype=float), minlength=len(bins))
    return pd.DataFrame({"first": [b[0] for b in bins], "last": [b[1] for b in bins], "m": [b[2] for b in bins],
                         "unseen": [b[0] > trained for b in bins], "k": k, "n": n,
                         "skill": np.where(n > 0, skill / np.maximum(n, 1), math.nan)})


def _arrays(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """distance, correct, length factor and reach of each prompt, and the trained distance."""
    return (rows["distance"].to_numpy(), rows["correct"].to_numpy(dtype=bool),
            rows["length_factor"].to_numpy(dtype=float), rows["reach"].to_numpy(), int(rows["trained_distance"].max()))


def _position(distance: np.ndarray, correct: np.ndarray, factor: np.ndarray, trained: int,
              rule: DistanceRule) -> float:
    """The longest factor up to which, from the shortest, no window's near answers (distances ≤ trained) are shown
    worse than the shortest window's; 0 when the shortest does not keep its near bin."""
    from scipy.stats import fisher_exact

    factors = np.unique(factor)
    near = [(factor == f) & (distance <= trained) for f in factors]
    k0, n0 = int(correct[near[0]].sum()), int(near[0].sum())
    if not rule.kept(k0, n0):
        return 0.0
    alpha = rule.position_alpha / max(1, len(factors) - 1)  # Bonferroni over the longer windows
    reached = float(factors[0])
    for f, mine in zip(factors[1:], near[1:], strict=True):
        k, n = int(correct[mine].sum()), int(mine.sum())
        if n and fisher_exact([[k, n - k], [k0, n0 - k0]], alternative="less").pvalue <= alpha:
            break
        reached = float(f)
    return reached


def _readings(distance: np.ndarray, correct: np.ndarray, factor: np.ndarray, reach: np.ndarray, trained: int,
              rule: DistanceRule) -> tuple[float, float]:
    """(distance effective length, position effective length) of one cell's prompts."""
    position = _position(distance, correct, factor, trained, rule)
    if position == 0:
        return 0.0, 0.0
    inside = factor <= position
    return _effective(distance[inside], correct[inside], trained, int(reach[inside].max()), rule), position


def distance_effective_length(rows: pd.DataFrame, rule: DistanceRule = DEFAULT_DISTANCE_RULE) -> float:
    """In multiples of the trained distance, on the windows within the position effective length: the upper edge
    of the last kept bin of the run that starts at the first bin (capped at those windows' longest reach / trained
    distance); 0 when the first bin is not kept or no window keeps its near answers; nan without rows."""
    if rows.empty:
        return math.nan
    return _readings(*_arrays(rows), rule)[0]


def position_effective_length(rows: pd.DataFrame, rule: DistanceRule = DEFAULT_DISTANCE_RULE) -> float:
    """In multiples of the train length: the longest length factor up to which, from the shortest, no window's exact
    match at distances ≤ the trained distance is shown below the shortest window's; 0 when the shortest window does
    not keep that bin; nan without rows."""
    if rows.empty:
        return math.nan
    distance, correct, factor, _, trained = _arrays(rows)
    return _position(distance, correct, factor, trained, rule)


def _effective(distance: np.ndarray, correct: np.ndarray, trained: int, reach: int, rule: DistanceRule) -> float:
    bins = distance_bins(trained, reach)
    k, n, _ = _counts(distance, correct, bins)
    kept = rule.kept_many(k, n)
    reached = 0.0
    for (_, _, m), ok, size in zip(bins, kept, n, strict=True):
        if not rule.kept(int(size), int(size)):  # empty, or too few prompts to show the threshold even if all right
            continue
        if not ok:
            break
        reached = min(m, reach / trained)
    return reached


def task_rows(cells: pd.DataFrame) -> pd.DataFrame:
    """The tasks.parquet rows of every cell whose table records distances, with the cell's row index as `cell`."""
    cols = ["task", "length_factor", "distance", "trained_distance", "reach", "correct", "token_skill", "floor"]
    frames = []
    for idx, run_dir in cells["run_dir"].items() if "run_dir" in cells else []:
        path = Path(str(run_dir)) / TASKS_FILE
        if path.is_file():
            try:
                t = read_tasks_table(path)
            except UserError as err:
                cell = cells.at[idx, "cell_id"] if "cell_id" in cells else idx
                raise UserError(f"cell {cell}: {err}") from None
            if "distance" in t:
                frames.append(t[cols].assign(cell=idx))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*cols, "cell"])


def simulated_readings(accuracy: Callable[[np.ndarray, np.ndarray], np.ndarray], trained: int,
                       reaches: dict[float, int], samples: int, sets: int, rng: np.random.Generator,
                       rule: DistanceRule = DEFAULT_DISTANCE_RULE) -> np.ndarray:
    """(distance, position) effective lengths of `sets` simulated prompt sets (sets × 2): each set draws `samples`
    distances uniformly on 0..reach at each evaluated length factor (`reaches`: factor -> reach, as a one-insert
    task places its insert), each prompt right with probability accuracy(distance, factor)."""
    factors = np.repeat(np.array(list(reaches), dtype=float), samples)
    reach = np.repeat(np.array(list(reaches.values())), samples)
    out = []
    for _ in range(sets):
        d = np.concatenate([rng.integers(0, r + 1, size=samples) for r in reaches.values()])
        out.append(_readings(d, rng.random(len(d)) < accuracy(d, factors), factors, reach, trained, rule))
    return np.array(out)


def stability(accuracy: Callable[[np.ndarray], np.ndarray], trained: int, reaches: dict[float, int], samples: int,
              sets: int, rng: np.random.Generator, rule: DistanceRule = DEFAULT_DISTANCE_RULE) -> float:
    """The share of `sets` simulated prompt sets whose distance effective length is the most common one
    (`simulated_readings` for an accuracy curve over distance alone)."""
    answers = simulated_readings(lambda d, _: accuracy(d), trained, reaches, samples, sets, rng, rule)[:, 0]
    _, counts = np.unique(answers, return_counts=True)
    return float(counts.max() / sets)


def distance_grid(cells: pd.DataFrame, rows: pd.DataFrame, blocked: set[tuple[str, float]], level: float = 0.95
                  ) -> pd.DataFrame:
    """Exact match on the window length × distance grid. Rows: variant (and θ when it varies), in identity order,
    then each evaluated length factor ("RoPE · 4x"); columns: the distance bins of `rows` (one task, one trained
    distance); cells: k/n pooled over seeds and that window's prompts with Wilson's `level` interval, then the mean
    chance-corrected token accuracy, "—" where the window holds no such distance; "not learned" for a (variant,
    θ key) in `blocked`."""
    trained, reach = int(rows["trained_distance"].max()), int(rows["reach"].max())
    labels = [bin_label(first, last, m, trained) for first, last, m in distance_bins(trained, reach)]
    keys = cells["theta"].astype(float).fillna(-1.0)
    several = keys.nunique() > 1
    out: dict[str, dict[str, str]] = {}
    order = cells.assign(_t=keys).sort_values(["variant_rank", "_t"])
    for (variant, t), g in order.groupby(["variant", "_t"], sort=False):
        name = variant if not several else f"{variant}, {'no θ' if t < 0 else f'θ={t:g}'}"
        mine = rows[rows["cell"].isin(g.index)]
        for f, window in mine.groupby("length_factor", sort=True):
            label = f"{name} · {f:g}x"
            if (variant, t) in blocked:
                out[label] = dict.fromkeys(labels, "not learned")
                continue
            table = accuracy_by_distance(window.assign(trained_distance=trained, reach=reach))
            out[label] = {}
            for column, b in zip(labels, table.itertuples(), strict=True):
                if b.n == 0:
                    out[label][column] = "—"
                    continue
                iv = proportion_interval(b.k, b.n, level)
                out[label][column] = f"{b.k}/{b.n} = {iv.estimate:.0%} [{iv.lo:.0%}, {iv.hi:.0%}]; skill {b.skill:.2f}"
    return pd.DataFrame(out, index=labels).T


def distance_notes(rows: pd.DataFrame, rule: DistanceRule = DEFAULT_DISTANCE_RULE) -> list[str]:
    """The captions under a task's accuracy-by-distance table."""
    trained = int(rows["trained_distance"].max())
    floor = float(rows["floor"].max())
    return [f"_Rows: each variant at each evaluated window length (× the train length); a distance bin's accuracy "
            "depends on the window its prompts came from (a model can fail at long windows even where the answer "
            "is near), so windows are never pooled. Distance: tokens from the earliest insert the answer reads to "
            f"the question. Bins in multiples of the longest distance a training example holds ({trained} tokens); "
            "† marks the bins past it, which no training example reached. Cells: exact match k/n pooled over seeds "
            "and that window's prompts with Wilson's 95% "
            f"interval; skill: token accuracy chance-corrected, (token accuracy − floor) / (1 − floor), with this "
            f"task's floor {floor:.3g} (a guess that knows the answer's format), so 0 is chance, not skill. "
            "Descriptive: no tests here; the effective length below carries the comparisons._",
            f"_A bin is kept when {rule.text()}._"]


def effective_length_text(rule: DistanceRule = DEFAULT_DISTANCE_RULE) -> str:
    """The distance and position effective lengths in words, for the effective-length table's caption."""
    return ("Tasks (`efflen_<task>`): on distance, in multiples of the longest distance trained on, on the windows "
            "within the position effective length only: the upper edge of the last of the bins kept from the first "
            f"on (a bin is kept when {rule.text()}), capped at those windows' longest distance; 0 when the first bin "
            "is not kept (not learned: no value). Position (`poslen_<task>`, × the train length): the longest window "
            "up to which no window's exact match at trained distances is below the shortest window's (one-sided "
            f"Fisher exact test at {rule.position_alpha:g}, Bonferroni over the longer windows)")
