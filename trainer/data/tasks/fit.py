"""Whether a config's tasks fit its lengths: the train length when tasks train, the shortest evaluation length when
they are evaluated. A run checks with its own tokenizer and text; a sweep plan checks every cell in symbols first
(`task_fit_problems`), before anything runs: each symbol takes at least one token in any tokenizer (a tokenizer that
writes a symbol as nothing is refused, `trainer.data.tasks.build`), so an example that does not fit in symbols fits
nowhere, and in the byte tokenizer the count is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from hdrope.errors import UserError
from trainer.data.tasks.build import TaskBuilder, check_fit
from trainer.data.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from trainer.config import RunConfig

__all__ = ["check_task_fits", "task_fit_problems"]


def check_task_fits(cfg: RunConfig, builder: Callable[[str], TaskBuilder]) -> None:
    """UserError (see `check_fit`) when the smallest example of one of cfg's tasks does not fit where it is used;
    `builder(split)` gives the task builder of the split ("train" or "val")."""
    seq = cfg.model.max_seq_len
    if cfg.data.task_ratio > 0:
        train = builder("train")
        for task in cfg.data.tasks:
            check_fit(train, task, seq + 1, f"the train length (model.max_seq_len={seq}, plus the target token)")
    if cfg.data.tasks and cfg.eval.tasks.enabled:
        val, factors = builder("val"), cfg.eval.tasks.length_factors
        for task in cfg.data.tasks:
            check_fit(val, task, round(seq * min(factors)), f"the shortest evaluation length "
                      f"(eval.tasks.length_factors {min(factors):g} x {seq})")


def task_fit_problems(cfg: RunConfig) -> list[str]:
    """`check_task_fits` counted in symbols, with no corpus or tokenizer loaded: the problem, or nothing. For a
    config that `trainer.config.config_errors` accepts."""
    symbols = TaskBuilder(ByteTokenizer(), cfg.data.task_params, np.empty(0, dtype=np.int64))
    try:
        check_task_fits(cfg, lambda split: symbols)
    except UserError as err:
        return [str(err)]
    return []
