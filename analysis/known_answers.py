"""The loss effective length checked on known answers (issue 33): the table in docs/length-generalisation.md.

Three byte 4-gram models (analysis.known_models) are scored by the lab's own evaluation (`evaluate_validation`,
`write_position_loss`) at each shipped study's train length, length factors and window counts (read from its spec),
on SETS disjoint slices of the validation split, with eval.sliding_stride = L/2 (the paired instrument's limited
pass). Each reading is the old, unpaired rule (`analysis.lengthgen.loss_effective_length`) beside the paired one
(`analysis.loss_length.loss_reading`). `python -m analysis.known_answers` prints the docs' generated block
(`<!-- known-answers:loss -->`), which tests/test_known_answers_loss.py ties to the readings.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from analysis.known_models import NGramCounts, NGramLM, count_ngrams
from analysis.lengthgen import LOSS_TOLERANCE, loss_effective_length
from analysis.loss_length import LossReading, false_alarm_rate, loss_reading, resolution_width
from trainer.config import DataConfig, EvalConfig, validation_windows
from trainer.evals.evaluate import evaluate_validation
from trainer.evals.position_loss import bin_starts, read_position_loss, write_position_loss

__all__ = ["DESIGNS", "SETS", "Design", "design", "design_windows", "designs_markdown", "docs_markdown",
           "known_answer_readings", "ngram_counts", "simulation_markdown", "table_markdown", "validation_tokens"]

SETS = 8
NGRAM = 4
TRAIN_SLICE = 500_000  # train-split tokens the n-gram model is counted on
# design name -> the shipped spec whose train length, factors and windows it uses
DESIGNS = {"quickstart / rivals": "sweeps/quickstart.yaml", "lengthgen": "experiments/tables/lengthgen_compact.yaml"}
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Design:
    """A shipped study's evaluation: its train length and eval settings (sliding stride set to L/2)."""

    name: str
    train_length: int
    eval: EvalConfig

    @property
    def max_factor(self) -> int:
        return max(self.eval.extrapolation)

    @property
    def resolution(self) -> float:
        """One tested bin of the loss instrument at the longest factor, in train lengths."""
        length = self.max_factor * self.train_length
        width = int(np.diff(np.append(bin_starts(length, self.eval.position_bins, self.eval.position_spacing),
                                      length)).min())
        return resolution_width(validation_windows(self.eval, self.max_factor), width) / self.train_length


def design(name: str) -> Design:
    """The design of DESIGNS[name], read from its spec the way a sweep builds its cells."""
    from sweeps.plan import cell_config
    from sweeps.spec import load_spec

    spec = load_spec(ROOT / DESIGNS[name])
    cfg = cell_config(spec, {}, "known-answers", Path(tempfile.gettempdir()))
    cfg.eval.sliding_stride = cfg.model.max_seq_len // 2
    if cfg.eval.windows:  # the window counts do not depend on the batch size: the same windows in fewer calls
        cfg.eval.batch_size = 128
    return Design(name, cfg.model.max_seq_len, cfg.eval)


def validation_tokens(cache_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) byte tokens of the built-in corpus the tiny and compact presets read."""
    from trainer.data.corpus import load_corpus
    from trainer.data.token_cache import cached_tokens
    from trainer.data.tokenizer import ByteTokenizer

    data = cached_tokens(load_corpus(DataConfig(cache_dir=cache_dir)), ByteTokenizer(), cache_dir)
    return np.asarray(data.train), np.asarray(data.val)


def ngram_counts(train: np.ndarray) -> NGramCounts:
    """The byte NGRAM-gram model counted on the first TRAIN_SLICE train tokens."""
    return count_ngrams(train[:TRAIN_SLICE], NGRAM, 259)


def _rows(model: NGramLM, tokens: np.ndarray, d: Design, path: Path) -> pd.DataFrame:
    v = evaluate_validation(model, tokens, d.train_length, d.eval, 1.0, contextlib.nullcontext)
    write_position_loss(v.by_position, d.eval.position_bins, d.eval.position_spacing, path, limited=v.limited,
                        train_length=d.train_length)
    return read_position_loss(path).to_pandas()


def _old(rows: pd.DataFrame, train_length: int) -> float:
    longest = rows[rows["length_factor"] == rows["length_factor"].max()]
    return loss_effective_length(longest["position"], longest["loss"], longest["tokens"], train_length,
                                 int(longest["length"].iloc[0]), LOSS_TOLERANCE)


def known_answer_readings(d: Design, counts: NGramCounts, val: np.ndarray, sets: int = SETS) -> pd.DataFrame:
    """One row per (model, window set): the known answer, the old rule's reading, the paired reading and its
    reason. Set s reads the s-th of `sets` disjoint slices of the validation tokens."""
    models = {"perfect generaliser": NGramLM(counts),
              f"fails past D = {2 * d.train_length}": NGramLM(counts, "forgets", 2 * d.train_length),
              "never learned": NGramLM(counts, "never_learned")}
    answers = {"perfect generaliser": f"censored at {d.max_factor}",
               f"fails past D = {2 * d.train_length}": f"2 ± {d.resolution:g} (one tested bin)",
               "never learned": "not learned"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for s, part in enumerate(np.array_split(val, sets)):
            for label, model in models.items():
                table = _rows(model, part, d, Path(tmp) / f"{s}.parquet")
                new: LossReading = loss_reading(table, LOSS_TOLERANCE)
                rows.append({"design": d.name, "model": label, "answer": answers[label], "set": s,
                             "old": _old(table, d.train_length), "new": new.value, "reason": new.reason})
    return pd.DataFrame(rows)


def _fmt(values: pd.Series) -> str:
    return ", ".join("nan" if math.isnan(v) else f"{v:g}" for v in values)


def table_markdown(readings: pd.DataFrame) -> str:
    """The docs' table: per design and model, the known answer and both rules' readings on every set."""
    lines = ["| design | model | known answer | old rule (8 sets) | paired rule (8 sets) |", "|---|---|---|---|---|"]
    for (dsg, model), g in readings.groupby(["design", "model"], sort=False):
        reasons = g["reason"].where(~g["reason"].str.startswith("crossed"), "crossed").unique()
        new = _fmt(g["new"]) + (f" ({', '.join(reasons)})" if g["new"].isna().any() else "")
        lines.append(f"| {dsg} | {model} | {g['answer'].iloc[0]} | {_fmt(g['old'])} | {new} |")
    return "\n".join(lines)


def design_windows(d: Design) -> tuple[int, int]:
    """(validation windows, narrowest bin width in positions) at the design's longest factor."""
    length = d.max_factor * d.train_length
    width = int(np.diff(np.append(bin_starts(length, d.eval.position_bins, d.eval.position_spacing), length)).min())
    return validation_windows(d.eval, d.max_factor), width


def designs_markdown() -> str:
    """The designs in words, as the docs introduce the table: each shipped spec's L, longest factor and windows."""
    parts = []
    for name, spec in DESIGNS.items():
        d = design(name)
        windows, _ = design_windows(d)
        parts.append(f"{name} (`{spec}`: L = {d.train_length}, {d.max_factor}x on {windows} windows)")
    return " and ".join(parts)


def simulation_markdown(sets: int = 2000) -> str:
    """The false-alarm rate of a model exactly at the tolerance in all 48 bins past L (`false_alarm_rate`), at the
    designs' window counts and bin widths, with bins correlated 0.5 or independent."""
    lines = ["| windows | bin width | correlation | reads short |", "|---|---|---|---|"]
    for windows, width in dict.fromkeys(design_windows(design(name)) for name in DESIGNS):
        for correlation in (0.5, 0.0):
            rate = false_alarm_rate(windows, 48, sets, LOSS_TOLERANCE, width=width, correlation=correlation)
            lines.append(f"| {windows} | {width} | {correlation:g} | {rate:.1%} of {sets} sets |")
    return "\n".join(lines)


def docs_markdown(readings: pd.DataFrame) -> str:
    """The body of the docs' generated block: the designs, the known-answer table and the simulation's."""
    return (f"The designs: {designs_markdown()}.\n\n{table_markdown(readings)}\n\nHow often a model exactly at the "
            f"tolerance in every bin past L reads short (the worst case that must read censored):\n\n"
            f"{simulation_markdown()}\n")


def main() -> None:
    """Print the docs' generated block (the known-answer table of every design and the simulation's)."""
    torch.set_num_threads(1)  # tiny tensors: more threads only contend on a shared CPU
    train, val = validation_tokens()
    counts = ngram_counts(train)
    readings = pd.concat([known_answer_readings(design(name), counts, val) for name in DESIGNS])
    print(docs_markdown(readings), end="")


if __name__ == "__main__":
    main()
